"""``python -m reportgen.keys``: the entry point of :mod:`reportgen.trust.keys` (generate, fingerprint)."""

import sys

from reportgen.trust.keys import main

if __name__ == "__main__":
    sys.exit(main())
