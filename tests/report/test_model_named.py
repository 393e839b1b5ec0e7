"""The model named (issue 28 item 4): page 1 and the PDF's metadata name the architecture class, the
config file (relative, with its SHA-256) and what the model's own switch did; rerun commands carry
paths relative to the folder the run started in."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import run_pipeline

from reportgen.report.metadata import model_files, rerun_command


def test_a_config_file_is_named_relative_with_its_digest(tmp_path):
    config = tmp_path / "cfgs" / "tiny.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"model_type": "qwen3"}))
    digest = hashlib.sha256(config.read_bytes()).hexdigest()
    assert model_files({"config": str(config), "pretrained": None}, tmp_path) == [
        {"key": "model.config", "path": "cfgs/tiny.json", "sha256": digest}
    ]
    assert model_files({"config": str(config.parent)}, tmp_path) == []  # a folder without config.json names nothing
    (config.parent / "config.json").write_text("{}")
    assert model_files({"pretrained": str(config.parent)}, tmp_path)[0]["sha256"] == hashlib.sha256(b"{}").hexdigest()


def test_rerun_overrides_that_name_a_local_path_are_relative(tmp_path):
    config = tmp_path / "cfgs" / "tiny.json"
    config.parent.mkdir()
    config.write_text("{}")
    argv = ["m", "+model=hf_causal_lm", f"model.config={config}", "seed=1", "task.text_file=/nonexistent/x.txt"]
    assert rerun_command(argv, {}, tmp_path) == (
        "python -m reportgen +model=hf_causal_lm model.config=cfgs/tiny.json seed=1 task.text_file=/nonexistent/x.txt"
    )


@pytest.mark.hf
@pytest.mark.slow
def test_page_one_and_the_pdf_metadata_name_the_architecture_and_the_config(tmp_path):
    pytest.importorskip("transformers")
    from weasyprint import HTML

    from reportgen.paths import templates_dir

    config = tmp_path / "qwen3.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "qwen3",
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
        )
    )
    out = tmp_path / "run"
    out.mkdir()
    code, _ = run_pipeline(
        out,
        "+model=hf_causal_lm",
        f"model.config={config}",
        "budget.examples=16",
        "parity.batch_size=4",
        "timing.measured_steps=2",
    )
    assert code == 0
    html = (out / "report.html").read_text()
    page_one = html[: html.index("<h2>Checks</h2>")]
    digest = hashlib.sha256(config.read_bytes()).hexdigest()
    assert "<b>Qwen3ForCausalLM</b>" in page_one and digest[:16] in page_one
    assert "2 × Qwen3DecoderLayer recompute in backward (observed)" in page_one
    metadata = HTML(string=html, base_url=str(templates_dir())).render().metadata
    assert "Qwen3ForCausalLM" in metadata.title and digest[:12] in metadata.title
    assert digest in metadata.description and "Qwen3ForCausalLM" in metadata.keywords
