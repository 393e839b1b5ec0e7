"""``python -m reportgen.compare``: see :mod:`reportgen.commands.compare`."""

import sys

from reportgen.commands.compare import main

if __name__ == "__main__":
    sys.exit(main())
