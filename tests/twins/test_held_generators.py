"""State parity sees every generator (issue 36 item 8): a ``torch.Generator`` a module or the task holds,
private names included, is compared like the global ones; one drawn inside a recomputed region is not
replayed by ``torch.utils.checkpoint``, so state parity FAILs naming it."""

import torch
from conftest import compose_config
from user_models.generators import build

from reportgen.checks.base.run import Run
from reportgen.checks.distributed.steps import _snapshot
from reportgen.checks.parity.step import step_and_state_parity
from reportgen.commands.run import prepare
from reportgen.results import Role, to_frame
from reportgen.twins.step import TrainingStep
from reportgen.twins.template import copy_module
from reportgen.twins.twin import Stepped, Twin

ROWS = ["RNG 0._gen after the step", "RNG 1._gen after the step", "RNG task._gen after the step"]


def generator_rows(draw: bool):
    """The step and state parity frame, and ``{item: (status, detail)}`` of its held generators' rows."""
    task = "task._target_=user_models.generators.NoisyLossTask"
    setup = prepare(compose_config("+model=own_generator", f"model.draw={draw}", task, user_conf=True))
    frame = to_frame(step_and_state_parity(Run(setup)))
    rows = frame[(frame.role == Role.RNG) & frame["item"].isin(ROWS)]
    return frame, {r.item: (r.status, r.detail) for r in rows.itertuples()}


def test_a_generator_drawn_in_a_recomputed_block_fails_state_parity_naming_it():
    frame, rows = generator_rows(draw=True)
    assert set(rows) == set(ROWS)
    for item in ROWS[:2]:
        assert rows[item][0] == "FAIL" and rows[item][1].endswith("differ, where none may"), rows[item]
    assert rows[ROWS[2]][0] == "PASS"  # the task's generator: every twin starts from its same state


def test_a_held_generator_never_drawn_in_the_region_passes():
    frame, rows = generator_rows(draw=False)
    assert {status for status, _ in rows.values()} == {"PASS"}, rows
    assert (frame[frame.role != Role.AA].status.isin(["PASS", "INFO"])).all()


def test_twins_copy_each_generator_with_its_state():
    model = build()
    torch.randn(2, generator=model[0]._gen)  # a state of its own, not the seed's
    twin = copy_module(model, torch.clone)  # as Template.twin copies the one build
    assert twin[0]._gen is not model[0]._gen
    assert torch.equal(twin[0]._gen.get_state(), model[0]._gen.get_state())


def test_the_distributed_snapshot_holds_each_ranks_module_generators():
    model = build()
    twin = Twin(model, TrainingStep(None), torch.optim.SGD(model.parameters()), last=Stepped(torch.zeros(())))
    snap = _snapshot(twin)
    assert set(snap.rng) == {"0._gen", "1._gen"}
