"""``python -m reportgen.plan``: see :mod:`reportgen.plan.cli`."""

from reportgen.plan.cli import console_main

console_main()
