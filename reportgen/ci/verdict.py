"""verdict.json: the run's verdict for machines, bound to the signed statement by its digest.

The statement cannot list a file that names the statement's own digest, so verdict.json is
written *after* signing and is not a statement subject. It is bound instead: it names the
SHA-256 of statement.dsse.json, and ``reportgen.verify`` checks that digest against the
envelope on disk and that every figure in it (verdict, exit code, each clause's status and
value) equals what the signed statement and results.json give; an edited verdict.json fails
verification. Without signing it says ``"statement": null`` and nothing vouches for it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from reportgen.claim.rows import claim_table, not_judged
from reportgen.errors import ExitCode
from reportgen.files import atomic_write, sha256_bytes, sha256_file
from reportgen.results import Status
from reportgen.results.frame import detectors
from reportgen.results.row import to_float
from reportgen.trust.documents import ENVELOPE_NAME

#: File name in the run folder (bound to the run's envelope, ``ENVELOPE_NAME``).
VERDICT_NAME = "verdict.json"
#: Version of the verdict.json layout.
VERSION = 1


def exit_code(verdict: str) -> int:
    """The run's exit code for a claim verdict: 0 holds, 1 fails, 3 cannot be judged."""
    codes: dict[str, int] = {Status.PASS: ExitCode.HOLDS, Status.INCONCLUSIVE: ExitCode.INCONCLUSIVE}
    return int(codes.get(verdict, ExitCode.FAILS))


def _number(value: Any) -> float | None:
    return number if math.isfinite(number := to_float(value)) else None


def clause_results(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Per clause of the release claim: text, status, outcome, value, bound (comparator and number)."""
    rows = {r["clause"]: r for r in claim_table(frame)}
    judged = frame[frame.role == "claim_clause"]
    return [
        {
            "clause": r["item"],
            "status": r["status"],
            "outcome": rows[r["item"]]["outcome"],
            "value": _number(r["value"]),
            "comparator": r["comparator"] or None,
            "bound": _number(r["threshold_value"]),
            "measured": rows[r["item"]]["measured"],
        }
        for r in judged.to_dict("records")
    ]


def sentence_result(frame: pd.DataFrame) -> dict[str, Any]:
    """``{"sentence": "not judged", "not_judged": [...]}`` when the claim sentence states quantities no clause
    judges (:func:`reportgen.claim.rows.not_judged`), else ``{}``: the verdict then covers the clauses only."""
    left = not_judged(frame)
    return {"sentence": "not judged", "not_judged": left} if left else {}


def write_verdict(frame: pd.DataFrame, verdict: str, out_dir: Path) -> Path:
    """Write verdict.json (after signing: see the module docstring): ``{"version", "verdict", "exit_code",
    "detectors", "clauses", ["sentence", "not_judged",] "statement", "report"}`` (``detectors``:
    :func:`reportgen.results.frame.detectors`, "" when the detector controls ran; ``sentence``: "not judged" with
    the quantities of the claim sentence no clause judges, :func:`sentence_result`).

    Raises:
        FileExistsError: the run folder holds one already.
    """
    envelope = Path(out_dir) / ENVELOPE_NAME
    statement = {"name": ENVELOPE_NAME, "sha256": sha256_file(envelope)} if envelope.is_file() else None
    record = {"version": VERSION, "verdict": verdict, "exit_code": exit_code(verdict), "detectors": detectors(frame)}
    record |= {"clauses": clause_results(frame), **sentence_result(frame)}
    record |= {"statement": statement, "report": "report.html"}
    return atomic_write(Path(out_dir) / VERDICT_NAME, json.dumps(record, indent=2, allow_nan=False) + "\n")


def verdict_problems(raw: bytes, envelope: bytes, verdict: str, frame: pd.DataFrame) -> list[str]:
    """Where a verdict.json disagrees with the signed run (empty = it agrees).

    Args:
        raw: verdict.json's bytes.
        envelope: statement.dsse.json's bytes (the one verified).
        verdict: the signed statement's verdict.
        frame: the signed results.json's frame.
    """
    try:
        record = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [f"verdict.json is not JSON ({exc})"]
    problems = []
    digest = sha256_bytes(envelope)
    if (record.get("statement") or {}).get("sha256") != digest:
        problems.append(
            f"it names statement sha256 {(record.get('statement') or {}).get('sha256')}, the envelope has {digest}"
        )
    if record.get("verdict") != verdict or record.get("exit_code") != exit_code(verdict):
        problems.append(
            f"it says {record.get('verdict')} (exit {record.get('exit_code')}), the statement {verdict} "
            f"(exit {exit_code(verdict)})"
        )
    if record.get("detectors", "") != detectors(frame):  # a verdict.json written before the field: "" (they ran)
        problems.append(f"it says detectors {record.get('detectors')!r}, the signed results.json {detectors(frame)!r}")
    if record.get("clauses") != clause_results(frame):
        problems.append("its clause results differ from the signed results.json")
    said, signed = {k: record[k] for k in ("sentence", "not_judged") if k in record}, sentence_result(frame)
    if said != signed:
        problems.append(f"it says the sentence is {said or 'judged'}, the signed results.json {signed or 'judged'}")
    return problems
