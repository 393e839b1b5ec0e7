"""The in-toto statement of a signed document (a run's: :func:`run_files`, :func:`claim_predicate`) and its
DSSE envelope (securesystemslib)."""

from __future__ import annotations

import base64
import json
import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from cryptography.hazmat.primitives.asymmetric import ec

from reportgen.files import sha256_file
from reportgen.results import Kind, check_summary
from reportgen.results.frame import plain_value
from reportgen.results.role import every_role
from reportgen.trust.documents import ENVELOPE_NAME, PAYLOAD_TYPE, PDF_NAME, PREDICATE_TYPE, STATEMENT_TYPE
from reportgen.trust.keys import SigningKey, fingerprint
from reportgen.trust.manifest import PENDING_NAME, written_files


def is_subject(relative: str) -> bool:
    """Whether a run-folder file (POSIX path relative to the folder) is a statement subject.

    Everything is, except the signed outputs themselves (report.pdf, the envelope), the mark of a
    run being signed (``report.pending.json``, removed once signed), Hydra's
    job log (``*.log`` at the top; it keeps growing after signing), and hidden temporary
    files of an interrupted atomic write (``.name.xxxx``).
    """
    name = relative.rsplit("/", 1)[-1]
    if relative in (PDF_NAME, ENVELOPE_NAME, PENDING_NAME) or name.startswith("."):
        return False
    return not ("/" not in relative and name.endswith(".log"))


def run_files(out_dir: Path) -> list[str]:
    """Regular files of a run folder that are statement subjects, as sorted POSIX paths: those the
    run wrote (its manifest, ``reportgen.trust.manifest``), or every file of a folder without one."""
    out_dir = Path(out_dir)
    files = (p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file() and not p.is_symlink())
    written = written_files(out_dir)
    return sorted(f for f in files if is_subject(f) and (written is None or f in written))


def decimal_string(value: Any) -> str | None:
    """A number as an exact decimal string (shortest round-trip digits, no exponent).

    ``1e-05`` → ``"0.00001"``; ints stay ints as text; NaN/None → ``None``; ±inf → ``"inf"``.
    JSON readers differ on floats; a decimal string reads the same everywhere.
    """
    if value is None or isinstance(value, bool):
        return None if value is None else str(value).lower()
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(value):
        return None
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return np.format_float_positional(value, unique=True, trim="-")


def row_tolerances(frame: pd.DataFrame) -> dict:
    """What the rows say of their tolerances: ``used``, each distinct ``(rtol, atol)`` pair the parity rows (roles
    of kind ``PARITY``) were judged with (their ``rtol``/``atol`` columns, resolved once per tensor by its dtype:
    0, 0 for an integer one), with its row count; ``thresholds``, each distinct ``(check, metric, threshold)``.
    The statement signs it (:func:`claim_predicate`); ``reportgen.verify`` re-derives it from results.json.

    Returns:
        ``{"used": [{"rtol", "atol", "rows"}], "thresholds": [{"check", "metric", "threshold"}]}``, sorted.
    """
    parity = frame.reindex(columns=["role", "rtol", "atol"]).dropna()
    parity = parity[parity.role.isin(every_role(Kind.PARITY))]
    used = Counter(zip(map(decimal_string, parity.rtol), map(decimal_string, parity.atol)))
    thresholds = {(c, m, t) for c, m, t in zip(frame.check, frame.metric, frame.threshold) if isinstance(t, str) and t}
    return {
        "used": [{"rtol": r, "atol": a, "rows": n} for (r, a), n in sorted(used.items())],
        "thresholds": [{"check": c, "metric": m, "threshold": t} for c, m, t in sorted(thresholds)],
    }


def claim_predicate(frame: pd.DataFrame, meta: dict, verdict: str, required: Iterable[str]) -> dict:
    """The statement's predicate: what the report claims, with every number as a decimal string.

    Args:
        frame: the results frame (what results.json holds).
        meta: run metadata (``metadata.run_metadata``): claim, tolerances, environment.
        verdict: the claim verdict computed from ``frame`` and ``required``.
        required: the checks the verdict needs (``verdict.required``); ``reportgen.verify``
            recomputes the verdict from the attached results.json with this list.

    Returns:
        ``{"verdict", "required", "claim", "checks", "tolerances", "costs", "environment",
        "created", "command", "signer"}``, and ``"sweep"`` (``meta["sweep"]``: the job's number,
        overrides and launch digest, ``reportgen.trust.launch.job_launch``) for a sweep's job.
        ``costs`` repeats the rows whose role is of kind ``COST`` (``reportgen.results.Kind``: the
        claim's memory and time). ``tolerances``: ``rtol``, ``atol`` and ``source`` of the run (configured, or
        assert_close's default for its dtype: page 1's), plus :func:`row_tolerances` of ``frame``.
    """
    required = list(required)
    summary = check_summary(frame, required)
    seconds = frame.groupby("check", sort=False)["seconds"].sum() if len(frame) else pd.Series(dtype=float)
    checks = [
        {
            "check": s["check"],
            "status": s["status"],
            "required": bool(s["required"]),
            "rows": int(s["rows"]),
            "not_passing": int(s["failing"]),
            "seconds": decimal_string(seconds.get(s["check"], 0.0)),
        }
        for s in summary.to_dict("records")
    ]
    tol = meta["tolerances"]
    costs = [
        {
            "check": r["check"],
            "item": r["item"],
            "variant": r["variant"],
            "metric": r["metric"],
            "value": decimal_string(r["value"]),
            "status": r["status"],
        }
        for r in frame[frame.role.isin(every_role(Kind.COST))].to_dict("records")
    ]
    return {
        "verdict": verdict,
        "required": required,
        "claim": meta["claim"],
        "checks": checks,
        "tolerances": {
            "rtol": decimal_string(tol["rtol"]),
            "atol": decimal_string(tol["atol"]),
            "source": tol["source"],
            **row_tolerances(frame),
        },
        "costs": costs,
        "environment": {k: plain_value(v) for k, v in meta["environment"].items()},
        "created": meta["created"],
        "command": meta["command"],
        "signer": {"publicKeySha256": meta.get("signature", "").removeprefix("sha256:")},
        **({"sweep": meta["sweep"]} if meta.get("sweep") else {}),
    }


def build_statement(
    out_dir: Path, predicate: dict, names: Iterable[str] | None = None, predicate_type: str = PREDICATE_TYPE
) -> dict:
    """An in-toto Statement v1 over files of ``out_dir``.

    Args:
        out_dir: the document's folder.
        predicate: the statement's predicate (strict JSON: no NaN).
        names: the subjects, POSIX paths relative to ``out_dir``; ``None``: every file of the run
            (:func:`run_files`, see :func:`is_subject`).
        predicate_type: URI naming what the predicate means (a run's by default).

    Returns:
        ``{"_type", "subject": [{"name", "digest": {"sha256"}}], "predicateType", "predicate"}``.

    Raises:
        OSError: a subject cannot be read.
    """
    names = run_files(out_dir) if names is None else names
    subjects = [{"name": name, "digest": {"sha256": sha256_file(Path(out_dir) / name)}} for name in names]
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": predicate_type, "predicate": predicate}


def envelope_file_bytes(envelope: dict) -> bytes:
    """The one byte layout of statement.dsse.json (indent 2, sorted keys, ASCII, final newline).

    ``reportgen.verify`` re-serialises what it parsed and requires the same bytes, so an
    edit that JSON or base64 would tolerate (whitespace, escapes, key order, base64 padding
    bits) still fails verification; the unsigned ``keyid`` must name the ``--key`` key.
    """
    return (json.dumps(envelope, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode()


def sslib_public_key(public_key: ec.EllipticCurvePublicKey):
    """securesystemslib key whose keyid is ``sha256:<fingerprint>`` (the page-1 fingerprint)."""
    from securesystemslib.signer import SSlibKey

    return SSlibKey.from_crypto(public_key, keyid=f"sha256:{fingerprint(public_key)}")


def sign_statement(statement: dict, key: SigningKey) -> bytes:
    """Sign a statement in a DSSE envelope (securesystemslib ``CryptoSigner``, ECDSA P-256/SHA-256).

    Returns:
        The envelope file, as :func:`envelope_file_bytes` lays it out.

    Raises:
        ValueError: the statement holds a value JSON cannot carry (NaN, infinity).
    """
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner

    # the payload: canonical JSON (sorted keys, no spaces, ASCII only), one byte string per statement
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    envelope = Envelope(payload.encode(), PAYLOAD_TYPE, {})
    envelope.sign(CryptoSigner(key.private_key, sslib_public_key(key.public_key)))
    return envelope_file_bytes(envelope.to_dict())


def decode_b64(text: str) -> bytes:
    """Strict base64: alphabet only, and ``text`` must be the canonical encoding of the result.

    Raises:
        ValueError: anything else (Python's decoder alone ignores padding bits).
    """
    raw = base64.b64decode(text, validate=True)
    if base64.b64encode(raw).decode() != text:
        raise ValueError("base64 is not in canonical form")
    return raw
