"""A main run of a plan's recompute file (``--config-dir OUT ... recompute=planned``): the plan's step
peak at the run's own shape, beside the step peak the run measured (:func:`planned_peak`).

After the checks the run plans the file's policy (``recompute.planned.policy``) for its own model config, batch,
sequence, precision, attention and optimizer on one process (with nothing sharded the traced step is the rank's
step). The run's attention mask may be wider than the plan's (one byte per token): that difference is within
:data:`TOLERANCE` at a small shape.
"""

from __future__ import annotations

import time
from typing import Any

from reportgen.config import MEMORY
from reportgen.memory.step_peak import format_bytes
from reportgen.models.hf.auto import config_file
from reportgen.plan.args import DTYPES, PlanArgs, load_config
from reportgen.plan.policies import by_name, names
from reportgen.results import Role, Row, Status
from reportgen.twins.setup import Setup

#: The plan's figure must be within this share of the measured step peak.
TOLERANCE = 0.01
ITEM = "plan at this shape"


def planned_peak(setup: Setup, rows: list[Row]) -> tuple[Row, dict[str, Any]] | None:
    """The plan's row and page-1 figures for a run of a plan's recompute file (None for any other run).

    Args:
        setup: the run's setup (config, fixed batch, precision).
        rows: the run's rows so far (the recompute twin's ``peak_live_bytes`` is read from them).

    Returns:
        ``(row, {"policy", "seq", "batch", "planned_bytes", "measured_bytes", "difference"})``; when the
        figure cannot be made (no measured peak, a model the plan cannot build) an INFO row saying why and
        ``{}``.
    """
    policy = setup.config.recompute.planned.get("policy")
    if policy is None:
        return None
    start = time.perf_counter()
    measured = next((r for r in rows if r.metric == "peak_live_bytes" and r.variant == "recompute"), None)
    try:
        if policy not in names():
            raise ValueError(f"recompute.planned.policy={policy!r} is not one of {', '.join(names())}")
        if measured is None:
            raise ValueError("the memory check measured no step peak of the recompute twin")
        figure = _plan(setup, policy)
    except Exception as exc:  # noqa: BLE001 - the plan's figure is evidence beside the checks, never a crash
        detail = f"the plan's figure at this shape was not made ({type(exc).__name__}: {' '.join(str(exc).split())})"
        seconds = time.perf_counter() - start
        return Row.fact(MEMORY, ITEM, "", detail[:400], metric="planned_peak_bytes", seconds=seconds), {}
    measured_bytes = float(measured.value)
    figure["measured_bytes"] = measured_bytes
    figure["difference"] = (figure["planned_bytes"] - measured_bytes) / measured_bytes
    detail = (
        f"python -m reportgen.plan's step peak for policy {policy} at this run's shape (seq={figure['seq']}, "
        f"batch={figure['batch']}, one process): {format_bytes(figure['planned_bytes'])}; measured "
        f"{format_bytes(measured_bytes)} ({figure['difference']:+.2%})"
    )
    extra = {"planned_peak_bytes": figure["planned_bytes"], "measured_peak_bytes": measured_bytes, "policy": policy}
    row = Row.measured(
        MEMORY,
        ITEM,
        "planned_peak_difference_share",
        abs(figure["difference"]),
        "share",
        comparator="<=",
        threshold_value=TOLERANCE,
        threshold=f"<= {TOLERANCE:g} of the measured step peak",
        on_miss=Status.WARN,
        role=Role.NOTE,
        detail=detail,
        seconds=time.perf_counter() - start,
        extra=extra,
    )
    return row, figure


def _plan(setup: Setup, policy: str) -> dict[str, Any]:
    """The plan of ``policy`` at the run's shape: ``{"policy", "seq", "batch", "planned_bytes"}``."""
    model = setup.config.model
    if not model.get("config"):
        raise ValueError("the plan needs the model's config.json (model.config=)")
    inputs = setup.batch[0]
    ids = inputs["input_ids"] if isinstance(inputs, dict) else inputs
    batch, seq = (int(n) for n in ids.shape[:2])
    args = PlanArgs(
        config=config_file(model["config"]),
        seq=seq,
        batch=batch,
        dtype=setup.dtype,
        dtype_name=next(k for k, v in DTYPES.items() if v == setup.dtype),
        memory_gib=None,
        attn=model.get("attn_implementation") or "sdpa",
        master_dtype=setup.dtype,
        reduce_dtype=setup.dtype,
        optim_dtype=setup.dtype,
    )
    optimizer = dict(setup.config.budget.optimizer)
    from reportgen.plan.rank import compose  # lazy: the tracer imports MemTracker (~1.9 s CPU)
    from reportgen.plan.trace import scaled_figures

    figures, _ = scaled_figures(load_config(args.config), by_name(policy), args, batch, optimizer)
    plan = compose(figures, args, policy)
    return {"policy": policy, "seq": seq, "batch": batch, "planned_bytes": float(plan.tensor_peak)}
