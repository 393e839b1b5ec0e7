"""Real models (issue 9): structured inputs and outputs, the model's own switch, a baseline that
already recomputes, base-class targets, autocast and compile. Own fixtures in
tests/user_models/real.py."""

from __future__ import annotations

import pytest
import torch
from conftest import run_pipeline
from user_models import real

from reportgen.config import GRADIENT_PARITY
from reportgen.results import Role, Status
from reportgen.structure import batch_size_of, call_model, describe, named_tensors
from reportgen.twins.recompute import RecomputeConfigError, find_targets


def run_model(tmp_path, *overrides):
    """``(exit code, frame)`` of a full pipeline run on a tests/user_conf model, small budgets."""
    code, frame = run_pipeline(tmp_path, *overrides, user_conf=True)
    return code, frame


def test_structure_names_every_leaf_and_calls_with_keywords():
    batch, _ = real.make_batch(torch.Generator().manual_seed(0), 3)
    model = real.build_decoder()
    out = call_model(model, batch)
    names = [n for n, _ in named_tensors(out, "output")]
    assert names == ["output.logits", "output.hidden_states[0]", "output.hidden_states[1]"]
    assert batch_size_of(batch) == 3 and describe(batch) == "input_ids [3, 8] int64, attention_mask [3, 8] int64"
    assert [n for n, _ in named_tensors({"hidden": torch.ones(1)}, "output")] == ['output["hidden"]']


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_keyword_inputs_and_a_dataclass_output_pass(tmp_path, mode):
    code, frame = run_model(tmp_path, "+model=decoder", f"recompute={mode}")
    assert code == 0, frame[frame.status.isin([Status.FAIL, "ERROR", Status.INCONCLUSIVE])].detail.tolist()
    outputs = frame[frame.role == Role.OUTPUT].set_index("item").status
    assert outputs.to_dict() == {
        "output.logits": Status.PASS,
        "output.hidden_states[0]": Status.PASS,
        "output.hidden_states[1]": Status.PASS,
    }


def test_base_class_targets_match_subclasses_and_every_target_must_match():
    model = real.build_decoder(depth=3)
    assert [w.path for w in find_targets(model, ["DecoderLayerBase"])] == ["layers.0", "layers.1", "layers.2"]
    with pytest.raises(RecomputeConfigError, match="'Nope' matched no module"):
        find_targets(model, ["DecoderLayerBase", "Nope"])


def test_the_models_own_switch_is_observed_and_its_flags_are_shown_as_ignored(tmp_path):
    code, frame = run_model(tmp_path, "+model=decoder_switch")
    assert code == 0, frame[frame.status.isin([Status.FAIL, "ERROR", Status.INCONCLUSIVE])].detail.tolist()
    ignored = frame[frame.role == Role.IGNORED]
    assert set(ignored["item"]) == {
        f"attribute layers.{i}.{a}" for i in (0, 1) for a in ("gradient_checkpointing", "use_reentrant")
    }
    flags = ignored[ignored["item"].str.endswith("gradient_checkpointing")]
    assert flags.detail.str.contains("plain=False, recompute=True").all()
    html = (tmp_path / "report.html").read_text()
    # the layers recompute their inner function (not __call__), so only their children run again; every child
    # that ran did, so the layer itself is listed (measure.observe_recompute(whole_modules=True))
    assert "user_models.real.enable" in html and "<code>layers.0</code> (DecoderLayer)" in html
    assert "<code>layers.0.ff</code>" not in html
    assert "use_reentrant=False" in html


def test_a_switch_flag_not_declared_ignorable_fails_state_parity(tmp_path):
    code, frame = run_model(tmp_path, "+model=decoder_switch", "state.ignore_attributes=[]")
    assert code == 1
    flags = frame[(frame.role == Role.ATTRIBUTE) & frame["item"].str.endswith("gradient_checkpointing")]
    assert set(flags.status) == {Status.FAIL}


def test_a_factory_that_already_recomputes_is_inconclusive(tmp_path):
    code, frame = run_model(tmp_path, "+model=already_recomputing")
    assert code == 3
    baseline = frame[frame.role == Role.BASELINE].iloc[0]
    assert baseline.status == Status.INCONCLUSIVE and baseline.value == 4  # norm and ff of each of the 2 layers
    assert baseline.modules == "layers.1.norm, layers.1.ff, layers.0.norm, layers.0.ff"  # backward order


def test_autocast_state_that_differs_in_recompute_is_caught(tmp_path):
    code, frame = run_model(tmp_path, "+model=flip_autocast")
    assert code == 1
    grads = frame[frame.check == "gradient parity"]
    raised = grads[grads.role == Role.EXCEPTION].iloc[0]
    assert raised.status == "ERROR" and "CheckpointError" in raised.detail and "metadata" in raised.detail
    why = frame[(frame.role == Role.DIAGNOSIS) & (frame.check == "gradient parity")].iloc[0]
    assert why.rule == "state changed before recompute"


def test_bf16_autocast_uses_its_tolerances_and_passes(tmp_path):
    code, frame = run_model(tmp_path, "+model=decoder", "precision.autocast=bf16")
    assert code == 0, frame[frame.status.isin([Status.FAIL, "ERROR", Status.INCONCLUSIVE])].detail.tolist()
    loss = frame[frame.role == Role.LOSS].iloc[0]
    assert loss.rtol == pytest.approx(1.6e-2) and loss.atol == pytest.approx(1e-5)
    assert "autocast dtype bf16" in (tmp_path / "report.html").read_text()


def test_compiled_twins_run_against_a_compiled_baseline(tmp_path, monkeypatch):
    """Only gradient parity runs (the one required check; what the assertions read): every other check
    builds and compiles twins of its own (about 20 compiles), and page 1's compile line is metadata."""
    from reportgen.checks import REGISTRY
    from reportgen.commands import run as pipeline

    monkeypatch.setattr(pipeline, "REGISTRY", [c for c in REGISTRY if c.name == GRADIENT_PARITY])
    code, frame = run_model(
        tmp_path,
        "+model=granularity",
        "compile.enabled=true",
        "compile.backend=aot_eager",
        f"verdict.required=[{GRADIENT_PARITY}]",
    )
    parity = frame[frame.check == "gradient parity"]
    assert code == 0 and set(parity.status) <= {Status.PASS, "INFO"}, parity.detail.tolist()
    assert "the baseline is the compiled plain twin" in (tmp_path / "report.html").read_text()


@pytest.mark.hf
@pytest.mark.slow
@pytest.mark.parametrize("model", ["hf_gpt2", "hf_llama"])
def test_hugging_face_models_through_their_own_switch_hold(tmp_path, model):
    code, frame = run_pipeline(tmp_path, f"+model={model}", "budget.examples=32", "budget.seeds=[0]")
    assert code == 0, frame[frame.status.isin([Status.FAIL, "ERROR", Status.INCONCLUSIVE])].detail.tolist()
    html = (tmp_path / "report.html").read_text()
    import transformers

    default = (
        int(transformers.__version__.split(".")[0]) < 5
    )  # the switch's own use_reentrant default: 4.x True, 5.x False
    assert f"the model&#39;s own default (use_reentrant={default})" in html and "reportgen.models.hf.enable" in html
    assert set(frame[frame.role == Role.IGNORED].status) == {"INFO"}
    assert frame[frame.role == Role.BASELINE].value.item() == 0


def test_a_compile_that_cannot_run_makes_every_check_not_run_with_the_reason(tmp_path):
    code, frame = run_pipeline(tmp_path, "+model=ffn", "compile.enabled=true", "compile.backend=no_such_backend")
    assert code == 1 and set(frame.status) == {"NOT_RUN"}
    assert frame.detail.str.contains("torch.compile could not run the twins").all()
    assert (tmp_path / "report.html").exists()
