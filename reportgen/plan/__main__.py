"""``python -m reportgen.plan``: see :mod:`reportgen.commands.plan`."""

from reportgen.commands.plan import console_main

if __name__ == "__main__":
    console_main()
