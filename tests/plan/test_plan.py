"""``python -m reportgen.plan``: the plan on fake tensors equals the measurement on real tensors at a
small shape of the same config family, and bad input ends with one line, exit 2, nothing written."""
from __future__ import annotations

import json

import pytest
import torch

from reportgen import plan
from reportgen.memory.saved import saved_activation_bytes
from reportgen.memory.peak import warm_step_peak

pytestmark = pytest.mark.hf

#: A Llama-family config at a small shape: 2 layers, hidden 64, vocab 256 (numbers only).
SMALL = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 172,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
         "max_position_embeddings": 128, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
SEQ, BATCH = 32, 2


@pytest.fixture(scope="module")
def small_config(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("small")
    (folder / "config.json").write_text(json.dumps(SMALL))
    return folder


@pytest.fixture(scope="module")
def planned(small_config):
    """The plan at batch 2 with a budget nothing fits in (one count per setting: fast)."""
    args = plan.parse_args([str(small_config), f"seq={SEQ}", f"batch={BATCH}", "dtype=fp32", "memory_gib=1e-9"])
    return plan.make_plan(args)


@pytest.mark.parametrize("index", range(len(plan.SETTINGS)))
def test_plan_equals_measurement_at_a_small_shape(small_config, planned, index):
    name, use_reentrant = plan.SETTINGS[index]
    config = plan.load_config(plan.config_file(small_config))
    torch.manual_seed(0)
    model = plan.build_causal_lm(config, torch.float32, "sdpa", use_reentrant)
    batch = plan.real_batch(BATCH, SEQ)
    saved = saved_activation_bytes(model, batch, plan.causal_lm_loss, None, plan.layer_paths(model))
    real = warm_step_peak(model, batch, plan.causal_lm_loss, plan.OPTIMIZER, None, warm_steps=1)
    got = planned.settings[index]
    assert got.setting == name
    assert abs(got.peak.peak_bytes - real.peak_bytes) <= 0.01 * real.peak_bytes, (got.peak, real)
    assert abs(got.saved_bytes - saved.total_bytes) <= 0.01 * saved.total_bytes
    assert got.saved_per_layer == saved.per_module
    assert got.peak.categories["parameters"] == real.categories["parameters"]


def test_recompute_lowers_saved_bytes_and_the_plan_writes_its_files(planned, tmp_path):
    none, reentrant, non_reentrant = planned.settings
    assert reentrant.saved_bytes < none.saved_bytes and non_reentrant.saved_bytes < none.saved_bytes
    assert all(s.largest_batch == 0 for s in planned.settings)  # 1e-9 GiB: nothing fits
    paths = plan.write_plan(planned, tmp_path / "plan", pdf=False)
    text = paths["csv"].read_text()
    assert text.splitlines()[0] == ",".join(plan.CSV_COLUMNS) and "model.layers.1" in text
    html = paths["html"].read_text()
    assert "allocator fragmentation" in html and "non-reentrant" in html


def test_largest_batch_is_solved_and_confirmed(small_config):
    """A budget between two batches' peaks: the answer fits and the next batch does not."""
    args = plan.parse_args([str(small_config), f"seq={SEQ}", "batch=1", "dtype=fp32", "memory_gib=1"])
    config = plan.load_config(args.config)
    first, _ = plan.plan_setting(config, args, "none", None)
    budget = first.peaks[1] + 3.5 * (first.peaks[2] - first.peaks[1])
    args.memory_gib = budget / 2**30
    result, _ = plan.plan_setting(config, args, "none", None)
    best = result.largest_batch
    assert best >= 1 and result.peaks[best] <= budget
    assert max(result.peaks) > best and all(p > budget for b, p in result.peaks.items() if b > best)


@pytest.mark.parametrize("case", ["missing", "folder without config", "not json", "unknown model type"])
def test_bad_config_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, case):
    pytest.importorskip("transformers")
    target = tmp_path / "cfg"
    if case == "folder without config":
        target.mkdir()
    elif case == "not json":
        target.write_text("{not json")
    elif case == "unknown model type":
        target.write_text(json.dumps({"model_type": "no-such-model", "hidden_size": 8}))
    out = tmp_path / "out"
    code = plan.main([str(target), "seq=16", f"out={out}", "pdf=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("reportgen.plan: "), err
    assert "config" in err[0] and not out.exists()


@pytest.mark.parametrize("words, says", [([], "seq="), (["seq=0"], "seq="), (["seq=8", "dtype=int8"], "dtype="),
                                         (["seq=8", "memory_gib=-1"], "memory_gib="), (["seq=8", "nope=1"], "nope"),
                                         (["seq=8", "optim=sgd"], "optim="), (["seq=8", "--bogus"], "--bogus")])
def test_bad_words_exit_2(small_config, tmp_path, capsys, words, says):
    out = tmp_path / "out"
    assert plan.main([str(small_config), *words, f"out={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and not out.exists()


def test_a_shape_that_overflows_exits_2(small_config, tmp_path, capsys):
    out = tmp_path / "out"
    assert plan.main([str(small_config), f"seq={2**62}", f"out={out}", "pdf=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seq=" in err[0] and not out.exists()


def test_an_existing_out_folder_is_not_overwritten(small_config, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    assert plan.main([str(small_config), "seq=8", f"out={out}"]) == 2
    assert "never overwritten" in capsys.readouterr().err and list(out.iterdir()) == []


GIB = 2**30


@pytest.mark.parametrize("opt, base, per_sample, bump", [
    (0, 50, 11, 0),      # activations set the peak everywhere
    (75, 50, 11, 0),     # batch 1 and 2 peak in the optimizer step
    (75, 10, 1, 0),      # optimizer-bound far out: the line is solved, then confirmed exactly
    (0, 0, 106, 0),      # nothing fits
    (0, 10, 3, 1),       # not affine (a jump past batch 5): the bracket is closed by counts
    (74.79, 40, 9, 0),
])
def test_fit_largest_batch_is_the_true_largest_batch(opt, base, per_sample, bump):
    def peak(batch):
        act = int((base + per_sample * batch + (1 if bump and batch > 5 else 0)) * GIB)
        return max(act, int(opt * GIB)), act

    calls = []
    result = plan.fit_largest_batch(lambda b: calls.append(b) or peak(b), 80 * GIB, 1)
    truth = max([b for b in range(1, 500) if peak(b)[0] <= 80 * GIB] or [0])
    assert result["largest"] == truth, (calls, result["note"])
    assert len(calls) <= 6 and (truth == 0 or peak(truth + 1)[0] > 80 * GIB)
