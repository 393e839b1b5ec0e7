"""``python -m reportgen.sign RUN_DIR``: render and sign a finished run interrupted before signing
(:mod:`reportgen.commands.sign`)."""

import sys

from reportgen.commands.sign import main

if __name__ == "__main__":
    sys.exit(main())
