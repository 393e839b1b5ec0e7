"""``python -m reportgen.sweep``: see :mod:`reportgen.sweep`."""

import sys

from reportgen.sweep import main

sys.exit(main())
