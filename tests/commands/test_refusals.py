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
