"""Distributed wrapping settings without starting ranks (issue 23): unknown keys refused even with
``+``, settings for another strategy refused, what each strategy passes to torch, which modules
become FSDP units, the twin that raised in an ERROR row, a rank the OS killed, and the diagnoses
read from torch's own messages."""

from __future__ import annotations

from rows import judged_row, raised_row
from torch import nn

from reportgen.commands.validation import config_problems
from reportgen.config import DIST_GRADIENT_PARITY, DIST_TRAJECTORY, GRADIENT_PARITY
from reportgen.distributed.launch import signal_name
from reportgen.distributed.ranks import failure_rows
from reportgen.distributed.settings import known_settings
from reportgen.distributed.wrapping import ddp_kwargs, settings_in_force, unit_modules, wrap_order
from reportgen.report.diagnose import diagnose
from reportgen.results import BASELINE, TWIN, Row, Status, claim_verdict, to_frame
from reportgen.results.raised import error_row, raised_in
from reportgen.twins.recompute import CheckpointWrapper

SHARDED = ("+model=mlp", "distributed.world_size=2", "parity.batch_size=4")


def test_an_unknown_distributed_key_is_refused_even_with_plus_naming_the_known_ones(compose_cfg):
    problems = config_problems(compose_cfg(*SHARDED, "+distributed.find_unused_parameters=true"))
    assert (
        "distributed.find_unused_parameters is not a setting (did you mean distributed.ddp.find_unused_parameters?)"
        in problems
    )
    assert "distributed.ddp.static_graph" in problems and "distributed.fsdp1.sharding_strategy" in problems
    assert "distributed.ddp.bucket_cap_mb" in known_settings() and "distributed.wrap" in known_settings()
    assert "distributed.ddp.typo is not a setting" in config_problems(compose_cfg(*SHARDED, "+distributed.ddp.typo=1"))
    assert config_problems(compose_cfg(*SHARDED, "distributed.ddp.find_unused_parameters=true")) == ""


def test_a_setting_the_strategy_would_not_pass_to_torch_is_refused(compose_cfg):
    one = config_problems(compose_cfg("+model=mlp", "distributed.ddp.static_graph=true"))
    assert "distributed.ddp.static_graph=True would be ignored with distributed.world_size=1" in one
    other = config_problems(compose_cfg(*SHARDED, "distributed.strategy=fsdp2", "distributed.ddp.static_graph=true"))
    assert "would be ignored with distributed.strategy=fsdp2" in other
    fsdp1 = config_problems(
        compose_cfg(*SHARDED, "distributed.strategy=fsdp1", "distributed.fsdp.reshard_after_forward=false")
    )
    assert (
        "distributed.fsdp.reshard_after_forward=false is FSDP2's; with distributed.strategy=fsdp1 say it with "
        "distributed.fsdp1.sharding_strategy=SHARD_GRAD_OP" in fsdp1
    )
    assert "needs distributed.wrap=pkg.module.fn" in config_problems(
        compose_cfg(*SHARDED, "distributed.strategy=custom")
    )
    bad = config_problems(
        compose_cfg(
            *SHARDED,
            "distributed.strategy=fsdp1",
            "distributed.fsdp1.use_orig_params=false",
            "distributed.fsdp1.sharding_strategy=HYBRID",
            "distributed.fsdp.param_dtype=int8",
        )
    )
    assert "use_orig_params=false is not supported" in bad and "'HYBRID' must be one of FULL_SHARD" in bad
    assert "param_dtype='int8' must be null or one of" in bad
    assert (
        config_problems(
            compose_cfg(
                *SHARDED,
                "distributed.strategy=fsdp2",
                "distributed.fsdp.units=[blocks.*]",
                "distributed.fsdp.reshard_after_forward=false",
                "distributed.fsdp.param_dtype=bfloat16",
            )
        )
        == ""
    )


def test_settings_in_force_are_what_torch_gets_and_page_one_says(compose_cfg):
    dc = compose_cfg(*SHARDED, "distributed.ddp.static_graph=true", "distributed.ddp.bucket_cap_mb=1").distributed
    assert ddp_kwargs(dc) == {
        "find_unused_parameters": False,
        "static_graph": True,
        "gradient_as_bucket_view": False,
        "broadcast_buffers": True,
        "bucket_cap_mb": 1.0,
    }
    said = settings_in_force(dc, ["blocks.0"])
    assert said["ddp.static_graph"] is True and said["ddp.bucket_cap_mb"] == 1.0 and len(said) == 5
    fsdp = compose_cfg(
        *SHARDED, "distributed.strategy=fsdp2", "distributed.fsdp.reshard_after_forward=false"
    ).distributed
    said = settings_in_force(fsdp, ["blocks.0", "blocks.1"])
    assert (
        said["fsdp.reshard_after_forward"] is False
        and said["fsdp.units"] == "blocks.0, blocks.1 (the recompute targets)"
    )
    assert not any(k.startswith("ddp.") for k in said)
    custom = compose_cfg(*SHARDED, "distributed.strategy=custom", "distributed.wrap=my_pkg.wrap").distributed
    assert settings_in_force(custom, []) == {"wrap": "my_pkg.wrap"} and "your my_pkg.wrap(model, mesh)" in wrap_order(
        custom
    )
    assert wrap_order(dc).startswith("build from the shared initial weights → recompute applied")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.Tanh()

    def forward(self, x):
        return self.act(self.lin(x))


def test_fsdp_units_by_class_or_glob_are_the_recompute_wrapper_when_it_sits_there():
    plain = nn.Sequential(Block(), Block())
    recompute = nn.Sequential(CheckpointWrapper(Block()), Block())
    assert [p for p, _ in unit_modules(plain, ["Block"])] == ["0", "1"]
    units = unit_modules(recompute, ["Block"])
    assert [p for p, _ in units] == ["0", "1"] and isinstance(units[0][1], CheckpointWrapper)  # same boundary
    inner = unit_modules(recompute, ["Linear"])  # units smaller than the recomputed block
    assert [p for p, _ in inner] == ["0._checkpoint_wrapped_module.lin", "1.lin"]
    assert [p for p, _ in unit_modules(recompute, ["*.lin"])] == ["0._checkpoint_wrapped_module.lin", "1.lin"]
    assert unit_modules(plain, ["Nothing"]) == []


def test_an_error_row_says_which_twin_raised_and_a_baseline_that_raised_cannot_be_judged():
    try:
        with raised_in("aa"):  # the A/A copy is a plain twin too
            raise RuntimeError("Expected to have finished reduction in the prior iteration before starting a new one")
    except RuntimeError as exc:
        row = error_row(DIST_TRAJECTORY, exc, "rank 1", twin=exc.reportgen_twin)
    assert (
        row.status == Status.ERROR and row.extra[TWIN] == BASELINE and "the aa twin on rank 1 run failed" in row.detail
    )
    passed = judged_row(GRADIENT_PARITY, "x", "max_abs_err", 0.0, "==", 0.0)
    frame = to_frame([row, passed])
    assert (
        claim_verdict(frame, [GRADIENT_PARITY, DIST_TRAJECTORY]) == Status.INCONCLUSIVE
    )  # exit 3, never "recompute fails"
    raised = error_row(DIST_TRAJECTORY, RuntimeError("boom"), "rank 0", twin="recompute")
    assert raised.extra[TWIN] == "recompute" and "the recompute twin on rank 0 run raised" in raised.detail
    assert claim_verdict(to_frame([raised, passed]), [GRADIENT_PARITY, DIST_TRAJECTORY]) == Status.FAIL


def test_a_rank_the_os_killed_is_named_with_its_signal_and_cannot_be_judged():
    assert signal_name(-9) == "SIGKILL" and signal_name(-15) == "SIGTERM" and signal_name(1) == ""
    rows = failure_rows(
        {1: "the rank's process was killed by SIGKILL"}, [DIST_GRADIENT_PARITY, DIST_TRAJECTORY], {1: "SIGKILL"}
    )
    assert (
        rows[0].status == Status.INCONCLUSIVE
        and rows[0].extra == {"signal": "SIGKILL", "rank": 1}
        and "rank 1" in rows[0].item
    )
    assert rows[1].status == "NOT_RUN" and "rank 1" in rows[1].detail
    assert failure_rows({0: "ValueError: boom"}, [DIST_GRADIENT_PARITY])[0].status == Status.ERROR


def _raised(message: str, twin_name: str = "recompute", rank: int = 0) -> Row:
    exc = RuntimeError(message)
    row = error_row(DIST_GRADIENT_PARITY, exc, f"rank {rank}", twin=twin_name)
    row.extra["rank"] = rank
    return row


SETTINGS = {"mode": "reentrant", "preserve_rng_state": True, "strategy": "ddp"}


def test_ddp_errors_are_diagnosed_from_torchs_own_words_and_quoted():
    ready = _raised(
        "Expected to mark a variable ready only once. This error is caused by one of the following reasons: "
        "1) Use of a module parameter outside the `forward` function."
    )
    (said,) = diagnose([ready], SETTINGS)
    assert said.extra["rule"] == "DDP: parameter ready twice" and "static_graph=true" in said.extra["fix"]
    assert 'the recompute twin on rank 0 raised: "Expected to mark a variable ready only once"' in said.extra["cause"]
    unfinished = _raised(
        "Expected to have finished reduction in the prior iteration before starting a new one", "plain"
    )
    (said,) = diagnose([unfinished], SETTINGS)
    assert said.extra["rule"] == "DDP: reduction not finished" and "the plain twin on rank 0" in said.extra["cause"]


def test_run_it_alone_is_advised_only_when_the_single_process_checks_did_not_pass():
    failed = raised_row(DIST_GRADIENT_PARITY, "rank 1", "rank 1 failed: ValueError: boom", rank=1)
    (alone,) = diagnose([failed], SETTINGS)
    assert "run it alone with distributed.world_size=1" in alone.extra["fix"]
    passed = judged_row(GRADIENT_PARITY, "w.grad", "max_abs_err", 0.0, "==", 0.0)
    assert passed.status == Status.PASS
    said = [r for r in diagnose([failed, passed], SETTINGS) if r.check == DIST_GRADIENT_PARITY][0]
    assert "run it alone" not in said.extra["fix"] and "single-process checks passed" in said.extra["fix"]


def test_rank_drift_rows_are_diagnosed_by_which_twin_drifted():
    from reportgen.distributed.sync import Drift, sync_row

    drifted = Drift(2, [(1, "head.weight", 2.5e-2)], 2.5e-2, 4)
    row = sync_row(DIST_TRAJECTORY, "recompute", [Drift(1, [], 0.0, 4), drifted], 2, None, None)
    assert (
        row.status == Status.FAIL
        and "after step 2: head.weight differs between rank 0 and rank 1 by 0.025" in row.detail
    )
    plain = sync_row(DIST_TRAJECTORY, "plain", [drifted], 2, 1e-5, 1e-6)
    assert plain.status == Status.INCONCLUSIVE and plain.extra["twin"] == "plain"
    assert sync_row(DIST_TRAJECTORY, "plain", [Drift(1, [], 0.0, 4)], 2, None, None).status == Status.PASS
    (said,) = diagnose([row], SETTINGS)
    assert said.extra["rule"] == "recompute ranks drift"
    (said,) = diagnose([plain], SETTINGS)
    assert said.extra["rule"] == "plain ranks drift"
