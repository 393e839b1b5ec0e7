"""Target matching, wrapping and selective-policy op resolution."""

import pytest
import torch
from torch import nn
from user_models.faults import build_frozen, build_layers

from reportgen.checks.base.run import Run
from reportgen.config import RecomputeConfig, RecomputeMode
from reportgen.twins.recompute import RecomputeConfigError, apply_recompute, find_targets, plain_name, resolve_ops


def rc(mode="non_reentrant", **kw):
    """``cfg.recompute`` as reportgen passes it: the schema's dataclass (``Setup.config.recompute``)."""
    return RecomputeConfig(mode=RecomputeMode(mode), **kw)


def test_class_name_matches_every_instance_outermost_only():
    model = build_layers(depth=3)
    found = find_targets(model, ["Layer", "LayerNorm"])  # LayerNorms sit inside Layers: already covered
    assert [w.path for w in found] == ["0", "1", "2"]
    assert {w.cls for w in found} == {"Layer"}


def test_path_glob_matches_paths():
    found = find_targets(build_frozen(), ["adapters.*"])
    assert [w.path for w in found] == ["adapters.0", "adapters.1"]


def test_zero_matches_names_the_classes_present():
    with pytest.raises(RecomputeConfigError) as err:
        find_targets(build_frozen(), ["Block"])
    message = str(err.value)
    assert "matched no module" in message and "Adapter" in message and "FrozenEmbedNet" in message


def test_root_cannot_be_a_target():
    with pytest.raises(RecomputeConfigError, match="whole model"):
        find_targets(build_frozen(), ["FrozenEmbedNet"])


def test_apply_wraps_with_torch_wrapper_and_names_map_back():
    model = build_layers(depth=2)
    names_before = [n for n, _ in model.named_parameters()]
    wrapped = apply_recompute(model, rc(targets=["Layer"]))
    assert len(wrapped) == 2
    assert type(model[0]).__name__ == "CheckpointWrapper"
    assert [plain_name(n) for n, _ in model.named_parameters()] == names_before


def test_reentrant_mode_sets_use_reentrant():
    model = build_layers(depth=1)
    apply_recompute(model, rc(mode="reentrant", targets=["Layer"]))
    assert model[0].checkpoint_fn.keywords["use_reentrant"] is True
    model = build_layers(depth=1)
    apply_recompute(model, rc(targets=["Layer"], preserve_rng_state=False))
    kw = model[0].checkpoint_fn.keywords
    assert kw["use_reentrant"] is False and kw["preserve_rng_state"] is False


def test_op_packet_expands_to_overloads():
    ops = resolve_ops(["aten.mm"])
    assert torch.ops.aten.mm.default in ops and torch.ops.aten.mm.out in ops
    assert resolve_ops(["aten.addmm.default"]) == [torch.ops.aten.addmm.default]
    with pytest.raises(RecomputeConfigError, match="not an op"):
        resolve_ops(["aten.not_an_op"])


def test_selective_policy_saves_listed_ops_instead_of_recomputing():
    """With aten.mm saved (written as a packet), backward recomputes no matmul."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMM(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.mm = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.mm += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
            return func(*args, **(kwargs or {}))

    def backward_mm(save_ops, mode):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8)))
        if mode:
            apply_recompute(model, rc(mode=mode, targets=["0"], save_ops=save_ops))
        loss = model(torch.randn(4, 8)).square().mean()
        with CountMM() as counter:
            loss.backward()
        return counter.mm

    plain = backward_mm([], None)  # 3: two weight grads and one input grad
    full = backward_mm([], "non_reentrant")
    selective = backward_mm(["aten.addmm"], "selective")  # the packet, as a user writes it
    assert (plain, full, selective) == (3, 4, 3)  # full recompute redoes the first addmm; selective keeps it


def test_selective_without_ops_is_refused():
    with pytest.raises(RecomputeConfigError, match="save_ops"):
        apply_recompute(build_layers(1), rc(mode="selective", targets=["Layer"]))


def test_selective_policy_check_warns_when_a_save_op_never_runs(compose_cfg):
    """The sac_packet fault: `aten.mm` listed, but nn.Linear on 2-D input calls aten.addmm."""
    from reportgen.checks.policy import selective_policy
    from reportgen.commands.run import prepare

    cfg = compose_cfg(
        "+model=dropout_rng", "recompute=selective", "recompute.save_ops=[aten.mm,aten.addmm]", user_conf=True
    )
    rows = {r.item: r for r in selective_policy(Run(prepare(cfg)))}
    assert rows["aten.mm"].status == "WARN" and rows["aten.mm"].value == 0
    assert "aten.addmm.default" in rows["aten.mm"].detail
    assert rows["aten.addmm"].status == "PASS" and rows["aten.addmm"].value == 4  # 2 blocks × 2 Linear
    # the rows agree: the unmatched entry saves nothing itself, the addmm entry still saves its outputs
    assert "everything" not in rows["aten.mm"].detail and "aten.addmm ×4" in rows["aten.mm"].detail


def test_selective_policy_says_everything_recomputes_only_when_no_entry_matches(compose_cfg):
    from reportgen.checks.policy import selective_policy
    from reportgen.commands.run import prepare

    cfg = compose_cfg("+model=dropout_rng", "recompute=selective", "recompute.save_ops=[aten.mm]", user_conf=True)
    (row,) = selective_policy(Run(prepare(cfg)))
    assert row.status == "WARN" and "no entry matches, so everything" in row.detail


def test_selective_policy_check_is_silent_in_other_modes(compose_cfg):
    from reportgen.checks.policy import selective_policy
    from reportgen.commands.run import prepare

    assert selective_policy(Run(prepare(compose_cfg("+model=dropout_rng", user_conf=True)))) == []


def test_save_period_saves_every_second_call_as_torchtitans_op_policy():
    """save_period {aten.addmm: 2}: of three addmm in a region, the 1st and 3rd are saved, the 2nd recomputed."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMM(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.mm = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.mm += func is torch.ops.aten.addmm.default
            return func(*args, **(kwargs or {}))

    def backward_mm(**settings):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8)))
        apply_recompute(model, rc(mode="selective", targets=["0"], **settings))
        loss = model(torch.randn(4, 8)).square().mean()
        with CountMM() as counter:
            loss.backward()
        return counter.mm

    assert backward_mm(save_ops=["aten.addmm"]) == 0  # every output saved: no addmm runs again
    assert backward_mm(save_ops=["aten.addmm"], save_period={"aten.addmm": 2}) == 1  # the 2nd runs again


def test_save_period_of_an_op_not_saved_is_refused():
    with pytest.raises(RecomputeConfigError, match="save_period"):
        apply_recompute(
            build_layers(1),
            rc(mode="selective", targets=["Layer"], save_ops=["aten.mm"], save_period={"aten.addmm": 2}),
        )
