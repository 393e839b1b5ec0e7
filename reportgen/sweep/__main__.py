"""``python -m reportgen.sweep``: see :mod:`reportgen.sweep`."""

import sys

from reportgen.sweep.cli import main

sys.exit(main())
