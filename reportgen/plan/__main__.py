"""``python -m reportgen.plan``: see :mod:`reportgen.plan.cli`."""

import sys

from reportgen.plan.cli import main

sys.exit(main())
