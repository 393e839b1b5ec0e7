"""``+model=hf_causal_lm`` (``reportgen.models.hf.auto``) and the model's own recompute default.

The config.json fixtures are written here from scratch (a tiny GPT-2 and a T5); tests marked
``hf`` need the ``hf`` extra and skip without it. Each runs on transformers 4.x and 5.x: where
the two majors differ (the switch's default ``use_reentrant``), the expected value follows the
installed major.
"""

import json
import math
import warnings

import pytest
import torch
from conftest import SMALL, compose_config, reportgen_cli, run_dirs
from torch import nn
from torch.utils.checkpoint import checkpoint

from reportgen.commands.run import prepare
from reportgen.commands.validation import config_problems
from reportgen.config import RecomputeMode
from reportgen.errors import SetupError
from reportgen.models import hf
from reportgen.models.hf import auto as hf_auto
from reportgen.models.hf import masked as hf_masked
from reportgen.paths import conf_dir
from reportgen.report.metadata import recompute_settings
from reportgen.twins.observe import observe_recompute

#: A tiny GPT-2 as a user's config.json would say it (``n_positions`` bounds the windows).
GPT2_JSON = {
    "model_type": "gpt2",
    "vocab_size": 40,
    "n_positions": 48,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 2,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}


#: A tiny BERT (encoder with a masked-LM head).
BERT_JSON = {
    "model_type": "bert",
    "vocab_size": 50,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "max_position_embeddings": 40,
}


def default_use_reentrant() -> bool:
    """What ``model.<switch>()`` with no arguments puts in force: True before transformers 5, then False
    (transformers' ``modeling_utils``: ``{"use_reentrant": True}`` in 4.x, ``False`` in 5.x)."""
    import transformers

    return int(transformers.__version__.split(".")[0]) < 5


@pytest.fixture
def gpt2_json(tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "tiny-gpt2" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(GPT2_JSON))
    return path


@pytest.fixture
def bert_json(tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "tiny-bert.json"
    path.write_text(json.dumps(BERT_JSON))
    return path


def text_task(config, **kw):
    return hf_auto.TextCausalLMTask(config=str(config), block_size=16, **kw)


# --------------------------------------------------------------------------- without transformers
def test_char_ids_rank_by_frequency_and_clip_to_the_vocabulary():
    vocab, ids = hf_auto.char_ids("aaabbc", 10)
    assert vocab == ["a", "b", "c"] and ids.tolist() == [0, 0, 0, 1, 1, 2]
    vocab, ids = hf_auto.char_ids("aaabbcd", 3)  # c and d are rarest: they share the last id
    assert vocab == ["a", "b", "<rare>"] and ids.tolist() == [0, 0, 0, 1, 1, 2, 2]
    with pytest.raises(SetupError, match="vocab_size >= 2"):
        hf_auto.char_ids("ab", 1)


def test_observe_whole_modules_sees_a_layer_whose_forward_is_recomputed():
    """transformers 5 recomputes a layer's ``forward`` (not ``__call__``): only its children's hooks run again."""

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return checkpoint(lambda h: self.b(torch.tanh(self.a(h))), x, use_reentrant=False)

    torch.manual_seed(0)
    model = nn.Sequential(Layer(), nn.Linear(4, 4), Layer())
    batch = (torch.randn(3, 4), torch.zeros(3, 4))
    loss = lambda out, y: (out - y).square().mean()
    assert observe_recompute(model, batch, loss, 0) == ["2.a", "2.b", "0.a", "0.b"]
    assert observe_recompute(model, batch, loss, 0, whole_modules=True) == ["2", "0"]  # never the root: "1" did not


def test_model_default_needs_the_model_switch():
    problems = config_problems(compose_config("+model=mlp", "recompute=model_default"))
    assert "recompute.mode=null" in problems and "recompute.method=model_switch" in problems


# --------------------------------------------------------------------------- the model's own default
@pytest.mark.hf
@pytest.mark.parametrize("name", ["hf_gpt2", "hf_llama"])
def test_hf_configs_leave_the_mode_to_the_model_and_say_which_it_was(name):
    pytest.importorskip("transformers")
    cfg = compose_config(*SMALL, f"+model={name}")
    assert cfg.recompute.mode is None
    setup = prepare(cfg)
    expected = default_use_reentrant()
    assert setup.mode == (RecomputeMode.reentrant if expected else RecomputeMode.non_reentrant)
    assert setup.mode_note == f"the model's own default (use_reentrant={expected})"
    assert recompute_settings(setup)["mode"] == setup.mode.value  # what the diagnosis rules read
    assert len(setup.wrapped) == 2  # both decoder layers observed recomputing on either major


@pytest.mark.hf
def test_a_set_mode_overrides_the_models_default():
    pytest.importorskip("transformers")
    setup = prepare(compose_config(*SMALL, "+model=hf_gpt2", "recompute=reentrant"))
    assert (setup.mode, setup.mode_note) == (RecomputeMode.reentrant, None)


@pytest.mark.hf
def test_enable_without_a_mode_calls_the_switch_bare_and_reads_its_default(gpt2_json):
    from omegaconf import OmegaConf

    task = text_task(gpt2_json)
    rc = compose_config("+model=hf_gpt2").recompute
    model = hf_auto.causal_lm(task, config=str(gpt2_json))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # 5.x: activation_checkpointing_enable, not the deprecated name
        assert hf.enable(model, rc) is default_use_reentrant()
    keywords = model.transformer.h[0]._gradient_checkpointing_func.keywords
    assert keywords == {"use_reentrant": default_use_reentrant()}  # nothing else passed: the model's own call
    model = hf_auto.causal_lm(task, config=str(gpt2_json))
    hf.enable(model, OmegaConf.merge(rc, {"preserve_rng_state": False}))
    keywords = model.transformer.h[0]._gradient_checkpointing_func.keywords
    assert keywords["use_reentrant"] is default_use_reentrant() and keywords["preserve_rng_state"] is False


# --------------------------------------------------------------------------- configs and models
@pytest.mark.hf
def test_config_from_a_file_or_its_folder(gpt2_json):
    for path in (gpt2_json, gpt2_json.parent):
        cfg = hf_auto.load_config(str(path))
        assert type(cfg).__name__ == "GPT2Config" and (cfg.n_embd, cfg.n_layer, cfg.vocab_size) == (32, 2, 40)
    assert hf_auto.max_positions(cfg) == 48


@pytest.mark.hf
def test_random_init_is_seeded_and_sized_by_the_config(gpt2_json):
    task = text_task(gpt2_json)
    weights = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        model = hf_auto.causal_lm(task, config=str(gpt2_json))
        weights.append(model.transformer.wte.weight.detach().clone())
    assert type(model).__name__ == "GPT2LMHeadModel" and tuple(weights[0].shape) == (40, 32)
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])


@pytest.mark.hf
def test_pretrained_loads_local_weights(gpt2_json, tmp_path):
    task = text_task(gpt2_json)
    saved = hf_auto.causal_lm(task, config=str(gpt2_json))
    with torch.no_grad():
        saved.transformer.wte.weight.fill_(0.25)
    saved.save_pretrained(tmp_path / "weights")
    loaded = hf_auto.causal_lm(task, pretrained=str(tmp_path / "weights"))
    assert torch.equal(loaded.transformer.wte.weight, torch.full((40, 32), 0.25))


@pytest.mark.hf
def test_text_task_reads_a_file_and_fits_the_config(gpt2_json, tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    task = text_task(gpt2_json, text_file=str(text))
    assert task.vocab_size == len(set(text.read_text())) == 28  # 26 letters, space and full stop: below 40
    inputs, targets = task.make_batch(torch.Generator().manual_seed(0), 3)
    assert inputs["input_ids"].shape == targets.shape == (3, 16)
    assert torch.equal(inputs["input_ids"][:, 1:], targets[:, :-1])  # next-character targets
    default = text_task(gpt2_json)  # Python's docs have more characters than 40: the rarest share id 39
    assert default.vocab_size == 40 and default.vocab[-1] == "<rare>" and int(default.train.max()) == 39


@pytest.mark.hf
@pytest.mark.parametrize(
    "fields,kwargs,message",
    [
        (None, {"config": "/nonexistent/config.json"}, "no such file"),
        ({"vocab_size": 10}, {}, 'no "model_type"'),
        ({"model_type": "no_such_model"}, {}, "not known to the installed transformers"),
        ({"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "x.Y"}}, {}, "remote code"),
        (
            {
                "model_type": "t5",
                "vocab_size": 64,
                "d_model": 16,
                "d_ff": 32,
                "num_layers": 1,
                "num_heads": 2,
                "d_kv": 8,
            },
            {},
            "has no causal-LM head",
        ),
        (None, {"pretrained": "Qwen/Qwen2-0.5B"}, "never downloads"),
        (None, {}, "exactly one of model.config"),
    ],
)
def test_bad_input_is_a_usage_error_naming_the_fix(tmp_path, gpt2_json, fields, kwargs, message):
    if fields is not None:
        (tmp_path / "bad.json").write_text(json.dumps(fields))
        kwargs = {"config": str(tmp_path / "bad.json")}
    with pytest.raises(SetupError, match=message):
        hf_auto.causal_lm(text_task(gpt2_json), **kwargs)


@pytest.mark.hf
def test_windows_longer_than_the_positions_are_refused(gpt2_json):
    with pytest.raises(SetupError, match="task.block_size<=48"):
        hf_auto.causal_lm(hf_auto.TextCausalLMTask(config=str(gpt2_json), block_size=64), config=str(gpt2_json))


@pytest.mark.hf
def test_shipped_example_config_builds():
    pytest.importorskip("transformers")
    example = conf_dir().parent / hf_auto.EXAMPLE
    setup = prepare(compose_config(*SMALL, "+model=hf_causal_lm", f"model.config={example}"))
    assert type(setup.build(False)).__name__ == "Qwen2ForCausalLM"
    assert [w.cls for w in setup.wrapped] == ["Qwen2DecoderLayer"] * 2


# --------------------------------------------------------------------------- masked LM
@pytest.mark.hf
def test_masked_batches_hide_what_they_ask_for(bert_json):
    task = hf_masked.TextMaskedLMTask(config=str(bert_json), block_size=16)
    assert task.mask_id == 49 and task.vocab_size == 50  # 49 character ids (the rarest shared), then the mask
    inputs, targets = task.make_batch(torch.Generator().manual_seed(3), 8)
    again, _ = task.make_batch(torch.Generator().manual_seed(3), 8)
    ids, masked = inputs["input_ids"], targets != hf_masked.IGNORE
    assert torch.equal(ids, again["input_ids"]) and ids.shape == (8, 16)
    assert bool(masked.any(dim=1).all())  # at least one masked position per window
    assert bool((ids[masked] == task.mask_id).all()) and bool((ids[~masked] != task.mask_id).all())
    assert bool((targets[masked] < task.mask_id).all())  # the hidden characters, never the mask id


@pytest.mark.hf
def test_masked_lm_builds_the_configs_head_and_refuses_a_decoder(bert_json, gpt2_json):
    task = hf_masked.TextMaskedLMTask(config=str(bert_json), block_size=16)
    model = hf_masked.masked_lm(task, config=str(bert_json))
    inputs, targets = task.make_batch(torch.Generator().manual_seed(0), 2)
    loss = task.loss(model(**inputs), targets)
    assert type(model).__name__ == "BertForMaskedLM" and abs(float(loss) - math.log(50)) < 0.5  # chance level
    with pytest.raises(SetupError, match="has no masked-LM head"):
        hf_masked.masked_lm(hf_masked.TextMaskedLMTask(config=str(gpt2_json), block_size=16), config=str(gpt2_json))
    with pytest.raises(SetupError, match="task.mask_prob"):
        hf_masked.TextMaskedLMTask(config=str(bert_json), mask_prob=0.0)


@pytest.mark.hf
def test_shipped_masked_example_recomputes_every_encoder_layer():
    pytest.importorskip("transformers")
    example = conf_dir() / "examples" / "hf_masked_lm" / "config.json"
    setup = prepare(compose_config(*SMALL, "+model=hf_masked_lm", f"model.config={example}"))
    assert [w.path for w in setup.wrapped] == ["bert.encoder.layer.1", "bert.encoder.layer.0"]
    assert setup.mode == (RecomputeMode.reentrant if default_use_reentrant() else RecomputeMode.non_reentrant)


# --------------------------------------------------------------------------- end to end
@pytest.mark.hf
@pytest.mark.slow
def test_one_command_tests_a_users_config_end_to_end(gpt2_json, tmp_path, signing_key_pair):
    private, public = signing_key_pair
    done = reportgen_cli(
        tmp_path,
        *SMALL,
        "report.sign=true",
        "report.pdf=true",
        f"report.key_path={private}",
        "+model=hf_causal_lm",
        f"model.config={gpt2_json.parent}",
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (folder,) = run_dirs(tmp_path)
    html = (folder / "report.html").read_text()
    mode = "reentrant" if default_use_reentrant() else "non_reentrant"
    assert f"{mode} — the model&#39;s own default (use_reentrant={default_use_reentrant()})" in html
    assert "transformer.h.0</code> (GPT2Block)" in html
    verified = reportgen_cli(tmp_path, str(folder), "--key", str(public), module="reportgen.verify")
    assert verified.returncode == 0 and "VERIFIED (run folder)" in verified.stdout


@pytest.mark.hf
@pytest.mark.parametrize("block_size", [0, -4])
def test_a_window_of_no_characters_is_refused_naming_the_setting(gpt2_json, block_size):
    """Found by a break-it pass: 0 ended INCONCLUSIVE with an IndexError in every twin, -4 blamed the
    user's make_batch; reportgen's own task says what is wrong."""
    with pytest.raises(SetupError, match=r"task.block_size=-?\d must be a whole number of characters, at least 1"):
        hf_auto.TextCausalLMTask(config=str(gpt2_json), block_size=block_size)
    from reportgen.models.hf.masked import TextMaskedLMTask

    with pytest.raises(SetupError, match="at least 1"):
        TextMaskedLMTask(config=str(gpt2_json), block_size=block_size)


@pytest.mark.hf
def test_local_paths_and_unusable_attention_get_their_own_fix(tmp_path, gpt2_json):
    """Found by a break-it pass: a missing local folder was told to `hf download` it, a folder as
    text_file was "no such file", flash_attention_2 without its package blamed importability."""
    with pytest.raises(SetupError, match="does not exist; give the folder save_pretrained wrote"):
        hf_auto.pretrained_folder(str(tmp_path / "nonexistent"))
    with pytest.raises(SetupError, match="is a folder without config.json"):
        hf_auto.pretrained_folder(str(tmp_path))
    with pytest.raises(SetupError, match="never downloads"):
        hf_auto.pretrained_folder("Qwen/Qwen2-0.5B")
    with pytest.raises(SetupError, match="is a folder, not a file"):
        text_task(gpt2_json, text_file=str(tmp_path))
    with pytest.raises(
        SetupError, match="attn_implementation=flash_attention_2: .* use model.attn_implementation=eager"
    ):
        hf_auto.causal_lm(text_task(gpt2_json), config=str(gpt2_json), attn_implementation="flash_attention_2")


@pytest.mark.hf
def test_an_encoder_as_a_causal_lm_is_refused_unless_it_is_a_decoder(tmp_path, gpt2_json):
    """Found by a break-it pass: a BERT config ran as hf_causal_lm and PASSed, its LM head attending
    both ways (the next-token metric reads the answer). The probe refuses it; is_decoder fixes it."""
    bert = {
        "model_type": "bert",
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    }
    (tmp_path / "config.json").write_text(json.dumps(bert))
    with pytest.raises(SetupError, match='not causal with this config.*"is_decoder": true'):
        hf_auto.causal_lm(text_task(gpt2_json), config=str(tmp_path / "config.json"))
    (tmp_path / "config.json").write_text(json.dumps({**bert, "is_decoder": True}))
    model = hf_auto.causal_lm(text_task(gpt2_json), config=str(tmp_path / "config.json"))
    assert type(model).__name__ == "BertLMHeadModel" and model.training  # the probe leaves train mode as it was


def test_observe_whole_modules_names_a_layer_whose_trailing_dropout_is_not_run_again():
    """GPT-NeoX, Phi-3, StableLM end a layer with a dropout (p=0: it saves nothing), and non-reentrant
    recompute stops once every saved tensor is back, before that dropout runs again (issue 28 item 5):
    every child that holds parameters ran again, so the layer is named, not its children."""

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.drop = nn.Linear(4, 4), nn.Linear(4, 4), nn.Dropout(0.0)

        def forward(self, x):
            return checkpoint(lambda h: self.drop(self.b(torch.tanh(self.a(h)))), x, use_reentrant=False)

    class HalfLayer(Layer):  # only one of the children holding parameters runs under recompute
        def forward(self, x):
            return self.b(checkpoint(lambda h: self.drop(torch.tanh(self.a(h))), x, use_reentrant=False))

    torch.manual_seed(0)
    model = nn.Sequential(Layer(), nn.Linear(4, 4), Layer(), HalfLayer())
    batch = (torch.randn(3, 4), torch.zeros(3, 4))
    loss = lambda out, y: (out - y).square().mean()
    assert "2.drop" not in observe_recompute(model, batch, loss, 0)  # the early stop: dropout never runs again
    assert observe_recompute(model, batch, loss, 0, whole_modules=True) == ["3.a", "2", "0"]


@pytest.mark.hf
@pytest.mark.slow
def test_a_gpt_neox_layer_is_observed_as_the_layer_not_its_children(tmp_path):
    """Before issue 28 item 5 the page listed 10 children (input_layernorm ... post_attention_dropout ... mlp)
    of the two GPTNeoXLayer s: their trailing dropout is not run again by non-reentrant recompute."""
    pytest.importorskip("transformers")
    config = tmp_path / "neox.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "gpt_neox",
                "vocab_size": 96,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "max_position_embeddings": 64,
                "rotary_pct": 0.25,
                "use_cache": False,
            }
        )
    )
    setup = prepare(compose_config(*SMALL, "+model=hf_causal_lm", f"model.config={config}", "parity.batch_size=2"))
    assert setup.architecture.endswith(".GPTNeoXForCausalLM")
    assert [(w.path, w.cls) for w in setup.wrapped] == [
        ("gpt_neox.layers.1", "GPTNeoXLayer"),
        ("gpt_neox.layers.0", "GPTNeoXLayer"),
    ]
