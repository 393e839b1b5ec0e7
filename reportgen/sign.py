"""``python -m reportgen.sign RUN_DIR``: render and sign a finished run interrupted before signing
(:mod:`reportgen.trust.finish`)."""

import sys

from reportgen.trust.finish import main

if __name__ == "__main__":
    sys.exit(main())
