"""``python -m reportgen.plan``: small-depth traces scaled to the depth equal a full trace; the plan equals
a real CPU run's tracker peak for every policy; the 8B FSDP plan is never under torchtitan's measured
peak; bad input ends with one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from reportgen.commands import plan
from reportgen.memory.peak import warm_step_peak
from reportgen.memory.step_peak import format_bytes
from reportgen.plan.args import load_config, parse_args
from reportgen.plan.model import build_causal_lm, causal_lm_loss, decoder_layers, real_batch
from reportgen.plan.policies import POLICIES, by_name, switch_on
from reportgen.plan.rank import compose
from reportgen.plan.trace import OPTIMIZERS, scaled_figures, trace_step
from reportgen.twins.step import TrainingStep
from reportgen.twins.twin import TrainStep, Twin

pytestmark = pytest.mark.hf

ROOT = Path(__file__).resolve().parents[2]
#: Llama at a small shape: 5 layers, hidden 64, vocab 256 (numbers only).
LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 172,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
#: Sliding-window pattern: Qwen2 with alternating layer_types.
SLIDING = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "use_sliding_window": True,
    "sliding_window": 8,
    "max_window_layers": 0,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
}
#: Mixture of experts: Qwen3-MoE, dense MLP on layer 1 (mlp_only_layers), 4 experts, top 2.
MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "mlp_only_layers": [1],
    "decoder_sparse_step": 1,
    "head_dim": 16,
}
SEQ, BATCH = 32, 2


def _config(tmp_path: Path, body: dict, name: str = "cfg") -> Path:
    pytest.importorskip("transformers")
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(body))
    return folder


@pytest.mark.parametrize(
    "body, dtype, policy",
    [(LLAMA, "fp32", "every_2"), (SLIDING, "fp32", "full"), (MOE, "bf16", "none")],
    ids=["dense", "sliding", "moe"],
)
def test_one_layer_per_kind_scaled_equals_the_full_trace(tmp_path, body, dtype, policy):
    args = parse_args([str(_config(tmp_path, body)), f"seq={SEQ}", f"batch={BATCH}", f"dtype={dtype}"])
    config = load_config(args.config)
    scaled, traces = scaled_figures(config, by_name(policy), args, BATCH)
    full = trace_step(config, list(range(config.num_hidden_layers)), by_name(policy), args, BATCH)
    assert traces <= 2
    assert max(scaled.total.values()) == pytest.approx(max(full.total.values()), rel=0.005)
    assert scaled.after_forward == full.after_forward and scaled.flops == full.flops and scaled.params == full.params


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _config(tmp_path_factory.mktemp("llama"), LLAMA)


@pytest.fixture(scope="module")
def llama_figures(llama):
    """``figures(policy)``: the scaled figures of :data:`LLAMA` at seq :data:`SEQ`, batch :data:`BATCH`, fp32,
    traced once per policy in this module (the per-policy test, the composed bound and the chosen policy's
    budget read the same ones)."""
    args = parse_args([str(llama), f"seq={SEQ}", f"batch={BATCH}", "dtype=fp32"])
    config, traced = load_config(args.config), {}

    def figures(policy: str):
        if policy not in traced:
            traced[policy] = scaled_figures(config, by_name(policy), args, BATCH)[0]
        return traced[policy]

    return figures


@pytest.mark.parametrize("policy", [p.name for p in POLICIES])
def test_plan_equals_the_real_cpu_step_peak_for_every_policy(llama, llama_figures, policy):
    args = parse_args([str(llama), f"seq={SEQ}", f"batch={BATCH}", "dtype=fp32"])
    config = load_config(args.config)
    planned = compose(llama_figures(policy), args, policy)
    torch.manual_seed(0)
    model = build_causal_lm(config, torch.float32, "sdpa")
    switch_on(model, by_name(policy), by_name(policy).flags(list(range(5))), [p for p, _ in decoder_layers(model)])
    twin = Twin.of(model, TrainingStep(SimpleNamespace(loss=causal_lm_loss)), OPTIMIZERS["fused"])
    real = warm_step_peak(TrainStep(twin, real_batch(BATCH, SEQ)), warm_steps=1)
    assert planned.exact and planned.tensor_peak == pytest.approx(real.peak_bytes, rel=0.01)
    assert planned.reserved_upper >= planned.tensor_peak


def test_composed_plan_is_never_under_the_traced_step(llama, llama_figures):
    """Mixed precision with one process (composed, not traced as is) bounds the pure traced step from above."""
    pure = parse_args([str(llama), f"seq={SEQ}", f"batch={BATCH}", "dtype=fp32"])
    mixed = parse_args([str(llama), f"seq={SEQ}", f"batch={BATCH}", "dtype=fp32", "grad_accum=2"])
    figures = llama_figures("full")
    assert compose(figures, mixed, "full").tensor_peak >= compose(figures, pure, "full").tensor_peak


@pytest.mark.slow
def test_llama3_8b_fsdp_selective_op_is_not_under_torchtitans_measured_peak(tmp_path, capsys):
    """torchtitan docs/performance.md (2024-12), Table 1: 8 H100, FSDP, local batch 2, seq 8192,
    selective op AC, bf16 mixed precision, AdamW: 82.4 GiB peak reserved."""
    argv = [
        str(ROOT / "conf/plan/llama3_8b"),
        "seq=8192",
        "batch=2",
        "dtype=bf16",
        "world_size=8",
        "strategy=fsdp",
        "recompute=selective_op",
        "memory_gib=96",
        f"out={tmp_path / 'p'}",
    ]
    args = parse_args(argv)
    config, plans, _ = plan.plan_policies(args)
    upper = next(p for p in plans if p.policy == "selective_op").reserved_upper / 2**30
    assert 82.4 <= upper <= 82.4 * 1.15


@pytest.mark.parametrize(
    "body, says",
    [
        ({"model_type": "llama", "auto_map": {"AutoConfig": "x.Y"}}, "remote code"),
        ({"model_type": "llama", "num_hidden_layers": 100000}, "num_hidden_layers"),
        ({"model_type": "no-such-model", "hidden_size": 8}, "model_type"),
        ({"model_type": "llama", "hidden_size": -64}, "hidden_size is -64; it must be a positive integer"),
        ({"model_type": "llama", "intermediate_size": 10**9}, "intermediate_size is 1000000000, above the bound"),
        ("{not json", "JSON"),
    ],
)
def test_bad_config_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, body, says):
    pytest.importorskip("transformers")
    target = tmp_path / "config.json"
    target.write_text(body if isinstance(body, str) else json.dumps(body))
    out = tmp_path / "out"
    assert plan.main([str(target), "seq=16", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reportgen.plan: ") and says in err[0], err
    assert not out.exists()


def test_moe_in_fp32_is_one_line_naming_bf16(tmp_path, capsys):
    out = tmp_path / "out"
    code = plan.main([str(_config(tmp_path, MOE)), "seq=16", "dtype=fp32", "recompute=none", f"out={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    if code == 0:
        pytest.skip("this torch counts _grouped_mm in float32")
    assert code == 2 and len(err) == 1 and "dtype=bf16" in err[0] and not out.exists()


@pytest.mark.parametrize(
    "words, says",
    [
        ([], "seq="),
        (["seq=0"], "seq="),
        (["seq=8", "dtype=int8"], "dtype="),
        (["seq=8", "memory_gib=-1"], "memory_gib="),
        (["seq=8", "nope=1"], "nope"),
        (["seq=8", "optim=lion"], "optim="),
        (["seq=8", "--bogus"], "--bogus"),
        (["seq=8", "world_size=8"], "strategy="),
        (["seq=8", "world_size=8", "strategy=hsdp", "replicate=3"], "replicate="),
        (["seq=8", "recompute=some"], "recompute="),
        (["seq=8", "largest_batch=true"], "memory_gib="),
    ],
)
def test_bad_words_exit_2(llama, tmp_path, capsys, words, says):
    out = tmp_path / "out"
    assert plan.main([str(llama), *words, f"out={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and not out.exists()


def test_an_existing_out_folder_is_not_overwritten(llama, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    assert plan.main([str(llama), "seq=8", f"out={out}"]) == 2
    assert "never overwritten" in capsys.readouterr().err and list(out.iterdir()) == []


def test_the_chosen_policy_is_written_as_a_recompute_file(llama, llama_figures, tmp_path, capsys):
    """A budget between the cheapest policies' bounds: the cheapest that fits is chosen and written."""
    args = parse_args([str(llama), f"seq={SEQ}", f"batch={BATCH}", "dtype=fp32"])
    plans = {p: compose(llama_figures(p), args, p) for p in ("none", "every_2")}
    budget = (plans["every_2"].reserved_upper + plans["none"].reserved_upper) / 2 / 0.95 / 2**30
    out = tmp_path / "out"
    code = plan.main([str(llama), f"seq={SEQ}", f"batch={BATCH}", "dtype=fp32", f"memory_gib={budget}", f"out={out}"])
    text = capsys.readouterr().out
    assert code == 0 and "<- chosen" in text
    planned = (out / "recompute" / "planned.yaml").read_text()
    assert "mode:" in planned and "recompute=planned" in planned and (out / "plan.csv").is_file()


@pytest.mark.slow
def test_a_planned_policy_runs_through_the_main_command_and_passes(tmp_path, capsys):
    """The plan's recompute file, taken by the main command from the plan's folder (a Hydra config dir)."""
    from conftest import run_pipeline

    example = ROOT / "conf/examples/hf_causal_lm"
    out = tmp_path / "plan"
    words = [str(example), "attn=eager", "seq=32", "batch=8", "dtype=fp32", "recompute=every_2", "memory_gib=1"]
    assert plan.main([*words, f"out={out}"]) == 0
    assert "model.layers.0" in (out / "recompute" / "planned.yaml").read_text()
    (tmp_path / "run").mkdir()
    code, frame = run_pipeline(
        tmp_path / "run",
        f"hydra.searchpath=[file://{out}]",
        "+model=hf_causal_lm",
        f"model.config={example / 'config.json'}",
        "recompute=planned",
    )
    assert code == 0, frame[frame.status != "PASS"].to_string() if frame is not None else code
    planned = frame[frame.item == "plan at this shape"].iloc[0]  # the plan's figure at the run's own shape
    assert planned.status == "PASS" and planned.value <= 0.01 and planned.policy == "every_2"
    measured = frame[(frame.metric == "peak_live_bytes") & (frame.variant == "recompute")].value.iloc[0]
    assert planned.measured_peak_bytes == measured and planned.planned_peak_bytes > 0
    page = (tmp_path / "run" / "report.html").read_text()
    page_1 = page[: page.index("Rerun with")]  # the claim table on page 1
    assert "Planned (reportgen.plan)" in page_1 and "policy every_2" in page_1
    assert format_bytes(planned.planned_peak_bytes) in page_1 and format_bytes(measured) in page_1


@pytest.mark.parametrize(
    "body, says",
    [
        (
            {
                "model_type": "gemma2",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "vocab_size": 256,
            },
            "attn=eager",
        ),
        ({"model_type": "t5", "d_model": 32, "num_layers": 2, "vocab_size": 64, "num_heads": 2}, "decoder-only"),
    ],
    ids=["sdpa-cannot-run-gemma2", "not-a-causal-lm"],
)
def test_a_model_that_cannot_be_built_is_one_line_naming_the_fix(tmp_path, capsys, body, says):
    out = tmp_path / "out"
    assert plan.main([str(_config(tmp_path, body)), "seq=16", "recompute=none", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and not out.exists()


def test_largest_batch_is_solved_from_two_batches_and_holds_at_a_third(llama):
    """The bound is affine in the micro-batch: solved from batches 1 and 2, the answer is 3 for a
    budget between the traced bounds at 3 and 4."""
    words = [str(llama), f"seq={SEQ}", "dtype=fp32", "recompute=full"]
    bound = {}
    for b in (3, 4):
        args = parse_args([*words, f"batch={b}"])
        bound[b] = compose(scaled_figures(load_config(args.config), by_name("full"), args, b)[0], args, "full")
    budget = (bound[3].reserved_upper + bound[4].reserved_upper) / 2 / 0.95 / 2**30
    args = parse_args([*words, "batch=1", f"memory_gib={budget}", "largest_batch=true"])
    _, plans, traces = plan.plan_policies(args)
    assert plans[0].largest_batch == 3 and traces == 4


def test_an_unknown_model_type_never_prompts_even_with_stdin_open(tmp_path):
    """transformers' "run the custom code? [y/N]" would wait on an open stdin; the plan says no at once (issue 27)."""
    import subprocess
    import sys

    from conftest import cli_env

    target = tmp_path / "config.json"
    target.write_text(json.dumps({"model_type": "no-such-model", "hidden_size": 8}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "reportgen.plan", str(target), "seq=16", f"out={tmp_path / 'o'}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    out, err = proc.communicate(timeout=120)  # stdin stays open until then: a prompt would hang
    assert proc.returncode == 2 and "[y/N]" not in out + err and err.count("\n") == 1


def test_a_shipped_plan_config_is_found_by_the_readme_path_from_any_folder(tmp_path, monkeypatch):
    """The README's ``python -m reportgen.plan conf/plan/llama3_8b ...`` is written from a checkout; from an installed
    wheel (another working folder) the same relative path names the config reportgen ships."""
    from reportgen.errors import SetupError
    from reportgen.models.hf.auto import config_file
    from reportgen.paths import conf_dir

    monkeypatch.chdir(tmp_path)
    shipped = conf_dir() / "plan" / "llama3_8b" / "config.json"
    assert config_file("conf/plan/llama3_8b", name=None) == shipped
    assert config_file("plan/llama3_8b", name=None) == shipped
    with pytest.raises(SetupError, match="no such file"):
        config_file("conf/plan/no_such_model", name=None)
