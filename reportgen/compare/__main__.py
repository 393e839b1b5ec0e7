"""``python -m reportgen.compare``: see :mod:`reportgen.compare.command`."""

import sys

from reportgen.compare.command import main

sys.exit(main())
