"""``python -m reportgen.plan``: will a Hugging Face causal LM's training step fit, per rank, offline.

The command is :mod:`reportgen.commands.plan`; a main run of a plan's recompute file is judged by
:mod:`reportgen.commands.planned`; each module here says what it does.
"""

from reportgen.plan.args import PlanArgs, PlanError, parse_args

__all__ = ["PlanArgs", "PlanError", "parse_args"]
