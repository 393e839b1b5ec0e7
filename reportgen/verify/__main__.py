"""``python -m reportgen.verify``: see :mod:`reportgen.verify`."""

import sys

from reportgen.verify import main

if __name__ == "__main__":
    sys.exit(main())
