"""What ``python -m reportgen.plan`` says on the console: a sequence beyond the config's positions is one
line (exit 2) unless allowed, a shape too large to trace is one whole line naming the fix, and the
table's columns stay apart whatever the width of a value."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reportgen.commands import plan
from reportgen.plan.args import MAX_TOKENS, parse_args
from reportgen.plan.rank import RankPlan
from reportgen.plan.trace import refusal

pytestmark = pytest.mark.hf

#: A two-layer Llama of 128 positions (numbers only).
TINY = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 64,
    "max_position_embeddings": 128,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "config.json").write_text(json.dumps(TINY))
    return folder


def test_seq_beyond_max_position_embeddings_is_one_line_exit_2(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert plan.main([str(tiny), "seq=129", "recompute=none", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_position_embeddings=128" in err[0] and "seq=128 or less" in err[0], err
    assert "allow_long_seq=true" in err[0] and not out.exists()


def test_allow_long_seq_plans_it_with_a_stated_warning(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert plan.main([str(tiny), "seq=129", "recompute=none", "allow_long_seq=true", f"out={out}"]) == 0
    err = capsys.readouterr().err
    assert "reportgen.plan: warning: seq=129 is beyond this config's max_position_embeddings=128" in err
    assert (out / "plan.csv").is_file()


def test_more_tokens_than_the_plan_traces_is_refused_before_anything_runs(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    code = plan.main([str(tiny), f"seq={MAX_TOKENS // 2 + 1}", "batch=2", "allow_long_seq=true", f"out={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "tokens per micro-batch" in err[0] and "smaller seq=" in err[0]
    assert not out.exists()


def test_a_refusal_names_the_cause_and_the_fix_and_is_never_cut_mid_word(tiny):
    args = parse_args([str(tiny), "seq=64", "batch=3"])
    memory = refusal(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes"), args)
    assert memory.startswith("seq=64 batch=3 is too large to plan") and "192 B" in memory  # one byte per token
    assert memory.endswith("give a smaller seq= or batch=") and "attn=eager" not in memory
    long = refusal(RuntimeError("word " * 100), args)
    reason = long[long.index("(") + 1 : long.rindex(")")]
    assert reason.endswith("word ...") and len(reason) <= 205 and "attn=eager" not in long


def _plan(name: str, peak: float, flops: float, recompute_flops: float) -> RankPlan:
    return RankPlan(
        policy=name,
        tensor_peak=peak,
        reserved_upper=peak * 1.1,
        peak_phase="optimizer step",
        flops=flops,
        recompute_flops=recompute_flops,
        largest_batch=123456789,
    )


def test_table_columns_never_run_together_and_the_flop_footnote_is_printed(tiny):
    """Values as wide as the old fixed columns (13 characters) used to touch their neighbours."""
    args = parse_args([str(tiny), "seq=64", "memory_gib=80", "largest_batch=true"])
    plans = [_plan("none", 123456.78 * 2**30, 1e15, 0.0), _plan("selective_op", 99999.99 * 2**30, 1.2e15, 2e14)]
    lines = plan.table(plans, args, chosen=None).splitlines()
    header, rows, note = lines[0], lines[1:3], lines[3]
    cells = [re.split(r" {2,}", line.strip()) for line in (header, *rows)]
    assert cells[0] == [
        "recompute",
        "tensor peak",
        "reserved <=",
        "peak phase",
        "extra FLOPs*",
        "largest batch",
        "fits",
    ]
    assert cells[1][:6] == ["none", "123456.78 GiB", "135802.46 GiB", "optimizer step", "+0.0%", "123456789"]
    assert cells[2][4] == "+20.0%" and all(len(c) == 7 for c in cells)
    assert note.startswith("* extra FLOPs") and "matmuls and attention only" in note


def test_the_header_comes_before_the_progress_lines(tiny, tmp_path, capsys, monkeypatch):
    """What is planned (config, shape, ranks, strategy) is the first line, before the config's warning and the
    per-policy progress lines (stderr, here read in one stream with stdout); a refused config prints no header."""
    import sys

    monkeypatch.setattr(sys, "stderr", sys.stdout)  # capsys's stdout: the lines in the order printed
    words = [str(tiny), "seq=129", "allow_long_seq=true", "world_size=2", "strategy=fsdp", "memory_gib=1"]
    assert plan.main([*words, f"out={tmp_path / 'out'}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"{tiny / 'config.json'}: seq=129 batch=1 dtype=bf16 attn=sdpa world_size=2 strategy=fsdp optim=fused, "
        "budget 1 GiB - 5% margin"
    )
    assert lines[1].startswith("reportgen.plan: warning: seq=129 is beyond")
    assert [line.split(":")[0] for line in lines[2:8]] == ["  none", "  full", "  every_2", "  every_4"] + [
        "  selective_op",
        "  selective_mm",
    ]
    assert re.fullmatch(r"planned in \d+\.\d s \(\d+ traced steps\)", lines[8]) and lines[9].startswith("recompute")
    assert plan.main([str(tiny), "seq=129", f"out={tmp_path / 'refused'}"]) == 2
    assert capsys.readouterr().out.splitlines() == [
        "reportgen.plan: seq=129 is beyond this config's max_position_embeddings=128; give seq=128 or less "
        "(or allow_long_seq=true to plan it anyway)"
    ]
