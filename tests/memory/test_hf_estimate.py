"""Every WARN has a cause (issue 28 item 1): the GPU-free memory estimate of ``+model=hf_causal_lm``
no longer trips over the causality probe (fake tensors have no values) nor over the fake
``_grouped_mm`` kernel of mixture-of-experts layers (bfloat16 only: the estimate runs in it and says
so); where it cannot estimate, an INFO row says what and why, never a WARN or an exception text."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_pipeline
from torch._subclasses.fake_tensor import FakeTensorMode

from reportgen.errors import clip_words
from reportgen.memory.estimate import FAKE_KERNEL_DTYPE, fake_failure
from reportgen.results import Status

BASE = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "use_cache": False,
}
CONFIGS = {
    "qwen3": {"model_type": "qwen3", "tie_word_embeddings": True},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2, "router_jitter_noise": 0.0},
    "gemma2": {"model_type": "gemma2", "sliding_window": 16, "query_pre_attn_scalar": 8},
}


@pytest.mark.hf
@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_hf_causal_lm_estimates_without_a_warning(tmp_path, kind, monkeypatch):
    """The pipeline with the memory check alone, which is what the rows asserted come from (required alone:
    exit 0 says the memory check holds)."""
    pytest.importorskip("transformers")
    from reportgen.checks import REGISTRY
    from reportgen.commands import run as pipeline
    from reportgen.config import MEMORY

    monkeypatch.setattr(pipeline, "REGISTRY", [c for c in REGISTRY if c.name == MEMORY])
    config = tmp_path / f"{kind}.json"
    config.write_text(json.dumps({**BASE, **CONFIGS[kind]}))
    out = tmp_path / "run"
    out.mkdir()
    code, frame = run_pipeline(
        out, "+model=hf_causal_lm", f"model.config={config}", "parity.batch_size=4", f"verdict.required=[{MEMORY}]"
    )
    assert code == 0
    memory = frame[frame.check == "warm-step memory"]
    assert memory[memory.status == Status.WARN].empty, memory[memory.status == Status.WARN].detail.tolist()
    estimate = memory[memory["item"] == "estimate at measured shape"]
    assert len(estimate) == 2
    assert not memory.detail.str.contains("Exception|Error in call|OpOverload").any()
    if kind == "mixtral":  # the fake grouped_mm takes bfloat16 only: estimated in it, said, not compared
        assert set(estimate.status) == {Status.INFO}
        assert estimate.detail.str.contains(f"estimated in {FAKE_KERNEL_DTYPE}, not float32").all()
    else:  # the causality probe no longer runs on fake tensors: the estimate equals the measurement
        assert set(estimate.status) == {Status.PASS} and (estimate.value == estimate.measured_bytes).all()


def test_a_probe_that_reads_values_is_named_in_words_not_as_its_exception():
    with FakeTensorMode():
        a = torch.ones(3)
        try:
            torch.allclose(a, a)
        except Exception as exc:  # noqa: BLE001
            reason = fake_failure(exc)
    assert "reads tensor values" in reason and "Exception" not in reason


def test_console_lines_are_cut_between_words():
    text = "other work shared the CPUs while timing, so step times are inflated and noisier than on an idle machine"
    cut = clip_words(text, 80)
    assert cut.endswith(" …") and len(cut) <= 82 and text.startswith(cut[:-2])
    assert text.split()[len(cut[:-2].split()) - 1] == cut[:-2].split()[-1]  # the last word is whole
