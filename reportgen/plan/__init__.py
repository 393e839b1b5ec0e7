"""``python -m reportgen.plan``: will a Hugging Face causal LM's training step fit, per rank, offline.

Modules, lowest first: :mod:`.args` (command line, config), :mod:`.model` (the model at any depth,
batch, loss), :mod:`.policies` (recompute policies and the planned recompute file), :mod:`.trace`
(one step on fake tensors at small depth, scaled), :mod:`.rank` (per-rank timeline, reserved upper
bound), :mod:`.page` (plan.html, plan.pdf), :mod:`.cli` (the command).
"""

from reportgen.plan.args import PlanArgs, PlanError, parse_args

__all__ = ["PlanArgs", "PlanError", "console_main", "main", "parse_args"]


def __getattr__(name: str):
    """``main`` and ``console_main`` (the ``reportgen-plan`` entry point) load the tracer only when
    asked for (PEP 562): importing the package, as a run with a planned recompute file does, stays
    free of ``MemTracker``'s imports (~1.9 s CPU)."""
    if name in ("main", "console_main"):
        from reportgen.plan import cli

        return getattr(cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
