"""``python -m reportgen.verify``: see :mod:`reportgen.verify`."""

import sys

from reportgen.verify import main

sys.exit(main())
