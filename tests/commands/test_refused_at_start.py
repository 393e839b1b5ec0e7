"""Settings that cannot be right are refused before any model work, exit 2, one line naming the setting and the
fix (issue 44, item 4): a negative seed, a zero block size, an HF config.json that leaves the model's sizes to
transformers' defaults, FSDP1's ``sync_module_states`` on CPU ranks."""

from __future__ import annotations

import json

import pytest
from conftest import compose_config, reportgen

from reportgen.commands.validation import config_problems
from reportgen.errors import SetupError

FSDP1 = ("distributed.world_size=2", "distributed.strategy=fsdp1", "device=cpu")


@pytest.mark.parametrize(
    "overrides, says",
    [
        (("+model=ffn", "budget.seeds=[-1]"), "budget.seeds=[-1]: seed(s) -1 must be integers >= 0"),
        (("+model=ffn", "larger_batch.seeds=[0,-2]"), "larger_batch.seeds=[0, -2]: seed(s) -2 must be integers >= 0"),
        (("+model=ffn", "forward_seed=-1"), "forward_seed=-1 must be an integer >= 0 (or null)"),
        (("+model=gpt", "task.block_size=0"), "task.block_size=0 must be an integer >= 1 (tokens per example)"),
        (
            (*FSDP1, "+model=ffn", "distributed.fsdp1.sync_module_states=true"),
            "distributed.fsdp1.sync_module_states=true needs CUDA",
        ),
        (
            ("+model=ffn", "parity.optimizer._target_=torch.optim.Adamw"),
            "parity.optimizer._target_=torch.optim.Adamw cannot be imported: torch.optim has no 'Adamw' "
            "(did you mean torch.optim.AdamW?)",
        ),
        (
            ("+model=mlp", "distributed.world_size=2", "distributed.strategy=custom", "distributed.wrap=my.mod.wrap"),
            "distributed.wrap=my.mod.wrap cannot be imported: no module 'my' (is it installed, or on PYTHONPATH?)",
        ),
    ],
)
def test_a_setting_that_cannot_be_right_is_named_with_its_fix(overrides, says):
    problems = config_problems(compose_config(*overrides))
    assert says in problems, problems


def test_the_same_settings_with_good_values_are_not_refused():
    assert config_problems(compose_config("+model=ffn", "budget.seeds=[0,3]", "forward_seed=0")) == ""
    assert config_problems(compose_config("+model=gpt", "task.block_size=8")) == ""
    assert "sync_module_states" not in config_problems(compose_config(*FSDP1, "+model=ffn"))
    assert config_problems(compose_config("+model=ffn", "parity.optimizer._target_=torch.optim.SGD")) == ""
    wrapped = (
        "distributed.world_size=2",
        "distributed.strategy=custom",
        "distributed.wrap=user_models.dist_wrapping.wrap_ddp_static",
    )
    assert "distributed.wrap" not in config_problems(compose_config("+model=mlp", *wrapped))


def test_a_negative_seed_exits_2_in_one_line_and_writes_nothing(tmp_path):
    proc = reportgen(tmp_path, "+model=ffn", "budget.seeds=[-1]")
    assert proc.returncode == 2 and list(tmp_path.iterdir()) == [], proc.stdout + proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stderr == ""
    assert proc.stdout.startswith("reportgen: cannot start: budget.seeds=[-1]: seed(s) -1 must be integers >= 0")


@pytest.mark.hf
def test_an_hf_config_json_without_the_model_sizes_is_refused_naming_them(tmp_path):
    from reportgen.models.hf.auto import load_config

    target = tmp_path / "config.json"
    target.write_text(json.dumps({"model_type": "qwen2", "vocab_size": 96, "num_hidden_layers": 2}))
    with pytest.raises(SetupError) as refused:
        load_config(target)
    (line,) = str(refused.value).splitlines()
    assert "does not set hidden_size, num_attention_heads: transformers would silently use qwen2's defaults" in line
    assert "hidden_size=" in line and "set them in config.json" in line
    gpt2 = {"model_type": "gpt2", "vocab_size": 96, "n_embd": 32, "n_layer": 2, "n_head": 2}  # GPT-2's own names
    target.write_text(json.dumps(gpt2))
    assert load_config(target).hidden_size == 32
