"""Provenance that reruns: the rerun command carries PYTHONPATH and --config-dir, and the signed
statement records the user's source digests and whether their git repositories were dirty."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REQUIRED, SMALL, compose_config, small_setup, tiny_frame

from reportgen.report.metadata import rerun_command, run_metadata
from reportgen.trust.sources import git_repositories, user_source_files


def test_rerun_command_carries_pythonpath_and_config_dir_relative_to_the_working_folder(tmp_path):
    cwd = tmp_path / "work"
    argv = ["reportgen/__main__.py", "--config-dir", str(cwd / "proj" / "conf"), "+model=mine", "seed=1"]
    command = rerun_command(argv, {"PYTHONPATH": f"{cwd / 'proj'}:/opt/lib"}, cwd)
    assert command == "PYTHONPATH=proj:/opt/lib python -m reportgen --config-dir proj/conf +model=mine seed=1"
    assert rerun_command(["m", "-cd=conf", "+model=x"], {}, cwd) == "python -m reportgen --config-dir conf +model=x"
    assert rerun_command(["m", "+model=ffn"], {"PYTHONPATH": ""}, cwd) == "python -m reportgen +model=ffn"
    outside = rerun_command(["m", "--config-dir", "/srv/conf", "+model=x"], {"PYTHONPATH": "/srv/code"}, cwd)
    assert outside == "PYTHONPATH=/srv/code python -m reportgen --config-dir /srv/conf +model=x"


def test_a_sweep_jobs_rerun_command_is_that_job_alone():
    argv = [
        "m",
        "-m",
        "--config-dir",
        "conf",
        "+model=mlp",
        "recompute=non_reentrant,reentrant",
        "hydra.searchpath=[file://extra]",
        "hydra/launcher=parallel",
    ]
    job = rerun_command(argv, {}, Path.cwd(), job_overrides=["+model=mlp", "recompute=reentrant"])
    assert (
        job == "python -m reportgen --config-dir conf 'hydra.searchpath=[file://extra]' +model=mlp recompute=reentrant"
    )
    assert rerun_command(argv, {}, Path.cwd()).startswith("python -m reportgen --config-dir conf -m +model=mlp")


def _git(folder: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        check=True,
        capture_output=True,
        timeout=30,
    )


@pytest.fixture
def user_repo(tmp_path, monkeypatch):
    """A git repository holding a namespace package ``provpkg`` (no __init__.py) with the model,
    committed clean; on ``sys.path``."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    from training.test_cache import BLOCK  # tests/ is on sys.path (pyproject pythonpath): works run alone too

    repo = tmp_path / "repo"
    (repo / "provpkg").mkdir(parents=True)
    (repo / "provpkg" / "blocks.py").write_text(BLOCK.format(import_line="", activation="nn.GELU()"))
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "model")
    monkeypatch.syspath_prepend(str(repo))
    yield repo
    for name in [m for m in sys.modules if m.split(".")[0] == "provpkg"]:
        del sys.modules[name]


def test_git_repositories_report_dirty_trees_and_tolerate_no_git(user_repo, tmp_path, monkeypatch):
    module = user_repo / "provpkg" / "blocks.py"
    loose = tmp_path / "loose.py"
    loose.write_text("")
    clean, outside = git_repositories([module, loose])
    assert clean["repository"] == str(user_repo.resolve()) and clean["dirty"] is False and len(clean["commit"]) == 40
    assert outside == {"repository": None, "commit": None, "dirty": None, "files": 1}
    module.write_text(module.read_text() + "# edited\n")
    assert git_repositories([module])[0]["dirty"] is True
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    assert git_repositories([module]) == [{"repository": None, "commit": None, "dirty": None, "files": 1}]


def test_the_signed_statement_records_user_source_digests_and_the_dirty_flag(user_repo, tmp_path):
    from reportgen.files import sha256_file
    from reportgen.report.render import render_html
    from reportgen.trust.statement import claim_predicate

    overrides = ("+model=ffn", "model._target_=provpkg.blocks.build")
    setup = small_setup(*overrides)
    module = (user_repo / "provpkg" / "blocks.py").resolve()
    assert module in user_source_files()  # a namespace package, found from sys.modules
    (user_repo / "notes.txt").write_text("uncommitted\n")  # the tree is now dirty
    meta = run_metadata(compose_config(*SMALL, *overrides), setup, tmp_path)
    predicate = claim_predicate(tiny_frame(), meta, "PASS", REQUIRED)
    sources = predicate["environment"]["user_sources"]
    assert sources[str(module)] == sha256_file(module)  # outside the working folder: absolute
    (repo,) = [r for r in predicate["environment"]["user_repositories"] if r["repository"] == str(user_repo.resolve())]
    assert repo["dirty"] is True and repo["files"] == 1
    assert len(predicate["environment"]["reportgen_sources_sha256"]) == 64
    html = render_html(tiny_frame(), meta, "PASS", REQUIRED)
    assert "DIRTY" in html and "Rerun with" in html and "reportgen's repository" in html
    shown = list(sources)[:20]  # page 1 lists the first 20 user sources (other tests' modules may come first)
    assert (str(module) in html) == (str(module) in shown)
    assert len(sources) <= 20 or f"and {len(sources) - 20} more (every digest is in the signed statement)" in html


def test_reportgen_is_hashed_whole_and_never_listed_as_the_users_source(monkeypatch):
    """reportgen's own files are one digest (``reportgen_sources_sha256``), not "your source files": the
    package folder was once taken as trust/, which listed ~100 of reportgen's files as the user's and
    hashed only trust/ as reportgen's own."""
    import reportgen
    import reportgen.commands.run  # every check module is loaded, as in a run
    from reportgen.trust import sources

    package = Path(reportgen.__file__).resolve().parent
    assert not [p for p in sources.user_source_files() if p.is_relative_to(package)]
    hashed = []
    monkeypatch.setattr(sources, "sha256_file", lambda f: hashed.append(Path(f)) or "0" * 64)
    sources.reportgen_sources_sha256()
    assert package / "checks" / "parity" / "gradient.py" in hashed and package / "commands" / "run.py" in hashed
