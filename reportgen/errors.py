"""Exit codes, the usage message and the exceptions every layer shares (the lowest layer).

:class:`ExitCode` holds every command's codes (DESIGN.md "Exit code"); what each code means for
each command is the one table in docs/exit-codes.md, which tests/test_docs.py checks against it.
"""

from __future__ import annotations

import enum
import textwrap

from reportgen.paths import builtin_models


class ExitCode(enum.IntEnum):
    """Every command's exit codes, in one place (like pytest's ``ExitCode``; what each means: docs/exit-codes.md).

    ``reportgen.verify`` reads 0 as VERIFIED and 1 as NOT VERIFIED; ``reportgen.compare`` 1 as a
    regression; the numbers are the same for every command.
    """

    HOLDS = 0
    FAILS = 1
    USAGE = 2
    INCONCLUSIVE = 3
    BUG = 70  #: EX_SOFTWARE of BSD's sysexits.h
    SIGINT = 130  #: 128 + the signal number, as shells report it
    SIGTERM = 143


EXIT_CODES_HELP = (
    "exit codes: 0 claim holds, 1 claim fails, 2 could not start (config, usage, output folder, "
    "task contract; the message names the fix), 3 cannot be judged, 70 reportgen's own bug (log "
    "path printed), 130 Ctrl-C, 143 SIGTERM (partial results kept)"
)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so it takes the same path as Ctrl-C (partial frame kept, exit 143)."""


#: Words of every :class:`InstrumentRefused` message (``reportgen.report.diagnose`` matches them).
INSTRUMENT_REFUSED = "under reportgen's own instrument"


class InstrumentRefused(RuntimeError):
    """reportgen's own instrument (a ``TorchDispatchMode``: the memory tracker, a FLOP or op counter) could
    not run the user's model, e.g. torch.compile refuses compiled code under it. The row it would have
    measured is INCONCLUSIVE with this message, never a FAIL: nothing of the model is blamed
    (:mod:`reportgen.memory.instrument`)."""


class UsageError(Exception):
    """The command could not start, and the user can fix it: the message names the fix.

    Every command maps it, and only it, to :attr:`ExitCode.USAGE` (2). Subclasses say which input
    was wrong (a setting, the task contract, a key file, a plan's shape, ...).
    """


class SetupError(UsageError, ValueError):
    """The model, task or precision in the config cannot be built (a usage error, exit 2)."""


def usage() -> str:
    """The short message printed when no usable model was given."""
    models = builtin_models()
    return (
        f"reportgen: choose a model. Built-in models: {', '.join(models)}.\n"
        f"  python -m reportgen +model={models[0]}\n"
        "Your own model: python -m reportgen --config-dir DIR +model=NAME (see docs/own-model.md).\n"
        f"  ({EXIT_CODES_HELP})"
    )


#: What the console says instead of the class name of an exception defined inside torch.
TORCH_ERROR = "an error inside torch"


def _subclasses(cls: type) -> list[type]:
    out, stack = [], [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            out.append(sub)
            stack.append(sub)
    return out


def torch_internal_names() -> set[str]:
    """Names of the exception classes loaded now that torch defines in its private modules (a
    module path with a part starting ``_``: ``torch._subclasses.fake_tensor.DataDependentOutputException``,
    ``torch._dynamo.exc.Unsupported``). torch's public exceptions (``torch.OutOfMemoryError``,
    ``torch.utils.checkpoint.CheckpointError``), Python's own and the user's are not among them."""
    public = {c.__name__ for c in _subclasses(BaseException) if not _torch_private(c)}
    return {c.__name__ for c in _subclasses(BaseException) if _torch_private(c)} - public


def _torch_private(cls: type) -> bool:
    parts = (getattr(cls, "__module__", "") or "").split(".")
    return parts[0] == "torch" and any(p.startswith("_") for p in parts[1:])


def exception_label(exc: BaseException) -> str:
    """How the console names ``exc``: its class name, or :data:`TORCH_ERROR` for a class
    defined inside torch (the run's log keeps the real name and the traceback)."""
    return TORCH_ERROR if type(exc).__name__ in torch_internal_names() else type(exc).__name__


def clip_words(text: str, most: int = 170) -> str:
    """``text`` cut to at most ``most`` characters at a word boundary, with ``…`` when cut (console
    lines never end mid-word; ``textwrap.shorten`` does the cutting)."""
    return textwrap.shorten(text, width=most + 2, placeholder=" …") if len(text) > most else text


def clip_keeping_advice(text: str, most: int = 200) -> str:
    """``text`` for one console line of at most about ``most`` characters that keeps its advice.

    A row's detail reads "finding; explanation; ...; advice" (clauses joined by ``"; "``), and the
    advice is what the reader acts on: the last clause is kept whole, the first (the finding) is cut at a
    word boundary to the room left, and the clauses between are dropped (``…``). A detail of one clause
    is cut as :func:`clip_words` cuts it. The full detail is in the report and results.csv.
    """
    clauses = text.split("; ")
    if len(text) <= most or len(clauses) < 2:
        return clip_words(text, most)
    head, advice = clauses[0], clauses[-1]
    room = max(60, most - len(advice) - 5)
    cut = textwrap.shorten(head, width=room, placeholder=" …") if len(head) > room else head
    dropped = "…; " if cut == head and len(clauses) > 2 else ""
    return f"{cut}; {dropped}{advice}"


def console_text(text: str) -> str:
    """``text`` with every torch-internal exception class name replaced by :data:`TORCH_ERROR`.

    Console lines (warnings, one-line errors) quote row details and exception messages, which
    may carry names such as ``DataDependentOutputException`` that mean nothing to a user; the
    report's rows, results.json and the log keep them unchanged."""
    import re

    names = sorted(torch_internal_names(), key=len, reverse=True)
    if not names or not text:
        return text
    return re.sub(r"\b(?:torch\.[\w.]*\.)?(?:" + "|".join(map(re.escape, names)) + r")\b", TORCH_ERROR, text)
