"""Exit codes, the usage message and the exceptions every layer shares (the lowest layer).

=====  =====================================================================================
code   meaning (DESIGN.md "Exit code")
=====  =====================================================================================
0      the claim holds
1      the claim fails
2      the run could not start: config, usage, an output folder that holds a run or cannot be
       written, the task contract; the message names the fix
3      the claim cannot be judged (INCONCLUSIVE)
70     reportgen itself failed (a bug); the message gives the run's log file with the traceback
130    interrupted by SIGINT (Ctrl-C); the partial frame keeps NOT_RUN rows for what did not run
143    interrupted by SIGTERM (CI timeout, SLURM, ``docker stop``); same as 130
=====  =====================================================================================
"""
from __future__ import annotations

from .paths import builtin_models

EXIT_HOLDS, EXIT_FAILS, EXIT_USAGE, EXIT_INCONCLUSIVE, EXIT_BUG = 0, 1, 2, 3, 70
EXIT_SIGINT, EXIT_SIGTERM = 130, 143  #: 128 + the signal number, as shells report it
EXIT_CODES_HELP = ("exit codes: 0 claim holds, 1 claim fails, 2 could not start (config, usage, output folder, "
                   "task contract; the message names the fix), 3 cannot be judged, 70 reportgen's own bug (log "
                   "path printed), 130 Ctrl-C, 143 SIGTERM (partial results kept)")


class SetupError(ValueError):
    """The model, task or precision in the config cannot be built (a usage error, exit 2)."""


def usage() -> str:
    """The short message printed when no usable model was given."""
    models = builtin_models()
    return (f"reportgen: choose a model. Built-in models: {', '.join(models)}.\n"
            f"  python -m reportgen +model={models[0]}\n"
            "Your own model: python -m reportgen --config-dir DIR +model=NAME (see README, 'Your own model').\n"
            f"  ({EXIT_CODES_HELP})")
