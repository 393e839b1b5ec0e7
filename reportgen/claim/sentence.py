"""The claim's sentence against its clauses: every quantity the sentence states must be judged.

A release note's sentence ("cuts peak memory by 40 % at no more than 60 % step-time overhead, so
batch 64 at sequence 1024 fits in 80 GiB") is what reviewers read; the clauses are what reportgen
judges. :func:`stated_quantities` reads every quantity a sentence states and :func:`unjudged`
returns those no clause judges at least as strictly, so a sentence can never promise more than the
rows prove. A quantity is any of:

- a number in digits or words with ``%`` / ``percent`` / ``pct`` (a share), ``x`` / ``×`` / ``times`` /
  ``fold`` (a factor: "10x less memory" is a 0.9 saving, "1.5x slower" a 1.5 overhead ratio) or ``ms``
  (a step time);
- ``half`` / ``halves`` (a 0.5 saving, or a 0.5 step-time ratio), ``double`` / ``twice`` (a 2.0 step-time
  ratio);
- ``no`` / ``zero`` / ``without`` / ``unchanged`` … ``slowdown`` / ``overhead`` / ``cost`` / ``memory``
  (a 1.0 step-time ratio, or no extra memory: a saving of at least 0);
- a batch, sequence and memory that fit (``batch 64 at sequence 1024 fits in 80 GiB``; a batch or sequence
  without a memory fits in any memory a ``fits`` clause at that shape names);
- any other number (``12 layers``, ``one`` more forward): a quantity of nothing a clause can judge.

What a share or factor is of comes from the words beside it (:func:`_kind`); one it cannot tell is
a quantity no clause judges. Identifiers that hold digits (``H100``, ``GPT-2``, ``bf16``) are not
quantities.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

SAVING, OVERHEAD, FITS_IN, STEP_TIME = "memory saving", "step-time overhead", "fits", "step time"
#: Words that make a percentage a step-time overhead, or a memory saving (looked for after the
#: number first, then before it, never past another number or a , ; . boundary).
_OVERHEAD_WORDS = (
    "overhead", "slower", "slowdown", "step-time", "step time", "time cost", "runtime", "compute", "speed",
)  # fmt: skip
_SAVING_WORDS = (
    "memory", "peak", "saving", "saves", "save", "cuts", "reduces", "reduction", "less", "smaller", "lower",
)  # fmt: skip
#: Number words (Wikipedia, "English numerals"): units, teens, tens and the two scales a claim uses.
_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()
_UNITS += "sixteen seventeen eighteen nineteen".split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_WORD_VALUES = {w: i for i, w in enumerate(_UNITS)} | {w: 20 + 10 * i for i, w in enumerate(_TENS)}
_SCALES = {"hundred": 100, "thousand": 1000}
_WORD = "(?:" + "|".join(sorted([*_WORD_VALUES, *_SCALES], key=len, reverse=True)) + ")"
#: A number: digits (not inside an identifier such as H100, GPT-2, bf16) or number words ("ninety-five").
_NUMBER = re.compile(rf"(?<![\w.\-])\d+(?:\.\d+)?|\b{_WORD}(?:(?:\s+and\s+|[\s-]+){_WORD})*\b", re.IGNORECASE)
#: What follows a number: a share, a factor or milliseconds.
_SUFFIX = re.compile(r"\s*(?:(%|percent\b|per\s*cent\b|pct\b)|(×|x\b|times\b|-?fold\b)|(ms\b))", re.IGNORECASE)
_HALF = re.compile(r"\b(?:half|halves|halve|halved|halving)\b", re.IGNORECASE)
_DOUBLE = re.compile(r"\b(?:double|doubles|doubled|doubling|twice)\b", re.IGNORECASE)
#: "no slowdown", "zero overhead", "without any extra memory", "at no cost", "unchanged step time",
#: "step time unchanged": nothing more of a cost (letters only between, never past a number or , ; .).
_COSTS = r"(?:slowdowns?|overheads?|costs?|memory|slower|slow-?down|step[- ]time|speed|runtime)"
_NO_COST = re.compile(
    rf"\b(?:zero|no|without|unchanged|free\s+of)\s+(?:[a-z-]+\s+){{0,3}}?{_COSTS}\b"
    rf"|\b(?:step[- ]time|speed|runtime|memory|peak)\s+(?:stays\s+|is\s+|remains\s+)?unchanged\b",
    re.IGNORECASE,
)
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
        words: the words as written, e.g. ``"40 %"``, ``"zero overhead"``, ``"halves"``, ``"batch 64; 80 GiB"``.
        kind: :data:`SAVING`, :data:`OVERHEAD`, :data:`STEP_TIME` or :data:`FITS_IN`; "" when the sentence
            does not say what the quantity is of (no clause can then judge it).
        value: a saving as a share of the plain peak (0.40), an overhead as the recompute/plain step-time
            ratio (1.60), a step time in ms, a memory in bytes (fits; infinite when none is named); NaN for a
            number of nothing named.
        batch: fits only: the stated batch (None when not stated).
        seq: fits only: the stated sequence length (None when not stated).
        start: where the words start in the sentence (the quantities are listed in this order).
    """

    words: str
    kind: str
    value: float
    batch: int | None = None
    seq: int | None = None
    start: int = 0

    def said(self) -> str:
        """``'"40 %" (a memory saving)'``: how an error or page 1 names it."""
        if self.kind:
            return f'"{self.words}" (a {self.kind})'
        share = any(u in self.words.lower() for u in ("%", "percent", "pct"))
        return f'"{self.words}" (a {"percentage" if share else "number"} of nothing a clause judges)'


def _kind(sentence: str, start: int, end: int) -> str:
    """What the quantity at ``sentence[start:end]`` is of: the words up to the next number or
    boundary or phrase after it, else those back to the previous number or boundary before it."""
    after = _AFTER_ENDS.split(sentence[end:], maxsplit=1)[0].lower()
    before = _BOUNDARY.split(sentence[:start])[-1].lower()
    for words in (after, before):
        if any(w in words for w in _OVERHEAD_WORDS):
            return OVERHEAD
        if any(w in words for w in _SAVING_WORDS):
            return SAVING
    return ""


def number_value(words: str) -> float:
    """``"40"`` → 40.0, ``"ninety-five"`` → 95.0, ``"two hundred and fifty"`` → 250.0."""
    if words[0].isdigit():
        return float(words)
    total = current = 0
    for word in re.split(r"[\s-]+", words.lower()):
        if word in _WORD_VALUES:
            current += _WORD_VALUES[word]
        elif word == "hundred":
            current = max(current, 1) * 100
        elif word == "thousand":
            total, current = total + max(current, 1) * 1000, 0
    return float(total + current)


def _numbers(sentence: str, taken: list[range]) -> Iterator[Stated]:
    """Every number outside the ``taken`` spans, with its suffix: a share, a factor, ms, or bare."""
    for match in _NUMBER.finditer(sentence):
        if any(match.start() in span for span in taken):
            continue
        number = number_value(match.group(0))
        suffix = _SUFFIX.match(sentence, match.end())
        end = suffix.end() if suffix else match.end()
        words, kind = sentence[match.start() : end], _kind(sentence, match.start(), end)
        if suffix and suffix.group(1):  # a share: of the peak saved, or of the plain step time added
            value = 1 + number / 100 if kind == OVERHEAD else number / 100
        elif suffix and suffix.group(2):  # a factor: N× less memory saves 1 - 1/N; N× slower is a ratio of N
            value = number if kind == OVERHEAD else 1 - 1 / number if kind == SAVING and number > 0 else float("nan")
            kind = kind if value == value else ""
        elif suffix and suffix.group(3):
            kind, value = STEP_TIME, number
        else:
            kind, value = "", float("nan")
        yield Stated(words, kind, value, start=match.start())


def _words(sentence: str, taken: list[range]) -> Iterator[Stated]:
    """ "half" (0.5 of the peak, or of the step time) and "double" / "twice" (a 2.0 step-time ratio)."""
    for pattern, values in ((_HALF, {SAVING: 0.5, OVERHEAD: 0.5}), (_DOUBLE, {OVERHEAD: 2.0})):
        for match in pattern.finditer(sentence):
            if not any(match.start() in span for span in taken):
                kind = _kind(sentence, match.start(), match.end())
                kind = kind if kind in values else ""
                yield Stated(match.group(0), kind, values.get(kind, float("nan")), start=match.start())


def stated_quantities(sentence: str) -> list[Stated]:
    """Every quantity ``sentence`` states (module docstring), in the order written.

    Example: ``"halves peak memory with no slowdown"`` → ``[Stated("halves", SAVING, 0.5),
    Stated("no slowdown", OVERHEAD, 1.0)]``.
    """
    found, taken = [], []
    for match in _NO_COST.finditer(sentence):
        saving = re.search(r"memory|peak", match.group(0), re.IGNORECASE)
        found.append(
            Stated(match.group(0), SAVING if saving else OVERHEAD, 0.0 if saving else 1.0, start=match.start())
        )
        taken.append(range(match.start(), match.end()))
    memory, batch, seq = _MEMORY.search(sentence), _BATCH.search(sentence), _SEQ.search(sentence)
    parts = [m for m in (batch, seq, memory) if m]
    if parts:  # a shape that fits (in any memory when none is named): one fits statement
        amount = float(memory.group(1)) * _BYTES[memory.group(2)] if memory else float("inf")
        words = "; ".join(m.group(0) for m in parts)
        size, length = (int(m.group(1)) if m else None for m in (batch, seq))
        found.append(Stated(words, FITS_IN, amount, size, length, start=min(m.start() for m in parts)))
        taken += [range(m.start(), m.end()) for m in parts]
    found += [*_numbers(sentence, taken), *_words(sentence, taken)]
    return sorted(found, key=lambda s: s.start)


def _judges(clause: Bounded, stated: Stated) -> bool:
    """True when ``clause`` judges ``stated`` at least as strictly as the sentence states it: the same
    metric, the same direction (a saving from below, a cost from above) and a bound no weaker."""
    if stated.kind == SAVING:
        return clause.metric == "peak_saving_share" and clause.bound >= stated.value - 1e-9
    if stated.kind == OVERHEAD:
        return clause.metric == "overhead_ratio_ci_high" and clause.bound <= stated.value + 1e-9
    if stated.kind == STEP_TIME:
        return clause.metric == "step_time_ms" and clause.bound <= stated.value + 1e-9
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
    a bound at or above the stated share, an overhead or step-time clause at or below the stated figure,
    a fits clause at the stated batch and sequence within the stated memory); a number of nothing named
    is never judged."""
    return [s for s in stated_quantities(sentence) if not any(_judges(c, s) for c in clauses)]


def clause_for(stated: Stated) -> str:
    """The clause that would judge ``stated`` as the sentence states it (for the error message)."""
    if stated.kind == SAVING:
        return f"peak_saving_share >= {stated.value:g}" if stated.value > 0 else "peak_saving_share > 0"
    if stated.kind == OVERHEAD:
        return f"overhead_ratio <= {stated.value:g}"
    if stated.kind == STEP_TIME:
        return f"step_time_ms <= {stated.value:g}"
    if stated.kind == FITS_IN:
        seq = f" at seq {stated.seq}" if stated.seq else ""
        return f"fits: batch {stated.batch or '<B>'}{seq} within <memory in MiB/GiB/TiB>"
    return "a clause, or reword the sentence to say what the quantity is of"
