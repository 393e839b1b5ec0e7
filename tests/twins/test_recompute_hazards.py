"""Recompute hazards with a cause of their own (issue 16, items 3 and 5): each fixture in
tests/user_models/recompute_faults.py fails the claim (exit 1, with a report, never exit 2, never a
hang) and its diagnosis names its own cause and fix; "no known pattern" only when nothing matches,
and then it names the first differing tensor and the check that saw it.
"""

from __future__ import annotations

import time

import pandas as pd
import pytest
import torch
from conftest import SMALL, TESTS, compose_config, reportgen, run_dirs, run_pipeline
from rows import allclose_row, judged_row, raised_row
from torch import nn

from reportgen.checks.base.run import Run
from reportgen.checks.parity.gradient import gradient_parity
from reportgen.commands.run import prepare
from reportgen.report.diagnose import diagnose
from reportgen.results import Role, Row, Status, check_summary, to_frame
from reportgen.structure import changed_leaves, leaf_states
from reportgen.twins.recompute import RecomputeHazard, guard_returned_leaves

#: (model config, recompute mode, the rule that must win, words of its fix)
HAZARDS = [
    ("cached_decoder", "non_reentrant", "cache written again in recompute", "use_cache=False"),
    ("cached_decoder", "reentrant", "cache written again in recompute", "use_cache=False"),
    ("saved_twice", "non_reentrant", "saved tensors read twice", "read ctx.saved_tensors once"),
    ("shared_table", "reentrant", "graph tensor shared by regions", "pass the tensor to each region as an argument"),
    ("retain_grad", "non_reentrant", "retain_grad or hook in region", "retain_grad() on the region's output"),
    ("returns_parameter", "reentrant", "region returned a tensor it did not create", "return a new tensor"),
]
SETTINGS = {"mode": "non_reentrant", "preserve_rng_state": True}


def parity(*overrides):
    """``(gradient parity status, its rows as a frame)`` of a composed user config."""
    setup = prepare(compose_config(*overrides, user_conf=True))
    frame = to_frame(gradient_parity(Run(setup)))
    return dict(zip(*check_summary(frame, [])[["check", "status"]].values.T))["gradient parity"], frame


#: The hazard that :func:`test_the_cache_fixture_through_the_command_line_prints_the_fix` runs through the
#: command line, with every assertion of the in-process test below (one run of it, not two).
THROUGH_THE_COMMAND_LINE = ("cached_decoder", "reentrant")


def assert_names_its_cause(code: int, frame, seconds: float, rule: str, fix: str) -> None:
    """Exit 1 within the watchdog's 60 s, no check stopped by it, and every diagnosis row names ``rule`` and ``fix``."""
    assert seconds < 60  # ended on its own, not at the watchdog's deadline
    assert code == 1
    assert not frame.detail.str.contains("stopped at checks.").any()
    why = frame[frame.role == Role.DIAGNOSIS]
    assert "gradient parity" in set(why.check)
    assert set(why.rule) == {rule}, why[["check", "rule"]].to_string()
    assert why.fix.str.contains(fix, regex=False).all()


@pytest.mark.parametrize(
    "model, mode, rule, fix",
    [h for h in HAZARDS if h[:2] != THROUGH_THE_COMMAND_LINE],
    ids=[f"{m}-{r}" for m, r, *_ in HAZARDS if (m, r) != THROUGH_THE_COMMAND_LINE],
)
def test_each_hazard_fails_with_a_report_and_every_failing_check_names_its_cause(tmp_path, model, mode, rule, fix):
    start = time.perf_counter()
    code, frame = run_pipeline(tmp_path, f"+model={model}", f"recompute={mode}", "checks.timeout_s=60", user_conf=True)
    assert_names_its_cause(code, frame, time.perf_counter() - start, rule, fix)
    assert (tmp_path / "report.html").exists()


def test_a_cache_appended_again_in_the_reentrant_recompute_is_seen_in_the_output_and_the_gradients():
    status, frame = parity("+model=cached_decoder", "recompute=reentrant")
    assert status == Status.FAIL
    (changed,) = frame[frame.role == Role.CHANGED_IN_BACKWARD].itertuples()
    assert changed.value == 4.0 and changed.in_cache and changed.use_cache  # 2 layers x (keys, values)
    assert '["past_key_values"].key_cache[0] (shape [16, 6, 16] -> [16, 12, 16])' in changed.detail
    qkv = frame[frame["item"] == "layers.0.qkv.weight.grad"].iloc[0]
    assert qkv.status == Status.FAIL and qkv.value > 1e-2  # the keys seen twice change the gradient, not rounding
    assert (frame[frame.role == Role.LOSS].status == "PASS").all()  # the forward itself is the same


def test_a_cache_appended_again_in_the_non_reentrant_recompute_is_named_in_the_error_row():
    status, frame = parity("+model=cached_decoder", "recompute=non_reentrant")
    errors = frame[frame.status == Status.ERROR]
    assert status == Status.ERROR and len(errors) >= 1
    assert errors.detail.str.contains("different metadata").all()  # torch's message stays
    assert errors.detail.str.contains("a key/value cache the forward appends to").all()  # what reportgen saw
    assert errors.detail.str.contains("use_cache=True").all()


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_the_fix_named_for_the_cache_makes_the_same_model_pass(mode):
    status, frame = parity("+model=cached_decoder", f"recompute={mode}", "++model.use_cache=false")
    assert status == "PASS", frame[frame.status != "PASS"][["item", "detail"]].to_string()


@pytest.mark.parametrize(
    "model, mode",
    [("saved_twice", "reentrant"), ("shared_table", "non_reentrant"), ("returns_parameter", "non_reentrant")],
)
def test_the_other_mode_named_in_a_fix_passes(model, mode):
    status, frame = parity(f"+model={model}", f"recompute={mode}")
    assert status == "PASS", frame[frame.status != "PASS"][["item", "detail"]].to_string()


def test_retain_grad_in_a_non_reentrant_region_leaves_the_recompute_grad_none():
    status, frame = parity("+model=retain_grad", "recompute=non_reentrant")
    retained = frame[frame.role == Role.RETAINED_GRAD]
    assert status == Status.FAIL and set(retained["item"]) == {"1.pre.grad", "2.pre.grad"}
    assert (retained.status == Status.FAIL).all() and (retained.recompute_value == "None").all()
    assert (retained.plain_value == "tensor").all()
    params = frame[frame.role == Role.PARAM_GRAD]
    assert (params.status == "PASS").all()  # training itself is the same: only the retained .grad is lost


def test_a_reentrant_region_returning_its_parameter_stops_before_backward():
    start = time.perf_counter()
    status, frame = parity("+model=returns_parameter", "recompute=reentrant")
    assert time.perf_counter() - start < 30
    errors = frame[frame.status == Status.ERROR]
    assert (
        status == Status.ERROR
        and errors.detail.str.contains(
            "reentrant recompute region bias returned a tensor it did not create (its parameter bias.bias", regex=False
        ).all()
    )
    assert errors.detail.str.contains("backward was not run").all()


def test_the_guard_raises_in_the_forward_so_no_backward_can_recurse():
    from torch.utils.checkpoint import checkpoint

    class Returns(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.w = nn.Linear(3, 3), nn.Parameter(torch.ones(3))

        def forward(self, x):
            return checkpoint(lambda h: self.w, self.lin(x), use_reentrant=True)

    model = Returns()
    guard_returned_leaves(model)
    with pytest.raises(RecomputeHazard, match="parameter w has grad_fn"):
        model(torch.ones(2, 3))
    plain = nn.Linear(3, 3)
    guard_returned_leaves(plain)
    plain(torch.ones(2, 3)).sum().backward()  # an ordinary model is not stopped
    assert plain.weight.grad is not None


def test_changed_leaves_says_how_each_output_leaf_changed():
    cache = {"k": [torch.zeros(2, 3)], "v": [torch.zeros(2, 3)], "logits": torch.zeros(2)}
    before = leaf_states(cache, "output")
    cache["k"][0] = torch.cat([cache["k"][0], torch.ones(2, 3)])  # appended: a new tensor of another shape
    cache["v"][0].add_(1)  # written in place
    cache["v"].append(torch.ones(1))  # a new entry
    assert changed_leaves(before, cache, "output") == {
        'output["k"][0]': "shape [2, 3] -> [4, 3]",
        'output["v"][0]': "written in place",
        'output["v"][1]': "added",
    }
    assert changed_leaves(leaf_states(cache, "output"), cache, "output") == {}


def _error(detail: str, check: str = "gradient parity") -> Row:
    return raised_row(check, "recompute", f"the recompute run raised {detail}")


def test_saved_tensors_read_twice_wins_over_the_generic_checkpoint_error_rule():
    rows = [
        _error(
            "CheckpointError: torch.utils.checkpoint: Unpack is being triggered for a tensor that was already "
            "unpacked once. If you are calling ctx.saved_tensors in backward, make sure to do so only once."
        )
    ]
    (why,) = diagnose(rows, SETTINGS)
    assert why.extra["rule"] == "saved tensors read twice"
    (other,) = diagnose(
        [_error("CheckpointError: torch.utils.checkpoint: Recomputed values have different metadata")], SETTINGS
    )
    assert other.extra["rule"] == "state changed before recompute"  # no cache, no second read: the old rule


def test_a_hook_registered_in_a_reentrant_region_is_named():
    rows = [_error("RuntimeError: cannot register a hook on a tensor that doesn't require gradient")]
    (why,) = diagnose(rows, {"mode": "reentrant", "preserve_rng_state": True})
    assert why.extra["rule"] == "retain_grad or hook in region"


def test_a_hazard_seen_by_one_check_explains_the_symptom_of_another():
    changed = {"role": Role.CHANGED_IN_BACKWARD, "extra": {"in_cache": True}}
    rows = [
        judged_row(
            "gradient parity", "output leaves changed during backward", "changed_leaves", 4.0, "==", 0.0, **changed
        ),
        _error(
            "CheckpointError: torch.utils.checkpoint: Recomputed values have different metadata",
            check="trajectory parity",
        ),
    ]
    rules = {r.check: r.extra["rule"] for r in diagnose(rows, SETTINGS)}
    assert rules == {
        "gradient parity": "cache written again in recompute",
        "trajectory parity": "cache written again in recompute",
    }


def test_no_known_pattern_names_the_first_differing_tensor_and_the_check_that_saw_it():
    rows = [
        allclose_row("gradient parity", "loss", 0.0, -1.0, role=Role.LOSS),
        allclose_row("gradient parity", "blocks.1.lin.weight.grad", 0.5, 0.49, detail="exceeds tolerance by 0.49"),
        allclose_row("gradient parity", "blocks.2.lin.weight.grad", 0.7, 0.69, detail="exceeds tolerance by 0.69"),
    ]
    (why,) = diagnose(rows, SETTINGS)
    assert why.extra["rule"] == ""
    assert why.extra["cause"].startswith(
        "no known pattern matches these rows; the first differing tensor is "
        "blocks.1.lin.weight.grad (exceeds tolerance by 0.49)"
    )
    assert why.extra["fix"].startswith("start from blocks.1.lin.weight.grad, which gradient parity saw differ first")


@pytest.mark.slow
def test_the_cache_fixture_through_the_command_line_prints_the_fix(tmp_path):
    """The ``cached_decoder``-``reentrant`` case of the hazard test above, through the command line."""
    (_, _, rule, fix) = next(h for h in HAZARDS if h[:2] == THROUGH_THE_COMMAND_LINE)
    start = time.perf_counter()
    proc = reportgen(
        tmp_path,
        "--config-dir",
        str(TESTS / "user_conf"),
        "+model=cached_decoder",
        "recompute=reentrant",
        "checks.timeout_s=60",
        *SMALL,
        pythonpath=str(TESTS),
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("reportgen: fix (")]
    assert line.startswith("reportgen: fix (gradient parity") and "use_cache=False" in line
    (run,) = run_dirs(tmp_path)
    frame = pd.read_csv(run / "results.csv")
    assert_names_its_cause(proc.returncode, frame, seconds, rule, fix)
    assert (run / "report.html").exists()


@pytest.mark.hf
@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_hugging_face_llama_with_its_cache_on_under_a_generic_wrapper_names_use_cache(mode):
    """The filed case: LlamaDecoderLayer wrapped by a generic checkpoint wrapper (what FSDP's
    apply_activation_checkpointing does) with use_cache=True: the cache is appended again in the recompute."""
    setup = prepare(
        compose_config(
            "+model=hf_llama",
            "++model.use_cache=true",
            "recompute.method=wrap",
            "recompute.targets=[LlamaDecoderLayer]",
            f"recompute={mode}",
        )
    )
    rows = gradient_parity(Run(setup))
    (why,) = diagnose(rows, {"mode": mode, "preserve_rng_state": True})
    assert why.extra["rule"] == "cache written again in recompute" and "use_cache=False" in why.extra["fix"]
    said = " ".join(r.detail for r in rows if r.status in (Status.FAIL, Status.ERROR))
    # transformers 4.x returns the cache as output.past_key_values, 5.x as output.cache
    assert "output.past_key_values.layers[1].keys" in said or "output.cache.layers[1].keys" in said
    assert "a key/value cache the forward appends to" in said and "use_cache=True" in said


#: The returns_parameter config pointed at a region that returns a graph tensor kept on a shared object.
TABLE_VALUE = (
    "model._target_=user_models.recompute_faults.build_returns_table_value",
    "recompute.targets=[TableValue]",
)


def to_frame_rows(frame: pd.DataFrame) -> list[Row]:
    """Rows back from a frame, as the diagnosis reads them (check, item, role, status, detail)."""
    return [
        Row(
            check=r.check,
            item=r.item,
            variant=r.variant,
            metric=r.metric,
            status=r.status,
            detail=r.detail,
            role=r.role,
        )
        for r in frame.itertuples()
    ]


def test_a_reentrant_region_returning_a_graph_tensor_it_did_not_create_stops_before_backward():
    """Not a parameter: a tensor computed outside the region and kept on a shared object (torch 2.13,
    measured without the guard: its backward recursed until a 3 GiB address-space limit stopped it)."""
    start = time.perf_counter()
    status, frame = parity("+model=returns_parameter", "recompute=reentrant", *TABLE_VALUE)
    assert time.perf_counter() - start < 30
    errors = frame[frame.status == Status.ERROR]
    assert (
        status == Status.ERROR
        and errors.detail.str.contains(
            "reentrant recompute region value returned a tensor it did not create (a tensor [16] that requires grad",
            regex=False,
        ).all()
    )
    (why,) = diagnose(to_frame_rows(frame), {"mode": "reentrant", "preserve_rng_state": True})
    assert why.extra["rule"] == "region returned a tensor it did not create"
