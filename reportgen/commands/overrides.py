"""Unknown settings, named with the one they were probably meant to be, before Hydra composes.

A typo added with ``+`` (``+parity.rtlo=1e-5``) is refused after composing
(:func:`reportgen.commands.validation.unknown_setting_problems`); without ``+`` Hydra refuses it itself in a
multi-line block, so :func:`argv_problems` reads the command line first (with Hydra's own parsers) and says it
in one line, as it does a value the schema's type refuses, a config group option no config folder holds and a
setting removed with ``~``. Imports no torch: it runs before every start.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import functools
import io
from typing import Any

from omegaconf import DictConfig, OmegaConf, ValueNode
from omegaconf.errors import ValidationError
from omegaconf.nodes import BooleanNode, EnumNode, FloatNode, IntegerNode

from reportgen.config import Config
from reportgen.distributed.settings import unknown_problems
from reportgen.paths import conf_dir

#: Groups whose keys are the user's own (``_target_`` nodes), never checked.
FREE_FORM = ("model", "task")


def schema_groups() -> dict[str, list[str]]:
    """Each dataclass group of :class:`reportgen.config.Config` (``distributed`` too) and its settings."""
    factories = {group.name: group.default_factory for group in dataclasses.fields(Config)}
    return {
        name: [f.name for f in dataclasses.fields(factory())]
        for name, factory in factories.items()
        if factory is not dataclasses.MISSING
    }


def unknown_key_problem(group: str, key: str, known: list[str]) -> str:
    """``"parity.rtlo is not a setting (did you mean parity.rtol?); the parity settings are ..."``: the closest of
    ``known`` (the group's settings, in schema order; ``difflib``) when one is close."""
    near = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {group}.{near[0]}?)" if near else ""
    return f"{group}.{key} is not a setting{hint}; the {group} settings are {', '.join(known)} (docs/configuration.md)"


def dotted_key_problem(dotted: str) -> str:
    """The problem with one dotted setting name (``parity.rtlo``), or ``""`` when it is known or
    outside reportgen's schema (a top-level key, ``model.*``, ``task.*``, ``hydra.*``).

    ``distributed`` keys are judged by :func:`reportgen.distributed.settings.unknown_problems`
    (its nested groups); a top-level key by :func:`_top_level_problem`.
    """
    group, _, rest = dotted.partition(".")
    groups = schema_groups()
    if not rest and "/" not in group:
        return _top_level_problem(group)
    if not rest or group in FREE_FORM or group not in groups:
        return ""
    if group == "distributed":
        node: Any = None
        for part in reversed(rest.split(".")):  # the key as a nested mapping: {"ddp": {"static_grpah": None}}
            node = {part: node}
        return "; ".join(unknown_problems(node))
    key = rest.split(".", 1)[0]
    return "" if key in groups[group] else unknown_key_problem(group, key, groups[group])


def _top_level_problem(key: str) -> str:
    """A top-level key that is no setting of :class:`reportgen.config.Config` but close to one
    (``dtpye``); ``""`` otherwise: a key close to nothing may be a group of the user's config directory,
    so Hydra judges it."""
    known = top_level_settings()
    if key in known or not difflib.get_close_matches(key, known, n=1):
        return ""
    return added_key_problem(key, known)


def top_level_settings() -> list[str]:
    """The top-level settings of :class:`reportgen.config.Config` (``seed``, ``dtype``, the groups), in schema order."""
    return [f.name for f in dataclasses.fields(Config)]


def added_key_problem(key: str, known: list[str]) -> str:
    """``"dtpye is not a setting (did you mean dtype?); ..."`` for a top-level key that is no setting
    (added with ``+``/``++``, or changed without): the closest of ``known`` (``difflib``), else the list."""
    near = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {near[0]}?)" if near else f"; the settings are {', '.join(known)}"
    return f"{key} is not a setting{hint}; settings and their types: reportgen/config.py"


def argv_problems(argv: list[str]) -> str:
    """Every unknown setting changed without ``+`` on a ``python -m reportgen`` command line (``argv``: the
    arguments after the program name), joined by ``"; "`` (one line); ``""`` when none, or when Hydra's parsers
    refuse the line (Hydra then reports it itself)."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args, _ = get_args_parser().parse_known_args(argv)  # --version, a bad option: Hydra says it, once
        overrides = OverridesParser.create().parse_overrides(list(args.overrides or []))
    except (Exception, SystemExit):  # noqa: BLE001 - a line Hydra cannot read is Hydra's to report
        return ""
    problems = []
    repo = _repository(args, overrides)
    for override in overrides:
        problem = _override_problem(override, repo)
        if problem and problem not in problems:
            problems.append(problem)
    return "; ".join(problems)


def _override_problem(override: Any, repo: Any) -> str:
    """The problem with one parsed override (Hydra's ``Override``), or ``""``; ``repo`` is the
    run's config repository (:func:`_repository`), or None. A swept override (``parity.rtol=abc,1e-5``,
    ``+model=fnn,ffn``) has each of its values judged as if set alone, before any job starts."""
    key = override.key_or_group
    values = _values(override)
    if override.package:
        return ""
    if values is None:  # a range, interval or glob: Hydra judges its values, reportgen still its name
        return "" if override.is_add() or override.is_force_add() or key in _groups() else dotted_key_problem(key)
    if override.is_delete():
        return removed_setting_problem(key)
    if repo is not None and key in _groups():
        name = override.input_line.split("=", 1)[0]
        return _first(group_option_problem(f"{name}={value}", key, value, repo) for value in values)
    if not (override.is_add() or override.is_force_add()):
        problem = dotted_key_problem(key)  # `+key` is refused after composing (validation.unknown_setting_problems)
        if problem:
            return problem
    return _first(value_problem(key, value) for value in values)


def _values(override: Any) -> list | None:
    """The values an override sets: its one value, each element of a list sweep (``a,b`` or
    ``choice(a,b)``), or None for a range, interval or glob sweep (Hydra judges those)."""
    from hydra.core.override_parser.types import ChoiceSweep, Override

    if not override.is_sweep_override():
        return [override.value()]
    if not isinstance(override.value(), ChoiceSweep):
        return None
    # quoted items ('1e-5') as the plain strings Hydra composes with, as value() gives a single value
    return [Override._convert_value(item) for item in override.sweep_iterator()]


def _first(problems: Any) -> str:
    return next((problem for problem in problems if problem), "")


def _repository(args: Any, overrides: list) -> Any:
    """Hydra's config repository for this command line, searched as Hydra searches it (reportgen's
    conf/, search-path plugins, structured configs, ``--config-dir``, ``hydra.searchpath``); None with
    ``--config-path`` (another primary config: Hydra judges group options itself)."""
    from hydra._internal.config_repository import ConfigRepository
    from hydra._internal.utils import create_config_search_path

    if args.config_path:
        return None
    search = create_config_search_path(str(conf_dir()))
    if args.config_dir:
        search.append("command-line", f"file://{args.config_dir}")
    for override in overrides:
        if override.key_or_group == "hydra.searchpath" and not override.is_sweep_override():
            for entry in override.value() or []:
                search.append("command-line", str(entry))
    return ConfigRepository(search)


def _groups() -> set[str]:
    """Top-level config groups reportgen ships (``model``, ``recompute``, ``claim``)."""
    return {p.name for p in conf_dir().iterdir() if p.is_dir() and any(p.glob("*.yaml"))}


def group_option_problem(line: str, group: str, option: Any, repo: Any) -> str:
    """``"+model=fnn: no such model (did you mean ffn?); models: ffn, gpt, ..."``, or ``""`` when
    ``repo`` (Hydra's ``ConfigRepository``) holds ``GROUP/OPTION`` (or it is not a plain name: Hydra judges it)."""
    from hydra.core.object_type import ObjectType

    if not isinstance(option, str) or option == "null" or repo.config_exists(f"{group}/{option}"):
        return ""
    options = sorted(repo.get_group_options(group, ObjectType.CONFIG))
    near = difflib.get_close_matches(option, options, n=1)
    noun = "model" if group == "model" else f"{group} option"
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"{line}: no such {noun}{hint}; {noun}s: {', '.join(options)}"


def removed_setting_problem(key: str) -> str:
    """``"~seed removes a required setting; ..."`` for ``~`` on a setting of the schema, else ``""``
    (a model's or task's own key, a config group, ``hydra.*``: Hydra judges those)."""
    top = key.split(".", 1)[0]
    if top in FREE_FORM or top == "hydra" or "/" in key or (key == top and key in _groups()):
        return ""
    default = _schema_default(key)
    if default is _UNKNOWN:
        return ""
    shown = "null" if default is None else default
    return (
        f"~{key} removes a required setting; reportgen reads every setting of reportgen/config.py, so set it "
        f"instead (its default: {key}={shown})"
    )


_UNKNOWN = object()


def _schema_default(key: str) -> Any:
    """The schema default of a dotted setting (a node for a group), or ``_UNKNOWN``."""
    node: Any = _schema_template()
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return _UNKNOWN
        node = node._get_node(part)
    return node._value() if isinstance(node, ValueNode) else key.rsplit(".", 1)[-1]


def value_problem(key: str, value: Any) -> str:
    """``"parity.rtol='abc' is not a float"`` when the schema's type refuses ``value``, else ``""``.

    The value is tried on the schema itself (OmegaConf's own conversion), so what passes here
    passes when Hydra composes; only the words are reportgen's.
    """
    top = key.split(".", 1)[0]
    if top in FREE_FORM or top == "hydra" or "/" in key or _schema_default(key) is _UNKNOWN:
        return ""
    cfg = copy.deepcopy(_schema_template())  # a fresh copy the value may be tried on
    try:
        OmegaConf.update(cfg, key, value, merge=True)
    except (ValidationError, ValueError, TypeError) as exc:
        node = cfg
        for part in key.split("."):
            node = node._get_node(part)
        return f"{key}={value!r} {_accepts(node, exc)}"
    return ""


def _accepts(node: Any, exc: Exception) -> str:
    """What a schema node accepts, as the end of a sentence."""
    null = " (or null)" if node._is_optional() else ""
    if isinstance(node, EnumNode):
        return f"must be one of {', '.join(m.name for m in node.enum_type)}{', null' if null else ''}"
    words = {FloatNode: "is not a float", IntegerNode: "is not an integer", BooleanNode: "is not true or false"}
    said = next((word + null for kind, word in words.items() if isinstance(node, kind)), None)
    return said or f"is refused: {(str(exc).splitlines() or [''])[0]}"


@functools.cache
def _schema_template() -> DictConfig:
    """The root schema (a structured config of :class:`reportgen.config.Config`), built once per process
    (~12 ms each); read only: :func:`value_problem` tries a value on a copy."""
    return OmegaConf.structured(Config)
