"""Selective recompute: does each op in ``recompute.save_ops`` actually run in the wrapped regions?

A save list that names an op the wrapped forward never calls (``aten.mm`` where ``nn.Linear``
on 2-D input calls ``aten.addmm``) makes the selective policy match nothing: every activation
is recomputed at full cost with no warning from torch. This check makes that visible.
"""

from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

from reportgen.checks.base import Check, Section
from reportgen.checks.base.run import Run
from reportgen.config import SELECTIVE_POLICY, RecomputeConfig, RecomputeMode
from reportgen.memory.instrument import instrument
from reportgen.results import Role, Row, Status
from reportgen.rng import seeded
from reportgen.structure import call_model, clone_inputs
from reportgen.twins.recompute import resolve_ops
from reportgen.twins.setup import Setup


class _OpCounter(TorchDispatchMode):
    """Counts aten overloads dispatched while ``active[0]`` > 0 (inside a wrapped module)."""

    def __init__(self, active: list[int]):
        super().__init__()
        self.active, self.seen = active, Counter[str]()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.active[0]:
            self.seen[func] += 1
        return func(*args, **(kwargs or {}))


def ops_in_wrapped_forward(setup: Setup) -> Counter:
    """``{OpOverload: calls}`` dispatched inside the target modules during one forward of the
    plain twin on the fixed batch (the recompute twin runs the same ops)."""
    model = setup.build(recompute=False)
    active = [0]
    handles = []
    for w in setup.wrapped:
        module = model.get_submodule(w.path)
        handles.append(module.register_forward_pre_hook(lambda *_: active.__setitem__(0, active[0] + 1)))
        handles.append(module.register_forward_hook(lambda *_: active.__setitem__(0, active[0] - 1)))
    try:
        with instrument("the op counter"), _OpCounter(active) as counter:
            with seeded(setup.config.forward_seed):
                call_model(model, clone_inputs(setup.batch[0]))
    finally:
        for handle in handles:
            handle.remove()
    return counter.seen


def selective_policy(run: Run) -> list[Row]:
    """One row per ``save_ops`` entry: calls it matched in the wrapped forward (selective mode
    only; no rows otherwise). Zero calls is WARN: the entry saves nothing."""
    setup = run.setup
    rc: RecomputeConfig = setup.config.recompute
    if rc.mode is not RecomputeMode.selective:
        return []
    seen = ops_in_wrapped_forward(setup)
    listing = ", ".join(f"{op} ×{n}" for op, n in seen.most_common(8))
    calls = {name: sum(seen[op] for op in resolve_ops([name])) for name in rc.save_ops}
    matched = [f"{name} ×{n}" for name, n in calls.items() if n > 0]
    rows = []
    for name, n in calls.items():
        detail = _policy_detail(name, n, matched, listing)  # threshold for people: "> 0"
        rows.append(
            Row.measured(
                SELECTIVE_POLICY,
                name,
                "matched_calls",
                float(n),
                "calls",
                comparator=">",
                threshold_value=0.0,
                on_miss=Status.WARN,
                role=Role.SAVE_OP,
                detail=detail,
            )
        )
    return rows


def _policy_detail(name: str, calls: int, matched: list[str], listing: str) -> str:
    """What one ``save_ops`` entry does, consistent with the other entries' rows: an entry that
    matches nothing saves nothing itself; the forward is recomputed in full only when no entry matches."""
    if calls > 0:
        return f"saved, not recomputed: {calls} call(s) of {name} per forward"
    rest = (
        f"the other entries still save their outputs ({', '.join(matched)})"
        if matched
        else "no entry matches, so everything in the wrapped modules is recomputed"
    )
    return (
        f"never called under this model: {name}, so this entry saves nothing; {rest}; ops that do run in the "
        f"wrapped modules: {listing}; remove it from recompute.save_ops"
    )


CHECK = Check(
    selective_policy,
    (
        Section(
            SELECTIVE_POLICY,
            "Selective recomputation saves the outputs of the ops in recompute.save_ops: each entry must "
            "match calls inside the wrapped modules, or it saves nothing.",
            template="sections/selective-policy.html.j2",
            required=False,
            roles=(Role.SAVE_OP,),
        ),
    ),
)
