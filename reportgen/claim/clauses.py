"""The release claim: the release note's sentence and its clauses, parsed from ``claim=<name>``.

A claim file (conf/claim/*.yaml, schema :class:`reportgen.config.ClaimConfig`) holds the
sentence as written and one clause per measured promise. Each clause is a measured quantity,
a comparator and a bound; :mod:`reportgen.claim.rows` turns each into one judged row of the
``release claim`` section, so ``reportgen.verify`` re-judges it from the signed numbers.

Clauses (case and spacing free)::

    training unchanged                       the parity checks pass (always part of a claim)
    peak_saving_share >= 0.40                share of the plain twin's step peak saved (or 40 %)
    overhead_ratio <= 1.30                   recompute/plain step time, upper end of its 95% CI
    step_time_ms <= 250                      median recompute step time
    fits: batch 16 [at seq 1024] within 80 GiB   the recompute twin's step peak at that shape
    task metric within tolerance             every seed's held-out metric within budget tolerance
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from reportgen.claim.sentence import clause_for, unjudged
from reportgen.config import RELEASE_CLAIM
from reportgen.errors import SetupError

#: Kinds of clause.
UNCHANGED, QUANTITY, FITS, TASK = "training unchanged", "quantity", "fits", "task metric"
#: The clause every claim holds: recomputation is a memory optimisation, never a change of training.
UNCHANGED_TEXT = "training unchanged"
TASK_TEXT = "task metric within tolerance"

#: Quantities a clause may bound, and the comparators that make sense for each (a saving is a
#: lower bound, a cost an upper bound).
QUANTITIES = {"peak_saving_share": (">=", ">"), "overhead_ratio": ("<=", "<"), "step_time_ms": ("<=", "<")}
#: Binary units a ``fits`` clause may name, in bytes.
UNITS = {"MiB": 2**20, "GiB": 2**30, "TiB": 2**40}

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_QUANTITY = re.compile(rf"^([a-z_]+)\s*(>=|<=|>|<|==|=)\s*{_NUMBER}\s*(%?)$")
_FITS = re.compile(
    rf"^fits:?\s*batch\s+(\d+)(?:\s+at\s+seq\s+(\d+))?\s+within\s+{_NUMBER}\s*([A-Za-z]+)$", re.IGNORECASE
)


class ClaimError(SetupError):
    """A clause reportgen cannot read; the run exits 2 before any model work, naming the fix."""


@dataclass(frozen=True, kw_only=True)
class Clause:
    """One promise of the release note, as measured quantity, comparator and bound.

    Attributes:
        text: the clause as written in the claim file.
        kind: :data:`UNCHANGED`, :data:`QUANTITY`, :data:`FITS` or :data:`TASK`.
        metric: the clause row's metric (unit in the name): ``parity_checks_not_passing``,
            ``peak_saving_share``, ``overhead_ratio_ci_high``, ``step_time_ms``,
            ``fits_peak_bytes`` or ``task_seeds_outside_tolerance``.
        comparator: how the row is judged (``results.judge``).
        bound: the threshold in the row's unit (a share, a ratio, ms, bytes, a count).
        batch: ``fits`` only: examples per batch of the target shape.
        seq: ``fits`` only: tokens per example of the target shape (None = as measured).
        unit: the unit of the row's value.
    """

    text: str
    kind: str
    metric: str
    comparator: str
    bound: float
    batch: int | None = None
    seq: int | None = None
    unit: str = ""

    def record(self) -> dict[str, Any]:
        """The clause as plain data (what the signed statement's claim holds)."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Claim:
    """The release note's sentence and its clauses (``training unchanged`` always first).

    Attributes:
        text: the sentence as written (page 1 prints it verbatim).
        clauses: the parsed clauses, in file order after ``training unchanged``.
        unjudged: quantities the sentence states that no clause judges (only with
            ``claim.unjudged_ok=true``; else the claim is refused), e.g. ``'"90 %" (a memory saving)'``.
    """

    text: str
    clauses: tuple[Clause, ...]
    unjudged: tuple[str, ...] = ()

    def record(self) -> dict[str, Any]:
        """``{"text", "clauses": [...], "unjudged": [...]}``: signed in the statement's ``claim.release``."""
        return {"text": self.text, "clauses": [c.record() for c in self.clauses], "unjudged": list(self.unjudged)}


def parse_clause(text: str) -> Clause:
    """One clause string → :class:`Clause`.

    Raises:
        ClaimError: an unknown quantity, a comparator pointing the wrong way, or a ``fits``
            clause without a batch or a binary unit; the message shows the accepted forms.
    """
    said = " ".join(str(text).split())
    plain = said.lower()
    counted = {UNCHANGED_TEXT: (UNCHANGED, "parity_checks_not_passing", "checks")}
    counted[TASK_TEXT] = (TASK, "task_seeds_outside_tolerance", "seeds")
    if plain in counted:
        kind, metric, unit = counted[plain]
        return Clause(text=said, kind=kind, metric=metric, comparator="<=", bound=0.0, unit=unit)
    if plain.startswith("fits"):
        return _fits(said)
    match = _QUANTITY.match(plain)
    if not match:
        raise ClaimError(f"claim clause {said!r} is not one reportgen reads; write one of: {FORMS}")
    quantity, comparator, number, percent = match.groups()
    if quantity not in QUANTITIES:
        raise ClaimError(f"claim clause {said!r}: unknown quantity {quantity!r}; known: {', '.join(QUANTITIES)}")
    if comparator not in QUANTITIES[quantity]:
        raise ClaimError(
            f"claim clause {said!r}: {quantity} is bounded with {' or '.join(QUANTITIES[quantity])}, "
            f"e.g. `{quantity} {QUANTITIES[quantity][0]} {number}`"
        )
    bound = float(number) / (100.0 if percent else 1.0)
    if problem := bound_problem(quantity, comparator, bound):
        raise ClaimError(f"claim clause {said!r}: {problem}")
    metric = "overhead_ratio_ci_high" if quantity == "overhead_ratio" else quantity
    unit = {"peak_saving_share": "share", "overhead_ratio": "ratio", "step_time_ms": "ms"}[quantity]
    return Clause(text=said, kind=QUANTITY, metric=metric, comparator=comparator, bound=bound, unit=unit)


def bound_problem(quantity: str, comparator: str, bound: float) -> str:
    """Why a bound makes a clause that cannot miss, or cannot be met ("" when it is one a run can miss and meet).

    A saving share is at most 1 (recompute saved the whole peak), and a bound at or below 0 promises no
    saving: a run whose peak recompute did not lower meets it (``memory.min_peak_saving_share`` is refused at 0
    for the same reason). A step-time ratio or a step time is above 0. A bound beyond any finite value
    (``1e999`` reads as infinity) holds whatever is measured.
    """
    example = {"peak_saving_share": "0.30", "overhead_ratio": "1.30", "step_time_ms": "250"}[quantity]
    fix = f"state the figure the release promises, e.g. `{quantity} {comparator} {example}`"
    if not math.isfinite(bound):
        return f"the bound {bound} is not a finite number, so no measurement can miss it; {fix}"
    if quantity == "peak_saving_share":
        if bound < 0 or (bound == 0 and comparator == ">="):
            return f"a saving {comparator} {bound:g} is met by a run that saves nothing, so it cannot miss; {fix}"
        if bound > 1 or (bound == 1 and comparator == ">"):
            return f"a saving is a share of the plain peak, at most 1 (100 %), so {comparator} {bound:g} cannot be met; {fix}"
    elif bound <= 0:
        return f"{quantity} is above 0, so {comparator} {bound:g} cannot be met; {fix}"
    return ""


def _fits(said: str) -> Clause:
    """``fits: batch B [at seq S] within M GiB`` → a clause bounding the predicted step peak, B."""
    match = _FITS.match(said)
    if not match:
        raise ClaimError(
            f"claim clause {said!r}: write `fits: batch 16 within 80 GiB` or `fits: batch 16 at seq 1024 within 80 GiB`"
        )
    batch, seq, amount, unit = match.groups()
    unit = next((u for u in UNITS if u.lower() == unit.lower()), None)
    if unit is None:
        raise ClaimError(f"claim clause {said!r}: give the memory in {', '.join(UNITS)} (binary units)")
    if int(batch) < 1 or (seq is not None and int(seq) < 1):
        raise ClaimError(f"claim clause {said!r}: batch and seq are at least 1")
    if not 0 < float(amount) * UNITS[unit] < math.inf:
        raise ClaimError(
            f"claim clause {said!r}: the memory {amount} {unit} is not a finite size above 0, so the clause cannot "
            "miss or cannot be met; state the device memory, e.g. `fits: batch 16 within 80 GiB`"
        )
    return Clause(
        text=said,
        kind=FITS,
        metric="fits_peak_bytes",
        comparator="<=",
        bound=float(amount) * UNITS[unit],
        batch=int(batch),
        seq=None if seq is None else int(seq),
        unit="B",
    )


#: The accepted clause forms, for error messages.
FORMS = (
    "`training unchanged`, `peak_saving_share >= 0.40`, `overhead_ratio <= 1.30`, `step_time_ms <= 250`, "
    "`fits: batch 16 at seq 1024 within 80 GiB`, `task metric within tolerance`"
)


def parse_claim(claim_cfg: Any) -> Claim | None:
    """The ``claim`` config node → :class:`Claim`, or None for the generic claim (no text, no clauses).

    ``training unchanged`` is always a clause: it is added first when the file leaves it out.
    A claim with clauses but no sentence is stated as its clauses joined.

    Every quantity the sentence states must be judged by a clause at least as strictly
    (:func:`reportgen.claim.sentence.unjudged`); ``claim.unjudged_ok=true`` keeps the others, said
    as "not judged" on page 1.

    Raises:
        ClaimError: a clause cannot be read, one is given twice, or the sentence states a quantity
            no clause judges (the message names it and the clause that would).
    """
    text = claim_cfg.get("text") if claim_cfg is not None else None
    written = [str(c) for c in (claim_cfg.get("clauses") or [])] if claim_cfg is not None else []
    if not text and not written:
        return None
    clauses = [parse_clause(c) for c in written]
    if not any(c.kind == UNCHANGED for c in clauses):
        clauses.insert(0, parse_clause(UNCHANGED_TEXT))
    seen = [c.text.lower() for c in clauses]
    if len(set(seen)) != len(seen):
        raise ClaimError(f"claim.clauses names a clause twice: {sorted({s for s in seen if seen.count(s) > 1})}")
    sentence = " ".join(str(text).split()) if text else "; ".join(c.text for c in clauses) + "."
    left = unjudged(sentence, clauses) if text else []
    if left and not claim_cfg.get("unjudged_ok"):
        named = "; ".join(f"{s.said()}: add `{clause_for(s)}`" if s.kind else f"{s.said()}: reword it" for s in left)
        raise ClaimError(
            f"claim.text states what no clause judges: {named} (clauses go in claim.clauses), or set "
            "claim.unjudged_ok=true to state the sentence as not judged in every output"
        )
    return Claim(text=sentence, clauses=tuple(clauses), unjudged=tuple(s.said() for s in left))


def claim_required(claim_cfg: Any) -> list[str]:
    """``["release claim"]`` when ``claim_cfg`` states a claim (text or clauses), else ``[]``: the
    section a run with a claim file requires, also when a sweep re-reads a job's config."""
    stated = claim_cfg is not None and (claim_cfg.get("text") or claim_cfg.get("clauses"))
    return [RELEASE_CLAIM] if stated else []


def claim_from_record(record: dict[str, Any] | None) -> Claim | None:
    """The signed ``claim.release`` record back into a :class:`Claim` (``reportgen.verify``)."""
    if not record:
        return None
    clauses = tuple(Clause(**c) for c in record["clauses"])
    return Claim(text=record["text"], clauses=clauses, unjudged=tuple(record.get("unjudged", ())))
