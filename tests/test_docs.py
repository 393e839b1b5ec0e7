"""The documentation cannot drift from the code: the configuration reference is regenerated from
the schemas, the one exit-code table is checked against ``ExitCode``, every relative link and
anchor leads somewhere, and the README stays a first page. (The examples run in test_readme.py.)"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

from conftest import TESTS

from reportgen import config
from reportgen.commands.reference import REFERENCE, field_docs, main, reference
from reportgen.errors import ExitCode

REPO = TESTS.parent
DOCS = REPO / "docs"
MARKDOWN = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]

#: Guides other branches of issue 25 add; a link to one is allowed before it lands here.
EXPECTED_ELSEWHERE = {DOCS / "plan.md"}


def _prose(path: Path) -> str:
    """The Markdown of ``path`` without its fenced code blocks."""
    return re.sub(r"(?ms)^```.*?^```", "", path.read_text())


def test_configuration_reference_is_in_sync_with_the_schemas():
    """docs/configuration.md is what ``python -m reportgen.commands.reference --write`` writes today."""
    assert REFERENCE == DOCS / "configuration.md"
    assert REFERENCE.read_text() == reference(), (
        "docs/configuration.md is out of date: run python -m reportgen.commands.reference --write"
    )


def _groups(cls: type = config.Config, prefix: str = "") -> list[tuple[str, type]]:
    """``(dotted prefix, dataclass)`` of the top level and of every group, nested ones included."""
    hints = typing.get_type_hints(cls)
    found = [(prefix, cls)]
    for f in dataclasses.fields(cls):
        if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name]):
            found += _groups(hints[f.name], f"{prefix}{f.name}.")
    return found


def test_reference_lists_every_field_with_its_default_and_doc():
    """Every field of every group has a row with its default, and a doc comment (STYLE.md 4)."""
    text = reference()
    undocumented = []
    for prefix, cls in _groups():
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(typing.get_type_hints(cls)[f.name]):
                assert re.search(rf"^#+ {re.escape(prefix + f.name)}$", text, re.M), prefix + f.name
                continue
            assert re.search(rf"^\| `{re.escape(prefix + f.name)}` \|", text, re.M), prefix + f.name
            if not docs.get(f.name):
                undocumented.append(prefix + f.name)
    assert undocumented == [], "give each field a #: comment in reportgen/config.py"
    assert "| `parity.rtol` | float or null | `null` |" in text
    assert "| `budget.seeds` | list of int | `[0, 1, 2]` |" in text
    assert "| `distributed.strategy` | one of `ddp`, `fsdp2`, `fsdp1`, `custom` | `ddp` |" in text


def test_reference_command_prints_what_it_writes(capsys):
    assert main([]) == 0 and capsys.readouterr().out == reference()
    assert main(["--bogus"]) == ExitCode.USAGE


def test_settings_guide_names_only_settings_that_exist():
    """Every dotted setting in the first column of docs/settings.md's table is a schema field."""
    known = {prefix + f.name for prefix, cls in _groups() for f in dataclasses.fields(cls)}
    rows = re.findall(r"(?m)^\| (`[^|]+`) \|", (DOCS / "settings.md").read_text())
    named = {name for cell in rows for name in re.findall(r"`([\w.]+)`", cell)} - {"setting"}
    assert len(named) > 30 and named - known == set()


# --------------------------------------------------------------------------- exit codes


def _exit_tables() -> dict[Path, list[list[str]]]:
    """Tables whose first column holds exit codes (a row starting ``| 0 |``), per file."""
    found = {}
    for path in MARKDOWN:
        for table in re.findall(r"(?m)(?:^\|.*\|\n)+", _prose(path)):
            rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.strip().splitlines()]
            if any(r[0] == "0" for r in rows) and any(r[0] == "2" for r in rows):
                found[path] = rows
    return found


def test_exit_code_table_is_the_enum_and_appears_once():
    tables = _exit_tables()
    assert list(tables) == [DOCS / "exit-codes.md"], "the exit-code table lives in docs/exit-codes.md only"
    rows = [r for r in tables[DOCS / "exit-codes.md"] if r[0].isdigit()]
    assert [(int(r[0]), r[1].strip("`")) for r in rows] == [(int(c), c.name) for c in ExitCode]
    assert all(r[2] and r[2] != "—" for r in rows), "every code has its meaning for a run"


# --------------------------------------------------------------------------- links and the README


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"(?m)^#+ (.+)$", _prose(path))}


def test_every_relative_link_and_anchor_exists():
    broken = []
    for path in MARKDOWN:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path)):
            if re.match(r"\w+://|mailto:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if dest in EXPECTED_ELSEWHERE:
                continue
            if not dest.exists() or (anchor and anchor not in _anchors(dest)):
                broken.append(f"{path.relative_to(REPO)}: {target}")
    assert broken == []


def test_readme_is_a_first_page_that_links_every_guide():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", readme))
    guides = {p.name for p in DOCS.glob("*.md")} - {"moves.md"}
    assert guides - linked == set(), "the README's 'Where to go next' lists every guide"


def test_no_code_or_message_points_at_a_readme_section():
    """Messages and docstrings name the guide that holds a topic, not a README section that moved."""
    stale = [
        f"{p.relative_to(REPO)}:{i}"
        for p in [*(REPO / "reportgen").rglob("*.py"), REPO / "conf" / "config.yaml"]
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"README[,\s]+[\"'(]", line)
    ]
    assert stale == []


def _current_docs() -> list[Path]:
    """The README and the guides; docs/moves.md names old modules on purpose."""
    return [p for p in MARKDOWN if p.name != "moves.md"]


def _resolves(dotted: str) -> bool:
    """Whether ``reportgen.a.b.C`` imports: the longest importable module, then attributes."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


def test_every_named_module_function_and_file_exists():
    """A guide that names ``reportgen.x.y`` or ``reportgen/x.py`` after a move names what is there now."""
    names = {
        (p.name, n)
        for p in _current_docs()
        for n in re.findall(r"(?<![\w./-])reportgen(?:\.[A-Za-z_]\w*)+", p.read_text())
    }
    files = {
        (p.name, f)
        for p in _current_docs()
        for f in re.findall(
            r"(?<![\w./-])(?:reportgen|tests|benchmarks|conf)/[\w./-]+\.(?:py|yaml|json|md)", p.read_text()
        )
    }
    assert len(names) > 20 and len(files) > 10
    assert sorted(n for n in names if not _resolves(n[1])) == []
    assert sorted(f for f in files if not (REPO / f[1]).exists()) == []
