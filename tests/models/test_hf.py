"""Hugging Face models (``reportgen.models.hf``): tiny factories, the task's keyword batches, the model's switch.

Tests marked ``hf`` need the ``hf`` extra (transformers) and skip cleanly without it (conftest
skips the marker; each also calls ``pytest.importorskip``). The unmarked tests check what a user
without the extra sees: a usage error that names the install line.
"""

import copy
import fnmatch
import math
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import REPO, compose_config
from torch import nn
from torch.nn import functional as F

from reportgen.commands.run import prepare
from reportgen.config import RecomputeConfig, RecomputeMode
from reportgen.errors import SetupError
from reportgen.models import hf
from reportgen.paths import conf_dir
from reportgen.tasks import CharTextTask
from reportgen.twins.observe import observe_recompute
from reportgen.twins.setup import build_setup

BLOCK = 32  # characters per example, as in conf/model/hf_*.yaml
FACTORIES = {"gpt2": hf.gpt2, "llama": hf.llama}
LAYER = {"gpt2": "GPT2Block", "llama": "LlamaDecoderLayer"}


@pytest.fixture(scope="module")
def task():
    pytest.importorskip("transformers")
    return hf.CausalLMTask(block_size=BLOCK)


def build(name: str, task, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # reportgen seeds before every factory call
    return FACTORIES[name](task).train()


def recompute_cfg(mode, **kw):
    """``cfg.recompute`` as reportgen passes it (a structured DictConfig)."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(RecomputeConfig(mode=RecomputeMode(getattr(mode, "value", mode)), **kw))


def forward_backward(model, task, inputs, targets):
    """Seeded forward and backward: ``(loss, {name: grad})``."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(71)
    loss = task.loss(model(**inputs), targets)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def major() -> int:
    """transformers' major version (4 or 5)."""
    import transformers

    return int(transformers.__version__.split(".")[0])


def switched_on(model) -> bool:
    """Whether any module's ``gradient_checkpointing`` flag is on (both majors' property, no warning)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def differs(a, b) -> bool:
    """Whether a module attribute differs between a deep copy and its original (tensors by value;
    submodule and parameter dicts are compared module by module, so skipped here)."""
    if isinstance(a, (dict, nn.Module)) or isinstance(b, (dict, nn.Module)):
        return False
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b))
    return a != b


# --------------------------------------------------------------------------- without the extra
@pytest.fixture
def no_transformers(monkeypatch):
    """Make ``import transformers`` fail as it does where the extra is not installed."""
    for name in [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "transformers", None)


def test_require_transformers_names_the_install_line(no_transformers):
    with pytest.raises(SetupError, match=r'pip install -e "\.\[hf\]"') as info:
        hf.require_transformers()
    assert isinstance(info.value, ValueError)  # a usage error: the run exits 2


@pytest.mark.parametrize(
    "call",
    [
        lambda: hf.CausalLMTask(block_size=BLOCK),
        lambda: hf.gpt2(CharTextTask(block_size=BLOCK)),
        lambda: hf.llama(CharTextTask(block_size=BLOCK)),
    ],
    ids=["CausalLMTask", "gpt2", "llama"],
)
def test_factories_and_task_stop_with_the_install_line(no_transformers, call):
    with pytest.raises(SetupError, match=r'pip install -e "\.\[hf\]"'):
        call()


def test_config_naming_the_task_stops_setup_with_the_install_line(no_transformers):
    cfg = compose_config("+model=gpt", "task._target_=reportgen.models.hf.CausalLMTask")
    with pytest.raises(SetupError, match=r'pip install -e "\.\[hf\]"'):
        prepare(cfg)


def test_importing_reportgen_hf_does_not_import_transformers():
    code = "import sys, reportgen.models.hf; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- factories
@pytest.mark.hf
def test_gpt2_is_tiny_sized_by_the_task_and_random_init(task):
    model = build("gpt2", task)
    cfg = model.config
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert (cfg.vocab_size, cfg.n_positions, cfg.n_layer, cfg.n_embd, cfg.n_head) == (task.vocab_size, BLOCK, 2, 64, 4)
    assert cfg._attn_implementation == "sdpa" and cfg.use_cache is False  # transformers' own choice
    assert (cfg.resid_pdrop, cfg.embd_pdrop, cfg.attn_pdrop) == (0.1, 0.1, 0.1)  # GPT-2's own dropout
    assert model.transformer.wte.weight.shape == (task.vocab_size, 64)
    same, other = build("gpt2", task, seed=0), build("gpt2", task, seed=1)
    w = "transformer.h.0.attn.c_attn.weight"
    assert torch.equal(model.state_dict()[w], same.state_dict()[w])  # the seed fixes the weights
    assert not torch.equal(model.state_dict()[w], other.state_dict()[w])  # ...and is what fixes them


@pytest.mark.hf
def test_llama_is_tiny_sized_by_the_task(task):
    model = build("llama", task)
    cfg = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (
        cfg.vocab_size,
        cfg.max_position_embeddings,
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
    ) == (task.vocab_size, BLOCK, 2, 64, 4, 2)
    assert cfg._attn_implementation == "sdpa" and cfg.use_cache is False
    assert len(model.model.layers) == 2


@pytest.mark.hf
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_factories_take_vocab_size_use_cache_and_attn_implementation(task, name):
    torch.manual_seed(0)
    model = getattr(hf, name)(task, vocab_size=task.vocab_size + 100, use_cache=True, attn_implementation="eager")
    assert model.config.vocab_size == task.vocab_size + 100 and model.config.use_cache is True
    assert model.config._attn_implementation == "eager"
    assert model.get_output_embeddings().weight.shape[0] == task.vocab_size + 100
    with pytest.raises(SetupError, match="vocab_size"):
        getattr(hf, name)(task, vocab_size=2)


@pytest.mark.hf
def test_use_cache_on_the_command_line_is_no_duplicated_keyword():
    """``++model.use_cache=true`` used to exit 2 with "got multiple values for keyword argument"."""
    pytest.importorskip("transformers")
    cfg = compose_config(
        "+model=hf_llama", "++model.use_cache=true", "++model.vocab_size=300", "++model.attn_implementation=eager"
    )
    model = build_setup(cfg).build(recompute=False, compiled=False)
    assert model.config.use_cache is True and model.config.vocab_size == 300
    assert model.config._attn_implementation == "eager"


@pytest.mark.hf
def test_factory_passes_further_config_fields(task):
    torch.manual_seed(0)
    model = hf.gpt2(task, n_layer=3, resid_pdrop=0.0)
    assert model.config.n_layer == 3 and len(model.transformer.h) == 3 and model.config.resid_pdrop == 0.0


@pytest.mark.hf
def test_factory_without_a_sized_task_is_a_usage_error():
    pytest.importorskip("transformers")
    with pytest.raises(SetupError, match="vocab_size"):
        hf.gpt2(object())


# --------------------------------------------------------------------------- the task
@pytest.mark.hf
def test_batches_are_keyword_inputs_of_the_right_shape_and_dtype(task):
    inputs, targets = task.make_batch(torch.Generator().manual_seed(3), 5)
    assert sorted(inputs) == ["attention_mask", "input_ids"]
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    assert ids.shape == mask.shape == targets.shape == (5, BLOCK)
    assert ids.dtype == mask.dtype == targets.dtype == torch.int64
    assert bool((mask == 1).all())
    assert torch.equal(targets[:, :-1], ids[:, 1:])  # next-character targets
    assert int(ids.max()) < task.vocab_size


@pytest.mark.hf
def test_batches_come_from_the_generator_and_the_gpt_text(task):
    draw = lambda seed: task.make_batch(torch.Generator().manual_seed(seed), 8)
    (a, ya), (b, yb), (c, _) = draw(0), draw(0), draw(1)
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(ya, yb)
    assert not torch.equal(a["input_ids"], c["input_ids"])
    plain_ids, plain_targets = CharTextTask(block_size=BLOCK).make_batch(torch.Generator().manual_seed(0), 8)
    assert torch.equal(a["input_ids"], plain_ids) and torch.equal(ya, plain_targets)  # same windows as +model=gpt
    assert (task.metric, task.higher_is_better) == ("bits_per_char", False)


@pytest.mark.hf
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_forward_backward_through_keyword_call_gives_a_finite_chance_level_loss(task, name):
    model = build(name, task)
    inputs, targets = task.make_batch(torch.Generator().manual_seed(0), 4)
    output = model(**inputs)
    assert output.logits.shape == (4, BLOCK, task.vocab_size)
    loss = task.loss(output, targets)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    manual = F.cross_entropy(output.logits.reshape(-1, task.vocab_size).float(), targets.reshape(-1))
    assert torch.allclose(loss, manual)
    assert abs(float(loss.detach()) - math.log(task.vocab_size)) < 0.3  # random init predicts about uniformly
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


@pytest.mark.hf
def test_evaluate_calls_the_model_with_keywords(task):
    model = build("llama", task).eval()
    with torch.no_grad():
        first, second = task.evaluate(model), task.evaluate(model)
    assert first == second  # fixed held-out windows
    assert set(first) == {"val_loss", "bits_per_char"}
    assert first["bits_per_char"] == pytest.approx(first["val_loss"] / math.log(2))
    assert abs(first["val_loss"] - math.log(task.vocab_size)) < 0.3


# --------------------------------------------------------------------------- the switch
@pytest.mark.hf
@pytest.mark.parametrize(
    "mode,use_reentrant", [("non_reentrant", False), ("reentrant", True), (RecomputeMode.reentrant, True)]
)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_enable_turns_on_hf_switch_with_use_reentrant(task, name, mode, use_reentrant):
    model = build(name, task)
    assert not switched_on(model)
    assert hf.enable(model, recompute_cfg(mode)) is use_reentrant
    assert switched_on(model)
    layers = [m for m in model.modules() if type(m).__name__ == LAYER[name]]
    assert len(layers) == 2 and all(m.gradient_checkpointing for m in layers)
    kwargs = layers[0]._gradient_checkpointing_func.keywords
    assert kwargs["use_reentrant"] is use_reentrant and kwargs["preserve_rng_state"] is True


@pytest.mark.hf
def test_enable_passes_preserve_rng_state_through(task):
    model = build("gpt2", task)
    hf.enable(model, recompute_cfg("non_reentrant", preserve_rng_state=False))
    assert model.transformer.h[0]._gradient_checkpointing_func.keywords["preserve_rng_state"] is False


@pytest.mark.hf
def test_enable_selective_mode_passes_the_save_policy(task):
    model = build("gpt2", task)
    assert hf.enable(model, recompute_cfg("selective", save_ops=["aten.mm"])) is False
    kwargs = model.transformer.h[0]._gradient_checkpointing_func.keywords
    assert kwargs["use_reentrant"] is False and callable(kwargs["context_fn"])


@pytest.mark.hf
def test_enable_refuses_a_model_without_the_switch():
    pytest.importorskip("transformers")
    with pytest.raises(SetupError, match="recompute.method=wrap"):
        hf.enable(nn.Linear(2, 2), recompute_cfg("non_reentrant"))


@pytest.mark.hf
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_attributes_the_switch_sets_are_the_configs_ignored_ones(task, name):
    plain = build(name, task)
    switched = copy.deepcopy(plain)
    hf.enable(switched, recompute_cfg("non_reentrant"))
    changed = {
        attr
        for (_, a), (_, b) in zip(plain.named_modules(), switched.named_modules())
        for attr in set(vars(a)) | set(vars(b))
        if differs(vars(a).get(attr), vars(b).get(attr))
    }
    # transformers 5 also calls enable_input_require_grads(): a hook handle kept on the model
    hooks = {"_require_grads_hook", "_require_grads_hooks"} if major() >= 5 else set()
    assert changed == {"gradient_checkpointing", "_gradient_checkpointing_func"} | hooks
    config = yaml.safe_load((conf_dir() / "model" / f"hf_{name}.yaml").read_text())
    globs = config["state"]["ignore_attributes"]
    assert all(any(fnmatch.fnmatchcase(attr, g) for g in globs) for attr in changed)
    assert config["recompute"] == {"method": "model_switch", "enable": "reportgen.models.hf.enable"}


@pytest.mark.hf
@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_switched_twin_recomputes_its_layers_and_matches_the_plain_twin(task, name, mode):
    plain = build(name, task)
    switched = copy.deepcopy(plain)
    hf.enable(switched, recompute_cfg(mode))
    inputs, targets = task.make_batch(torch.Generator().manual_seed(0), 4)
    observed = {
        label: observe_recompute(model, (inputs, targets), task.loss, 71, whole_modules=True)
        for label, model in (("plain", plain), ("switched", switched))
    }
    layers = [p for p, m in plain.named_modules() if type(m).__name__ == LAYER[name]]
    assert observed == {"plain": [], "switched": layers[::-1]}  # each decoder layer runs again in backward, last first
    (l0, g0), (l1, g1) = (
        forward_backward(plain, task, inputs, targets),
        forward_backward(switched, task, inputs, targets),
    )
    assert torch.equal(l0, l1)
    assert all(torch.equal(g0[k], g1[k]) for k in g0)  # GPT-2's dropout replayed: bitwise equal gradients
