"""``python -m reportgen.verify``: see :mod:`reportgen.verify`."""
import sys

from . import main

sys.exit(main())
