"""``python -m reportgen +model=x``: the entry point of :func:`reportgen.commands.cli.main` (the Hydra app).

Exit codes: 0 claim holds, 1 claim fails, 2 could not start, 3 cannot be judged, 70
reportgen's own bug, 130 Ctrl-C, 143 SIGTERM (see :mod:`reportgen.commands.cli`).
"""

from reportgen.commands.cli import main

if __name__ == "__main__":
    main()
