"""Bad command lines are refused in one line naming the setting, the value and the fix; exit 2,
nothing written (the console a user sees, not Hydra's multi-line blocks)."""

import pytest
from conftest import compose_config, reportgen
from omegaconf import OmegaConf

from reportgen.commands.validation import config_problems, top_level_problems


@pytest.mark.parametrize(
    "override, says",
    [
        ("+dtpye=float32", "dtpye is not a setting (did you mean dtype?)"),
        ("++dtpye=float32", "dtpye is not a setting (did you mean dtype?)"),
        ("+seeed=3", "seeed is not a setting (did you mean seed?)"),
        ("+foo.bar=1", "foo is not a setting; the settings are model, task, recompute, seed,"),
    ],
)
def test_an_unknown_top_level_setting_added_with_plus_is_refused(override, says):
    problems = config_problems(compose_config("+model=ffn", override))
    assert says in problems and problems.count("is not a setting") == 1


def test_known_settings_and_chosen_groups_are_not_refused():
    assert config_problems(compose_config("+model=ffn", "++seed=3", "claim=mlp_release", "++parity.rtol=1e-5")) == ""
    cfg = OmegaConf.create({"seed": 1, "mygroup": {"a": 1}, "hydra": {"runtime": {"choices": {"mygroup": "x"}}}})
    assert top_level_problems(cfg) == []  # a user's own group, chosen with +mygroup=x
    assert top_level_problems(OmegaConf.create({"seed": 1, "mygroup": {"a": 1}}))[0].startswith("mygroup is not")


def test_a_top_level_typo_with_plus_exits_2_in_one_line_and_writes_nothing(tmp_path):
    proc = reportgen(tmp_path, "+model=ffn", "+dtpye=float32")
    assert proc.returncode == 2 and list(tmp_path.iterdir()) == []
    assert proc.stdout.count("\n") == 1 and proc.stderr == ""
    assert proc.stdout.startswith("reportgen: cannot start: dtpye is not a setting (did you mean dtype?)")


@pytest.mark.parametrize(
    "override, says",
    [
        ("parity.rtol=abc", "parity.rtol='abc' is not a float (or null)"),
        ("recompute.mode=banana", "recompute.mode='banana' must be one of non_reentrant, reentrant, selective, null"),
        ("report.sign=flase", "report.sign='flase' is not true or false"),
        ("parity.batch_size=1.5", "parity.batch_size=1.5 is not an integer"),
        ("distributed.strategy=fsdp3", "distributed.strategy='fsdp3' must be one of ddp, fsdp2, fsdp1, custom"),
        (
            "recompute=selectiv",
            "recompute=selectiv: no such recompute option (did you mean selective?); recompute options: "
            "model_default, non_reentrant, reentrant, selective",
        ),
        ("~seed", "~seed removes a required setting; reportgen reads every setting of reportgen/config.py, so set it"),
        ("~parity.rtol", "~parity.rtol removes a required setting"),
    ],
)
def test_a_wrong_value_or_a_removed_setting_is_one_line_naming_what_it_accepts(
    tmp_path, monkeypatch, capsys, override, says
):
    """Hydra would print a multi-line block (or, for ~seed, start and fail building the model);
    reportgen answers first, exit 2, and the Hydra app (which would write the run folder) never starts."""
    from reportgen.commands.cli import exit_code
    from reportgen.errors import ExitCode

    monkeypatch.chdir(tmp_path)
    started = []
    code = exit_code(lambda: started.append(1), ["+model=ffn", override])
    out = capsys.readouterr().out
    assert code == ExitCode.USAGE and not started and list(tmp_path.iterdir()) == []
    assert out.count("\n") == 1 and out == f"reportgen: cannot start: {out.split(': ', 2)[2]}" and says in out


def test_an_unknown_model_names_the_one_meant_and_the_models_of_every_config_dir():
    from conftest import USER_CONF

    from reportgen.commands.overrides import argv_problems

    assert argv_problems(["+model=fnn"]) == (
        "+model=fnn: no such model (did you mean ffn?); models: ffn, gpt, hf_causal_lm, hf_gpt2, hf_llama, "
        "hf_masked_lm, mlp"
    )
    user_model = next(p.stem for p in (USER_CONF / "model").glob("*.yaml"))
    for argv in (["--config-dir", str(USER_CONF)], [f"hydra.searchpath=[file://{USER_CONF}]"]):
        assert argv_problems([*argv, f"+model={user_model}"]) == ""
        assert f"models: {', '.join(sorted(['ffn', 'gpt', 'mlp']))}" not in argv_problems([*argv, "+model=zzz"])
        assert user_model in argv_problems([*argv, "+model=zzz"])


@pytest.mark.parametrize(
    "argv",
    [
        ["parity.rtol=1e-5", "report.sign=false", "recompute.mode=reentrant", "forward_seed=null", "seed=3"],
        ["parity.rtol=${parity.atol}", "recompute.mode=null", "distributed.ddp.bucket_cap_mb=5", "claim=gpt_release"],
        ["~model.width", "~recompute", "parity.optimizer.lr=1", "memory.estimate={a:1}", "threads=4"],
        ["parity.rtol=1e-5,2e-5", "seed=range(0,3)", "recompute=glob(*)"],  # sweeps of values the schema accepts
        ["parity.rtol='1e-5','2e-5'", 'seed="1",2', "recompute.mode='reentrant','non_reentrant'"],  # quoted items
    ],
)
def test_values_the_schema_accepts_are_not_refused(argv):
    from reportgen.commands.overrides import argv_problems

    assert argv_problems(["+model=ffn", *argv]) == ""


def test_a_sweep_with_a_top_level_typo_is_refused_before_any_job_folder(tmp_path):
    proc = reportgen(tmp_path, "-m", "+model=ffn", "+dtpye=float32", "seed=1,2")
    assert proc.returncode == 2 and list(tmp_path.iterdir()) == []
    assert (
        proc.stdout == "reportgen: cannot start: dtpye is not a setting (did you mean dtype?); settings and their "
        "types: reportgen/config.py.\n"
    )


def test_each_swept_value_is_judged_before_any_job_starts(tmp_path):
    """``parity.rtol=abc,1e-5`` used to start the sweep and fail in Hydra's own words; each value of a
    list sweep is now judged as if set alone, and ranges/globs are left to Hydra."""
    from reportgen.commands.overrides import argv_problems

    assert argv_problems(["+model=ffn", "parity.rtol=1e-5,abc"]) == "parity.rtol='abc' is not a float (or null)"
    assert argv_problems(["+model=ffn", "parity.rtol=choice(1e-5,abc)"]) == "parity.rtol='abc' is not a float (or null)"
    assert argv_problems(["+model=ffn,fnn"]).startswith("+model=fnn: no such model (did you mean ffn?)")
    assert argv_problems(["+model='ffn','fnn'"]).startswith("+model=fnn: no such model (did you mean ffn?)")
    assert argv_problems(["+model=ffn", "parity.rtlo=range(1,3)"]).startswith("parity.rtlo is not a setting")
    proc = reportgen(tmp_path, "-m", "+model=ffn", "parity.rtol=abc,1e-5")
    assert proc.returncode == 2 and list(tmp_path.iterdir()) == []
    assert proc.stdout == "reportgen: cannot start: parity.rtol='abc' is not a float (or null)\n"
