"""The claim's sentence against its clauses: every quantity the sentence states must be judged.

A release note's sentence ("cuts peak memory by 40 % at no more than 60 % step-time overhead, so
batch 64 at sequence 1024 fits in 80 GiB") is what reviewers read; the clauses are what reportgen
judges. :func:`stated_quantities` reads the quantities a sentence states (a memory saving in %, a
step-time overhead in % or "zero overhead", a batch / sequence / memory that fits) and
:func:`unjudged` returns those no clause judges at least as strictly, so a sentence can never
promise more than the rows prove.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

SAVING, OVERHEAD, FITS_IN = "memory saving", "step-time overhead", "fits"
#: Words that make a percentage a step-time overhead, or a memory saving (looked for after the
#: number first, then before it, never past another number or a , ; . boundary).
_OVERHEAD_WORDS = ("overhead", "slower", "slowdown", "step-time", "step time", "time cost", "runtime", "compute")
_SAVING_WORDS = ("memory", "peak", "saving", "saves", "save", "cuts", "reduces", "reduction", "less", "smaller")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*(?:%|percent\b)", re.IGNORECASE)
_NO_OVERHEAD = re.compile(r"\b(?:zero|no|without(?: any)?|free of)\s+(?:extra\s+)?(?:step-time\s+)?overhead\b", re.I)
_BATCH = re.compile(r"\bbatch(?:\s+size)?(?:\s+of)?\s+(\d+)", re.IGNORECASE)
_SEQ = re.compile(r"\b(?:sequence|seq|context)(?:\s+length)?(?:\s+of)?\s+(\d+)", re.IGNORECASE)
_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*(TiB|GiB|MiB|TB|GB|MB)\b")
#: Bytes per unit; decimal units are read as written (80 GB is less than 80 GiB).
_BYTES = {"MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_BOUNDARY = re.compile(r"[,;.]\s|\d")
#: After a number, the words it qualifies end at a boundary or at a word that starts another phrase.
_AFTER_ENDS = re.compile(r"[,;.]\s|\d|\b(?:at|with|while|and|so|but|for|in)\b", re.IGNORECASE)


class Bounded(Protocol):
    """What a clause (:class:`reportgen.claim.clauses.Clause`) offers this module: its row's metric and bound."""

    @property
    def metric(self) -> str: ...
    @property
    def bound(self) -> float: ...
    @property
    def batch(self) -> int | None: ...
    @property
    def seq(self) -> int | None: ...


@dataclass(frozen=True)
class Stated:
    """One quantity the claim sentence states.

    Attributes:
        words: the words as written, e.g. ``"40 %"``, ``"zero overhead"``, ``"batch 64 … 80 GiB"``.
        kind: :data:`SAVING`, :data:`OVERHEAD` or :data:`FITS_IN`; "" when the sentence does not say
            what a percentage is of (no clause can then judge it).
        value: a saving as a share of the plain peak (0.40), an overhead as the recompute/plain step-time
            ratio (1.60), a memory in bytes (fits).
        batch: fits only: the stated batch (None when not stated).
        seq: fits only: the stated sequence length (None when not stated).
    """

    words: str
    kind: str
    value: float
    batch: int | None = None
    seq: int | None = None

    def said(self) -> str:
        """``'"40 %" (a memory saving)'``: how an error or page 1 names it."""
        return f'"{self.words}" ({f"a {self.kind}" if self.kind else "a percentage of nothing named"})'


def _kind(sentence: str, start: int, end: int) -> str:
    """What the percentage at ``sentence[start:end]`` is of: the words up to the next number or
    boundary or phrase after it, else those back to the previous number or boundary before it."""
    after = _AFTER_ENDS.split(sentence[end:], maxsplit=1)[0].lower()
    before = _BOUNDARY.split(sentence[:start])[-1].lower()
    for words in (after, before):
        if any(w in words for w in _OVERHEAD_WORDS):
            return OVERHEAD
        if any(w in words for w in _SAVING_WORDS):
            return SAVING
    return ""


def stated_quantities(sentence: str) -> list[Stated]:
    """The quantities ``sentence`` states, in order: percentages (a saving or an overhead), "zero
    overhead", and one fits statement when it names a memory (with the batch and sequence it names)."""
    found = []
    for match in _PERCENT.finditer(sentence):
        kind = _kind(sentence, match.start(), match.end())
        share = float(match.group(1)) / 100
        found.append(Stated(match.group(0), kind, 1 + share if kind == OVERHEAD else share))
    found += [Stated(m.group(0), OVERHEAD, 1.0) for m in _NO_OVERHEAD.finditer(sentence)]
    memory = _MEMORY.search(sentence)
    if memory:
        batch, seq = _BATCH.search(sentence), _SEQ.search(sentence)
        amount = float(memory.group(1)) * _BYTES[memory.group(2)]
        words = "; ".join(m.group(0) for m in (batch, seq, memory) if m)
        found.append(Stated(words, FITS_IN, amount, *(int(m.group(1)) if m else None for m in (batch, seq))))
    return found


def _judges(clause: Bounded, stated: Stated) -> bool:
    """True when ``clause`` judges ``stated`` at least as strictly as the sentence states it."""
    if stated.kind == SAVING:
        return clause.metric == "peak_saving_share" and clause.bound >= stated.value - 1e-9
    if stated.kind == OVERHEAD:
        return clause.metric == "overhead_ratio_ci_high" and clause.bound <= stated.value + 1e-9
    if stated.kind == FITS_IN:
        return (
            clause.metric == "fits_peak_bytes"
            and (stated.batch is None or clause.batch == stated.batch)
            and (stated.seq is None or clause.seq == stated.seq)
            and clause.bound <= stated.value
        )
    return False


def unjudged(sentence: str, clauses: Sequence[Bounded]) -> list[Stated]:
    """The quantities of ``sentence`` that no clause judges at least as strictly (a saving clause with
    a bound at or above the stated share, an overhead clause at or below the stated ratio, a fits
    clause at the stated batch and sequence within the stated memory)."""
    return [s for s in stated_quantities(sentence) if not any(_judges(c, s) for c in clauses)]


def clause_for(stated: Stated) -> str:
    """The clause that would judge ``stated`` as the sentence states it (for the error message)."""
    if stated.kind == SAVING:
        return f"peak_saving_share >= {stated.value:g}"
    if stated.kind == OVERHEAD:
        return f"overhead_ratio <= {stated.value:g}"
    if stated.kind == FITS_IN:
        seq = f" at seq {stated.seq}" if stated.seq else ""
        return f"fits: batch {stated.batch or '<B>'}{seq} within <memory in MiB/GiB/TiB>"
    return "a clause, or reword the sentence to say what the percentage is of"
