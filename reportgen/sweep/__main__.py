"""``python -m reportgen.sweep``: see :mod:`reportgen.sweep.cli`."""

import sys

from reportgen.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
