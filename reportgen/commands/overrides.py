"""Unknown settings, named with the one they were probably meant to be, before Hydra composes.

A typo in a schema'd group reaches reportgen two ways. With ``+`` (``+parity.rtlo=1e-5``) Hydra
adds the key, and :func:`reportgen.commands.validation.unknown_setting_problems` refuses it after
composing. Without ``+`` (``parity.rtlo=1e-5``) Hydra refuses it itself, with a multi-line block and
exit 1; :func:`argv_problems` reads the same command line first (with Hydra's own argument and
override parsers) so the console shows one line naming the setting meant, through the same
:func:`unknown_key_problem`, and nothing is written. Imports no torch: it runs before every start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io

from reportgen.config import Config
from reportgen.distributed.settings import unknown_problems

#: Groups whose keys are the user's own (``_target_`` nodes), never checked.
FREE_FORM = ("model", "task")


def schema_groups() -> dict[str, list[str]]:
    """Each dataclass group of :class:`reportgen.config.Config` (``distributed`` too) and its settings."""
    groups = {}
    for group in dataclasses.fields(Config):
        factory = group.default_factory
        if factory is not dataclasses.MISSING:
            groups[group.name] = [f.name for f in dataclasses.fields(factory())]
    return groups


def unknown_key_problem(group: str, key: str, known: list[str]) -> str:
    """``"group.key is not a setting (did you mean group.near?); the group settings are ..."``.

    Args:
        group: the schema group (``parity``).
        key: the unknown key inside it (``rtlo``).
        known: the group's settings, in schema order.

    Returns:
        One sentence naming the closest known setting (``difflib``), when one is close.
    """
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
        node: dict = {}
        *parents, leaf = rest.split(".")
        inner = node
        for part in parents:
            inner = inner.setdefault(part, {})
        inner[leaf] = None
        return "; ".join(unknown_problems(node))
    key = rest.split(".", 1)[0]
    return "" if key in groups[group] else unknown_key_problem(group, key, groups[group])


def _top_level_problem(key: str) -> str:
    """A top-level key that is no setting of :class:`reportgen.config.Config` but close to one
    (``dtpye``); ``""`` otherwise: a key close to nothing may be a group of the user's config directory,
    so Hydra judges it."""
    known = [f.name for f in dataclasses.fields(Config)]
    near = difflib.get_close_matches(key, known, n=1)
    if key in known or not near:
        return ""
    return f"{key} is not a setting (did you mean {near[0]}?); settings and their types: reportgen/config.py"


def argv_problems(argv: list[str]) -> str:
    """Every unknown setting changed without ``+`` on a ``python -m reportgen`` command line.

    Args:
        argv: the arguments after the program name (``sys.argv[1:]``).

    Returns:
        ``""`` when none (or when Hydra's parsers refuse the line: Hydra then reports it itself),
        else the problems joined by ``"; "`` (one line).
    """
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args, _ = get_args_parser().parse_known_args(argv)  # --version, a bad option: Hydra says it, once
        overrides = OverridesParser.create().parse_overrides(list(args.overrides or []))
    except (Exception, SystemExit):  # noqa: BLE001 - a line Hydra cannot read is Hydra's to report
        return ""
    problems = []
    for override in overrides:
        if override.is_add() or override.is_force_add() or override.is_delete() or override.package:
            continue  # `+key` is refused after composing (validation.unknown_setting_problems)
        problem = dotted_key_problem(override.key_or_group)
        if problem and problem not in problems:
            problems.append(problem)
    return "; ".join(problems)
