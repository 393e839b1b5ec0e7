"""Diagnoses from evidence (issue 36 item 9): faults found on third-party material get their own cause and
fix, a check no rule explains is told what its rows show, and a sharded run's diagnosis keeps to its strategy,
names the twin that raised and never offers a setting already in force. Rows are built directly."""

from __future__ import annotations

import pytest
import torch

from reportgen.config import DIST_GRADIENT_PARITY, DIST_TRAJECTORY, GRADIENT_PARITY, STATE_PARITY
from reportgen.distributed.ranks import ranked
from reportgen.distributed.sync import Drift, sync_row
from reportgen.distributed.wrapping import settings_in_force
from reportgen.report.diagnose import diagnose
from reportgen.results import Role, Row, to_frame
from reportgen.results.compared import tensor_row
from reportgen.results.raised import error_row

REENTRANT = {"mode": "reentrant", "preserve_rng_state": True}
GRAD = torch.ones(3)


def grad(item: str, recompute: torch.Tensor | None, role: str = Role.PARAM_GRAD, check: str = GRADIENT_PARITY) -> Row:
    """A gradient-parity tensor row: plain ``GRAD`` against ``recompute``."""
    return tensor_row(check, item, GRAD, recompute, 1e-5, 1e-6, role)


def raised(message: str, check: str = GRADIENT_PARITY, where: str = "recompute", twin: str | None = None) -> Row:
    """The ERROR row of ``RuntimeError(message)`` raised here (so the row says where: ``(at test_diagnose.py:N)``)."""
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        return error_row(check, exc, where, twin=twin)


def why(rows: list[Row], settings: dict, check: str = GRADIENT_PARITY) -> dict:
    """The diagnosis columns (``rule``, ``cause``, ``fix``) of ``check``."""
    return next(r.extra for r in diagnose(rows, settings) if r.check == check)


def test_an_in_place_change_of_a_reentrant_regions_output_is_named_with_torchs_words():
    said = why(
        [raised("Output 0 of CheckpointFunction is a view and is being modified inplace. This view ...")], REENTRANT
    )
    assert said["rule"] == "in-place change of a region's output"
    assert "x += ..." in said["cause"] and "depends on state" not in said["cause"]
    assert 'raised: "Output 0 of CheckpointFunction is a view and is being modified inplace"' in said["cause"]
    assert "out-of-place" in said["fix"] and "use_reentrant=False" in said["fix"]


def test_an_unexplained_failure_says_what_its_evidence_shows():
    """A precision flag off during recomputation: the loss agrees, one gradient differs, a global generator's
    state differs, and torch raised elsewhere in the check; each is said, none invented (no observed row)."""
    rows = [
        grad("loss", GRAD, Role.LOSS),
        grad("blocks.1.lin.weight.grad", GRAD * 1.01),
        raised("cuBLAS refused the call (see above)"),
        tensor_row(
            STATE_PARITY, "RNG torch.get_rng_state() after backward", GRAD.byte(), GRAD.byte() * 2, 0, 0, Role.RNG
        ),
    ]
    said = why(rows, {"mode": "non_reentrant", "preserve_rng_state": True})
    assert said["rule"] == "" and said["cause"].startswith(
        "no known pattern matches these rows; the first differing tensor is blocks.1.lin.weight.grad (exceeds "
    )
    cause = said["cause"]
    assert "in module blocks.1.lin" in cause and "the loss and outputs agree, so only what backward computes" in cause
    assert "the state of torch.get_rng_state() differs between the twins" in cause
    assert (
        'the recompute twin raised: "cuBLAS refused the call (see above)"' in cause and "test_diagnose.py" not in cause
    )
    assert "regions recomputed" not in cause  # no observed row: no count said
    observed = Row.measured(
        GRADIENT_PARITY, "regions recomputed", "recomputed_regions", 2.0, "regions",
        comparator=">=", threshold_value=1.0, role=Role.OBSERVED, detail="",
    )  # fmt: skip
    assert "regions recomputed by the recompute twin: 2" in why([*rows, observed], {"mode": "non_reentrant"})["cause"]
    forward = why([grad("output", GRAD * 2, Role.OUTPUT)], {"mode": "non_reentrant"})["cause"]
    assert "the forward already differs (output), before any backward" in forward


def test_noise_from_a_generator_the_module_owns_is_named_for_every_check_it_moves():
    rows = [
        grad("0.lin.weight.grad", GRAD * 2),
        tensor_row(STATE_PARITY, "RNG 0._gen after the step", GRAD.byte(), GRAD.byte() * 2, 0, 0, Role.RNG),
        tensor_row(STATE_PARITY, "RNG torch.get_rng_state() after backward", GRAD.byte(), GRAD.byte(), 0, 0, Role.RNG),
    ]
    for check in (GRADIENT_PARITY, STATE_PARITY):
        said = why(rows, {"mode": "non_reentrant", "preserve_rng_state": True}, check)
        assert said["rule"] == "generator the module owns" and "(0._gen)" in said["cause"]
        assert "restores only the global CPU/CUDA generators" in said["cause"]
        assert said["fix"].startswith("draw from the global generator, or keep the noise outside the recomputed region")


@pytest.mark.parametrize("lost", [None, torch.zeros(3)])
def test_a_router_gradient_lost_under_reentrant_recompute_is_a_side_channel_not_a_frozen_input(lost):
    rows = [grad("layers.0.moe.router.weight.grad", lost), grad("layers.0.moe.experts.0.w1.grad", GRAD)]
    said = why(rows, REENTRANT)
    assert said["rule"] == "router gradient lost under reentrant" and "layers.0.moe.router.weight.grad" in said["cause"]
    assert "recorded on the side by a hook" in said["cause"] and "use recompute=non_reentrant" in said["fix"]
    assert why(rows, {"mode": "non_reentrant"})["rule"] != "router gradient lost under reentrant"
    frozen = [*rows, grad("layers.0.mlp.gate_proj.weight.grad", None)]  # a whole region lost: the frozen input
    assert why(frozen, REENTRANT)["rule"] != "frozen input under reentrant"  # only where its cause was seen
    seen = REENTRANT | {"frozen_regions": ["layers.0"]}  # reportgen.twins.before_backward.frozen_regions
    assert why(frozen, seen)["rule"] == "frozen input under reentrant"


def ddp_settings(compose_cfg, *overrides: str, mode: str = "reentrant") -> dict:
    """The settings the diagnosis reads of a composed DDP run (metadata.recompute_settings's keys)."""
    dc = compose_cfg("+model=mlp", "distributed.world_size=2", *overrides).distributed
    strategy = dc.strategy.value if hasattr(dc.strategy, "value") else str(dc.strategy)
    return {"mode": mode, "strategy": strategy, "distributed": settings_in_force(dc, ["blocks.0"])}


def rank_raised(message: str, twin: str | None = "recompute") -> Row:
    return ranked(raised(message, DIST_GRADIENT_PARITY, "rank 0", twin), 0)


READY = "Expected to mark a variable ready only once. This error is caused by one of the following reasons"
UNFINISHED = "Expected to have finished reduction in the prior iteration before starting a new one"


def test_ddp_rules_fire_only_under_ddp_and_offer_no_setting_in_force(compose_cfg):
    default = ddp_settings(compose_cfg)
    said = why([rank_raised(READY)], default, DIST_GRADIENT_PARITY)
    assert said["rule"] == "DDP: parameter ready twice"
    assert "find_unused_parameters=false" not in said["fix"] and "static_graph=true" in said["fix"]
    assert "find_unused_parameters=True or a module" not in said["cause"]
    assert "two forwards run before one backward" in said["cause"]
    unused = ddp_settings(
        compose_cfg, "distributed.ddp.find_unused_parameters=true", "distributed.ddp.static_graph=true"
    )
    said = why([rank_raised(READY)], unused, DIST_GRADIENT_PARITY)
    assert "static_graph" not in said["fix"] and "find_unused_parameters=false" in said["fix"]
    assert "find_unused_parameters=True (in force)" in said["cause"]
    fsdp = why([rank_raised(READY)], {**default, "strategy": "fsdp2"}, DIST_GRADIENT_PARITY)
    assert fsdp["rule"] == "a rank failed"


def test_ddps_unfinished_reduction_names_the_twin_that_raised(compose_cfg):
    settings = ddp_settings(compose_cfg, mode="non_reentrant")
    plain = why([rank_raised(UNFINISHED, "plain")], settings, DIST_GRADIENT_PARITY)
    assert 'the plain twin on rank 0 raised: "Expected to have finished reduction' in plain["cause"]
    assert (
        plain["fix"]
        == "remove the parameter the forward never uses, or set distributed.ddp.find_unused_parameters=true"
    )
    recompute = why([rank_raised(UNFINISHED)], settings, DIST_GRADIENT_PARITY)
    assert "the recompute twin on rank 0 raised" in recompute["cause"] and "if the plain twin" not in recompute["fix"]
    assert recompute["fix"] == "make the region's input require grad (model.enable_input_require_grads())"


def test_fsdp_metadata_fix_keeps_to_the_strategys_own_settings():
    row = rank_raised("torch.utils.checkpoint: Recomputed values for the following tensors have different metadata")
    fsdp1 = {"mode": "non_reentrant", "strategy": "fsdp1", "distributed": {"fsdp.units": "Block"}}
    said = why([row], fsdp1, DIST_GRADIENT_PARITY)
    assert said["rule"] == "FSDP: recomputed metadata differs" and "reshard_after_forward" not in said["fix"]
    assert "distributed.fsdp1.sharding_strategy=SHARD_GRAD_OP" in said["fix"]
    fsdp2 = {**fsdp1, "strategy": "fsdp2", "distributed": {"fsdp.reshard_after_forward": False}}
    assert "reshard_after_forward" not in why([row], fsdp2, DIST_GRADIENT_PARITY)["fix"]


@pytest.mark.parametrize("twin", ["plain", "recompute"])
def test_ranks_drifting_under_fsdp2_name_parameters_outside_every_unit(twin):
    drifted = Drift(1, [(1, "head.weight", 2.5e-2)], 2.5e-2, 4)
    row = sync_row(DIST_TRAJECTORY, twin, [drifted], 2, None, None)
    said = why([row], {"mode": "non_reentrant", "strategy": "custom"}, DIST_TRAJECTORY)
    assert said["rule"] == "FSDP: parameters outside every unit" and f"the {twin} twin's ranks" in said["cause"]
    assert "DDP" not in said["cause"] and "wrap them in a unit" in said["fix"] and "fully_shard the root" in said["fix"]
    fsdp2 = why([row], {"mode": "non_reentrant", "strategy": "fsdp2"}, DIST_TRAJECTORY)["fix"]
    assert "fully_shard the root" not in fsdp2  # reportgen shards the root under fsdp2 already
    assert why([row], {"strategy": "ddp"}, DIST_TRAJECTORY)["rule"] == f"{twin} ranks drift"


def test_page_one_points_back_only_to_the_same_cause_and_fix():
    from reportgen.report.evidence import lead_evidence

    settings = {"mode": "reentrant", "strategy": "ddp"}
    plain = rank_raised(UNFINISHED, "plain")
    rows = [plain, ranked(raised(UNFINISHED, DIST_TRAJECTORY, "rank 0", "recompute"), 0)]
    frame = to_frame(rows + diagnose(rows, settings))
    lead = lead_evidence(frame, [DIST_GRADIENT_PARITY, DIST_TRAJECTORY])
    assert [e["same_as"] for e in lead] == [None, None]  # one rule, two twins: two fixes
