"""The README's worked example of a user model runs as written (it lives outside the package)."""
import re
import sys

from hydra import compose, initialize_config_dir

from reportgen.checks.parity import gradient_parity
from reportgen.config import register_configs
from reportgen.paths import conf_dir
from reportgen.results import check_summary, to_frame
from reportgen.run import prepare

from conftest import TESTS


def readme_file(name: str) -> str:
    text = (TESTS.parent / "README.md").read_text()
    match = re.search(rf"`{re.escape(name)}`:\n\n```\w+\n(.*?)```", text, re.S)
    assert match, f"README has no code block for {name}"
    return match.group(1)


def test_readme_user_model_example_composes_and_passes_parity(tmp_path, monkeypatch):
    project = tmp_path / "my_project"
    (project / "conf" / "model").mkdir(parents=True)
    (project / "my_model.py").write_text(readme_file("my_project/my_model.py"))
    (project / "conf" / "model" / "mine.yaml").write_text(readme_file("my_project/conf/model/mine.yaml"))
    monkeypatch.syspath_prepend(str(project))
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir())):
        cfg = compose("config", overrides=[f"hydra.searchpath=[file://{project / 'conf'}]", "+model=mine"])
    setup = prepare(cfg)
    assert [w.path for w in setup.wrapped] == ["0", "1", "2", "3"]
    summary = check_summary(to_frame(gradient_parity(setup)), [])
    assert summary.status.tolist() == ["PASS"]
    sys.modules.pop("my_model", None)
