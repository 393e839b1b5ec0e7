"""``python -m reportgen.sweep``: see :mod:`reportgen.sweep.callback`."""

import sys

from reportgen.sweep.callback import main

if __name__ == "__main__":
    sys.exit(main())
