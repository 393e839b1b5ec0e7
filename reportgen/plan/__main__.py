"""``python -m reportgen.plan``: see :mod:`reportgen.plan.cli`."""
import sys

from .cli import main

sys.exit(main())
