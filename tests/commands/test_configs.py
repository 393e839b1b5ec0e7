"""Every shipped config composes and instantiates; schema typos fail at compose time."""

import pytest
from conftest import compose_config
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from reportgen.commands.run import prepare
from reportgen.paths import builtin_models, conf_dir


def test_builtin_models_are_the_documented_ones():
    assert builtin_models() == ["ffn", "gpt", "hf_causal_lm", "hf_gpt2", "hf_llama", "hf_masked_lm", "mlp"]


@pytest.mark.parametrize("name", ["ffn", "mlp", "gpt"])
def test_model_config_composes_and_builds(name):
    setup = prepare(compose_config(f"+model={name}"))
    assert setup.wrapped, "every built-in model has recompute targets"
    first_line = (conf_dir() / "model" / f"{name}.yaml").read_text().splitlines()[1]
    assert first_line == f"# python -m reportgen +model={name}"


def test_ffn_is_the_tutorial_block():
    setup = prepare(compose_config("+model=ffn"))
    model = setup.build(recompute=False)
    layers = [type(m).__name__ for m in model[0].net]
    assert layers == ["Linear", "ReLU", "Dropout", "Linear"]
    assert (model[0].net[0].in_features, model[0].net[0].out_features, model[0].net[2].p) == (12, 24, 0.2)
    assert tuple(setup.batch[0].shape) == (3, 12)
    assert (setup.config.seed, setup.config.forward_seed) == (47, 71)


def test_gpt_uses_python_docs_text_and_mlp_uses_digits():
    gpt = prepare(compose_config("+model=gpt"))
    assert gpt.task.vocab_size > 90 and len(gpt.task.train) > 400_000
    mlp = prepare(compose_config("+model=mlp"))
    assert len(mlp.task.x_train) + len(mlp.task.x_val) == 1797


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant", "selective"])
def test_recompute_modes_compose(mode):
    cfg = compose_config("+model=mlp", f"recompute={mode}")
    assert cfg.recompute.mode.value == mode and list(cfg.recompute.targets) == ["ResidualMLPBlock"]


@pytest.mark.parametrize("override", ["parity.rtlo=1e-3", "recompute.mode=reentrnt", "timing.measured_steps=many"])
def test_schema_typos_fail_before_any_model_is_built(override):
    with pytest.raises((ConfigCompositionException, ConfigKeyError, ValidationError)):
        compose_config("+model=ffn", override)


@pytest.mark.parametrize(
    "override,named",
    [
        ("parity.batch_size=0", "parity.batch_size"),
        ("budget.examples=-5", "budget.examples"),
        ("timing.measured_steps=0", "timing.measured_steps"),
        ("budget.seeds=[]", "budget.seeds"),
    ],
)
def test_out_of_range_settings_stop_before_any_model_work(override, named):
    """The one validator (run by the CLI before any model is built; ``build_setup`` only builds) names each."""
    from reportgen.commands.validation import config_problems

    assert named in config_problems(compose_config("+model=ffn", override))


def test_a_typo_added_with_plus_is_refused_not_recorded_and_ignored():
    """Hydra's own hint for an unknown key is `+key=value`, which adds it where nothing reads it."""
    from conftest import compose_config

    from reportgen.commands.validation import config_problems

    problems = config_problems(compose_config("+model=ffn", "+parity.rtlo=1e-5", "+timing.enabeld=false"))
    assert "parity.rtlo is not a setting (did you mean parity.rtol?)" in problems
    assert "timing.enabeld is not a setting (did you mean timing.enabled?)" in problems
    assert config_problems(compose_config("+model=ffn")) == ""


@pytest.mark.parametrize(
    "override, says",
    [
        ("parity.rtlo=1e-5", "parity.rtlo is not a setting (did you mean parity.rtol?)"),
        ("recompute.mod=x", "recompute.mod is not a setting (did you mean recompute.mode?)"),
        ("distributed.ddp.static_grap=true", "distributed.ddp.static_grap is not a setting (did you mean "),
        ("dtpye=float64", "dtpye is not a setting (did you mean dtype?)"),
    ],
)
def test_a_typo_without_plus_is_one_line_naming_the_setting_meant(tmp_path, monkeypatch, capsys, override, says):
    """Without `+`, Hydra would print its own multi-line block; reportgen answers first, exit 2, and
    the Hydra app (which would write the run folder) never starts."""
    from reportgen.commands.cli import exit_code
    from reportgen.errors import ExitCode

    monkeypatch.chdir(tmp_path)
    started = []
    code = exit_code(lambda: started.append(1), ["+model=ffn", "report.sign=false", override])
    out = capsys.readouterr().out
    assert code == ExitCode.USAGE and not started and list(tmp_path.iterdir()) == []
    assert out.count("\n") == 1 and out.startswith("reportgen: cannot start: ") and says in out


@pytest.mark.parametrize(
    "argv",
    [
        ["+model=ffn", "parity.rtol=1e-5", "recompute=selective", "distributed.ddp.static_graph=true"],
        ["+model=ffn", "+parity.rtlo=1e-5"],  # added on purpose: refused after composing, with the same words
        ["+model=ffn", "model.width=8", "task.batch_size=4", "hydra.run.dir=x", "hydra/launcher=basic"],
        ["-m", "+model=ffn", "parity.rtol=1e-5,1e-6", "--config-dir", "elsewhere", "no_such_group=3"],
        ["+model=ffn", "parity.rtol=(", "--cfg", "job"],  # unparsable: Hydra reports it
    ],
)
def test_known_settings_and_other_overrides_are_left_to_hydra(argv):
    from reportgen.commands.overrides import argv_problems

    assert argv_problems(argv) == ""


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["--no-such-option", "+model=ffn"]])
def test_reading_the_command_line_first_prints_nothing(argv, capsys):
    """Hydra answers --version itself; reading the line before it must not answer it a second time."""
    from reportgen.commands.overrides import argv_problems

    assert argv_problems(argv) == "" and capsys.readouterr() == ("", "")


@pytest.mark.hf
def test_a_config_naming_a_moved_module_gets_one_line_naming_the_new_target(tmp_path):
    from conftest import reportgen

    pytest.importorskip("transformers")
    proc = reportgen(
        tmp_path,
        "+model=hf_causal_lm",
        "model._target_=reportgen.hf_auto.causal_lm",
        "recompute.enable=reportgen.hf.enable",
        "model.config=x",
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "model._target_=reportgen.hf_auto.causal_lm names a module that moved: use " in out
    assert "model._target_=reportgen.models.hf.auto.causal_lm" in out
    assert "recompute.enable=reportgen.models.hf.enable" in out and "Traceback" not in out
