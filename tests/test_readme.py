"""The README's and every docs/ guide's examples run as written.

Every fenced and inline example is found by reading the Markdown, so an example added to a guide
is tested without touching this file:

- the worked user model (files labelled `` `my_project/...`: ``) is written out and passes parity;
- every ``python -m reportgen ...`` command (fenced or inline, one per job of a multirun sweep) is
  composed with its overrides and validated, as a run does before anything is built: a renamed
  setting, a removed choice or a bad value fails here (commands with placeholders such as
  ``PATH`` or ``<date>`` are left out, they are not runnable as written);
- the other commands (``reportgen.verify``, ``compare``, ``keys``, ``sweep``, ``plan``) are parsed
  by their own parsers: every option used in the docs exists;
- Python snippets execute; YAML blocks parse, and the Hugging Face block equals the shipped configs;
- the two commands of the README ("Run it", "Test it") stay the ones .ci/run runs.

Nothing here trains a model but the user-model parity example (a second); runs that need a GPU or
a cluster are composed, never launched.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import re
import runpy
import shlex
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from conftest import SMALL, TESTS, run_cli
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from reportgen.checks.base.run import Run
from reportgen.checks.parity.gradient import gradient_parity
from reportgen.commands.run import prepare
from reportgen.commands.validation import config_problems
from reportgen.config import register_configs
from reportgen.paths import conf_dir
from reportgen.results import check_summary, to_frame

REPO = TESTS.parent
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    path: Path
    line: int  #: 1-based line of the opening fence
    lang: str
    text: str
    label: str  #: the file name of a block introduced by a line "`name`:", else ""

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced code block of ``path``, in order."""
    text = path.read_text()
    found = []
    for m in re.finditer(r"(?ms)^```(\w*)\n(.*?)^```", text):
        before = text[: m.start()].rstrip().splitlines()
        label = re.fullmatch(r"`([^`]+)`:", before[-1].strip()) if before else None
        found.append(
            Block(path, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2), label.group(1) if label else "")
        )
    return found


def doc_file(doc: str, name: str) -> str:
    """The code block of ``doc`` (relative to the repository) labelled with file ``name``."""
    matches = [b.text for b in blocks(REPO / doc) if b.label == name]
    assert len(matches) == 1, f"{doc} has {len(matches)} code blocks for {name}"
    return matches[0]


# --------------------------------------------------------------------------- commands


#: A placeholder the reader replaces (`PATH`, `SWEEP_DIR`, `<date>`, `...`): not runnable as written.
PLACEHOLDER = re.compile(r"(^|[=/,])[A-Z][A-Z_]+($|[/,])|<\w+>|\.\.\.|\[")


@dataclass(frozen=True)
class Command:
    """One ``python -m reportgen[.X] ...`` command of the docs."""

    where: str
    module: str
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: python -m {self.module} {shlex.join(self.args)}"


def _command(where: str, words: list[str]) -> Command | None:
    """The reportgen command in one shell command's words (env assignments, venv path, torchrun dropped)."""
    words = [w.strip("()") for w in words]
    while words and re.fullmatch(r"\w+=\S*", words[0]):  # PYTHONPATH=... before the command
        words.pop(0)
    if not words or "-m" not in words:
        return None
    if Path(words[0]).name not in ("python", "python3", "python3.11", "torchrun"):
        return None
    i = words.index("-m")
    module = words[i + 1] if i + 1 < len(words) else ""
    if not re.fullmatch(r"reportgen(\.\w+)*", module):
        return None
    return Command(where, module, tuple(words[i + 2 :]))


def _shell_lines(text: str) -> list[str]:
    lines = text.replace("\\\n", " ").splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def doc_commands() -> list[Command]:
    """Every reportgen command in the docs: fenced ``bash`` blocks and inline code spans."""
    found = []
    for path in DOC_FILES:
        for block in blocks(path):
            if block.lang != "bash":
                continue
            for line in _shell_lines(block.text):
                for part in " ".join(shlex.split(line, comments=True)).split(" && "):
                    cmd = _command(str(block), part.split(" "))
                    if cmd:
                        found.append(cmd)
        prose = re.sub(r"(?ms)^```.*?^```", "", path.read_text())
        for span in re.findall(r"`([^`\n]*python -m reportgen[^`\n]*)`", prose):
            with contextlib.suppress(ValueError):
                cmd = _command(f"{path.relative_to(REPO)} (inline)", shlex.split(span))
                if cmd:
                    found.append(cmd)
    return found


def _unique(commands: list[Command]) -> list[Command]:
    """The first place each command appears (the README and a guide often give the same one)."""
    seen, out = set(), []
    for c in commands:
        if (c.module, c.args) not in seen:
            seen.add((c.module, c.args))
            out.append(c)
    return out


COMMANDS = _unique(doc_commands())
RUNS = [
    c
    for c in COMMANDS
    if c.module == "reportgen" and not any(PLACEHOLDER.search(a) for a in c.args) and "--help" not in c.args and c.args
]


def jobs(cmd: Command) -> tuple[list[list[str]], Path | None]:
    """The override lists Hydra would compose for ``cmd`` (one per job of a ``-m`` sweep), and its ``--config-dir``."""
    args, config_dir, overrides = list(cmd.args), None, []
    while args:
        word = args.pop(0)
        if word in ("-m", "--multirun"):
            continue
        if word == "--cfg":
            args.pop(0)
        elif word == "--config-dir":
            config_dir = Path(args.pop(0))
        else:
            overrides.append(word)
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in parsed
    ]
    return [list(job) for job in itertools.product(*choices)], config_dir


def test_the_docs_have_commands():
    """The collector sees the guides' commands (a Markdown change that hides them fails here)."""
    assert len(RUNS) >= 25 and {c.module for c in COMMANDS} >= {
        "reportgen",
        "reportgen.verify",
        "reportgen.compare",
        "reportgen.keys",
        "reportgen.plan",
        "reportgen.sweep",
    }


@pytest.fixture
def user_project(tmp_path, monkeypatch) -> Path:
    """The worked example of docs/own-model.md written out as ``my_project/`` in the working folder, and the guide's
    ``my_pkg`` wrap functions (docs/distributed_wrapping.md) beside it."""
    project = tmp_path / "my_project"
    (project / "conf" / "model").mkdir(parents=True)
    (project / "my_model.py").write_text(doc_file("docs/own-model.md", "my_project/my_model.py"))
    mine = doc_file("docs/own-model.md", "my_project/conf/model/mine.yaml")
    (project / "conf" / "model" / "mine.yaml").write_text(mine)
    package = tmp_path / "my_pkg"  # the wrap functions of docs/distributed_wrapping.md, which validation imports
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("my_pkg/wrap.py", "my_pkg/parallel.py"):
        (tmp_path / name).write_text(doc_file("docs/distributed_wrapping.md", name))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield project
    for module in ("my_model", "my_pkg", "my_pkg.wrap", "my_pkg.parallel"):
        sys.modules.pop(module, None)


CLUSTER_EXTRA = 'launchers need the cluster extra: pip install -e ".[cluster]"'


@pytest.mark.parametrize("cmd", RUNS, ids=str)
def test_documented_run_composes_and_validates(cmd, user_project):
    """Each job of the command composes (schemas, config groups, launchers) and passes validation."""
    if any(o.startswith("hydra/launcher=") for o in cmd.args):
        for plugin in ("hydra_submitit_launcher", "hydra_joblib_launcher"):
            pytest.importorskip(f"hydra_plugins.{plugin}", reason=CLUSTER_EXTRA)
    register_configs()
    runs, config_dir = jobs(cmd)
    search = [f"hydra.searchpath=[file://{config_dir.resolve()}]"] if config_dir else []
    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir())):
        for overrides in runs:
            if tuple(search + overrides) not in _COMPOSED:
                cfg = compose("config", overrides=search + overrides, return_hydra_config=True)
                _COMPOSED[tuple(search + overrides)] = "no model" if cfg.model is None else config_problems(cfg)
            assert _COMPOSED[tuple(search + overrides)] == "", f"{cmd} ({overrides})"


#: ``{overrides: problems}`` of the jobs composed so far (sweeps share jobs with single runs).
_COMPOSED: dict[tuple[str, ...], str] = {}


def documented_outcomes() -> list[tuple[Command, int]]:
    """Commands of fenced blocks whose comment promises an exit code (``# exits 1: ...``)."""
    found = []
    for path in DOC_FILES:
        for block in blocks(path):
            for line in _shell_lines(block.text) if block.lang == "bash" else []:
                promise = re.search(r"#\s*exits (\d+)", line)
                cmd = _command(str(block), shlex.split(line, comments=True)) if promise else None
                if cmd:
                    found.append((cmd, int(promise.group(1))))
    return found


@pytest.mark.slow
@pytest.mark.parametrize(("cmd", "code"), documented_outcomes(), ids=str)
def test_documented_outcome_is_the_exit_code(cmd, code, tmp_path):
    """The command ends as its comment says, run for real (the checks cut to seconds, unsigned)."""
    assert cmd.module == "reportgen"
    done = run_cli(tmp_path, *cmd.args, *SMALL)
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]


#: The subcommands each command has; the docs may only use these.
SUBCOMMANDS = {"reportgen.keys": {"generate", "fingerprint"}, "reportgen.sweep": {"summarize"}}


def _help(module: str, sub: str | None) -> str:
    """What ``python -m MODULE [SUB] --help`` prints (run in this process)."""
    out = io.StringIO()
    argv = [module, *([sub] if sub else []), "--help"]
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is already imported
        old, sys.argv = sys.argv, argv
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=False)
        finally:
            sys.argv = old
    assert stop.value.code == 0, f"python -m {module} {sub or ''} --help exited {stop.value.code}"
    return out.getvalue()


TOOLS = [c for c in COMMANDS if c.module not in ("reportgen", "reportgen.plan", "reportgen.commands.reference")]


@pytest.mark.parametrize("cmd", TOOLS, ids=str)
def test_documented_tool_options_exist(cmd):
    """Every subcommand and ``--option`` a guide gives to verify, compare, keys or sweep exists."""
    args = [a for a in cmd.args if not PLACEHOLDER.fullmatch(a)]
    sub = None
    if cmd.module in SUBCOMMANDS and args:
        sub = args[0]
        assert sub in SUBCOMMANDS[cmd.module], f"{cmd}: no subcommand {sub!r}"
    text = _help(cmd.module, sub)
    options = {a.partition("=")[0] for a in args if a.startswith("--")}
    assert {o for o in options if o not in text} == set(), f"{cmd}: options not in --help"


PLANS = [
    c for c in COMMANDS if c.module == "reportgen.plan" and c.args and not any(PLACEHOLDER.search(a) for a in c.args)
]


@pytest.mark.parametrize("cmd", PLANS, ids=str)
def test_documented_plan_arguments_parse(cmd, monkeypatch):
    """The planner accepts the documented words and finds the shipped config (nothing is counted)."""
    from reportgen.plan import parse_args

    monkeypatch.chdir(REPO)
    args = parse_args(list(cmd.args))
    assert args.config.is_file() and args.seq > 0


# --------------------------------------------------------------------------- the two commands


def _readme_command(section: str) -> str:
    text = (REPO / "README.md").read_text()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```bash\n(.*?)\n```", body, re.S).group(1)


def test_readme_test_command_is_what_ci_runs():
    """.ci/run runs "Test it" verbatim but for the interpreter name."""
    command = _readme_command("Test it")
    assert command.startswith("python3.11 -m venv .venv && ")
    assert command.replace("python3.11", "$PY", 1) in (REPO / ".ci" / "run").read_text()


def test_readme_run_command_installs_keys_and_reports():
    """ "Run it" stays one line: install torch, then reportgen, make the key once, report on ffn."""
    command = _readme_command("Run it (fresh Linux machine, Python 3.11, no GPU needed)")
    assert "\n" not in command and command.startswith("python3.11 -m venv .venv && .venv/bin/pip install torch==")
    assert command.endswith(".venv/bin/python -m reportgen +model=ffn") and "reportgen.keys generate" in command


# --------------------------------------------------------------------------- Python and YAML blocks


def test_readme_user_model_example_composes_and_passes_parity(user_project):
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir())):
        cfg = compose("config", overrides=[f"hydra.searchpath=[file://{user_project / 'conf'}]", "+model=mine"])
    setup = prepare(cfg)
    assert [w.path for w in setup.wrapped] == ["0", "1", "2", "3"]
    summary = check_summary(to_frame(gradient_parity(Run(setup))), [])
    assert summary.status.tolist() == ["PASS"]


SNIPPETS = [b for path in DOC_FILES for b in blocks(path) if b.lang == "python" and not b.label]


@pytest.mark.parametrize("block", SNIPPETS, ids=str)
def test_python_snippet_runs(block):
    """A snippet runs; one that defines a task's ``make_batch`` and ``loss`` keeps the task contract:
    the same generator seed gives the same batch, and the loss is a scalar."""
    space: dict = {}
    exec(compile(block.text, str(block), "exec"), space)  # the docs' own example
    if {"make_batch", "loss"} <= space.keys():
        (a, ta), (b, tb) = (space["make_batch"](torch.Generator().manual_seed(3), 4) for _ in range(2))
        assert torch.equal(ta, tb) and all(torch.equal(a[k], b[k]) for k in a)
        logits = torch.randn(*ta.shape, int(ta.max()) + 1)
        loss = space["loss"]({"logits": logits}, ta)
        assert loss.dim() == 0 and loss.dtype.is_floating_point


YAMLS = [b for path in DOC_FILES for b in blocks(path) if b.lang == "yaml"]


@pytest.mark.parametrize("block", YAMLS, ids=str)
def test_yaml_block_parses(block):
    assert isinstance(yaml.safe_load(block.text), (dict, type(None)))


def _leaves(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*prefix, key))
    else:
        yield prefix, node


def test_huggingface_yaml_block_is_what_the_shipped_configs_set():
    """docs/huggingface.md's "What the four configs set" block holds for every shipped HF config."""
    block = next(b for b in blocks(REPO / "docs" / "huggingface.md") if b.lang == "yaml" and "model_switch" in b.text)
    documented = yaml.safe_load(block.text)
    for name in ("hf_gpt2", "hf_llama", "hf_causal_lm", "hf_masked_lm"):
        shipped = yaml.safe_load((conf_dir() / "model" / f"{name}.yaml").read_text())
        for path, value in _leaves(documented):
            node = shipped
            for key in path:
                node = node[key]
            assert node == value, f"conf/model/{name}.yaml: {'.'.join(path)} is {node!r}, the guide says {value!r}"
