"""``python -m reportgen.plan``: will a Hugging Face causal LM's training step fit, per rank, offline.

Modules, lowest first: :mod:`.args` (command line, config), :mod:`.model` (the model at any depth,
batch, loss), :mod:`.policies` (recompute policies and the planned recompute file), :mod:`.trace`
(one step on fake tensors at small depth, scaled), :mod:`.rank` (per-rank timeline, reserved upper
bound), :mod:`.page` (plan.html, plan.pdf). The command is :mod:`reportgen.commands.plan` (``main`` and the
``reportgen-plan`` console script ``console_main``, which load the tracer); a main run of a plan's
recompute file is judged by :mod:`reportgen.commands.planned`.
"""

from reportgen.plan.args import PlanArgs, PlanError, parse_args

__all__ = ["PlanArgs", "PlanError", "parse_args"]
