"""Verify a comparison: its signed document, both runs it names, and that it follows from them.

``reportgen.commands.compare`` copies both runs' signed files into ``inputs/base`` and ``inputs/new`` of
the comparison folder and names each run's statement digest in its own statement. Verifying the
folder checks, beyond the document itself (``reportgen.verify.common``):

- each side's statement verifies with the same key and is the one the comparison names;
- each side's results.json (and ``.hydra/config.yaml`` where copied) is the file its own
  statement vouches for, and every row's status follows from its numbers;
- the comparison re-derived from the two sides (``reportgen.compare.derive.compare``, with the
  signed limits) equals the signed compare.json, byte for byte.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from reportgen.compare.derive import COMPARE_DOCUMENT, compare, comparison_frame, load_side
from reportgen.files import sha256_bytes, sha256_file
from reportgen.results import frame_to_json
from reportgen.trust.documents import ENVELOPE_NAME, RESULTS_NAME
from reportgen.verify.common import (
    Document,
    Verified,
    check_envelope,
    safe_relative,
    subject_digests,
    verify_document_dir,
    verify_lone_pdf,
)
from reportgen.verify.outcome import FAIL, Check, attempt, of_type, present, require
from reportgen.verify.run import RUN, check_verdict


def check_comparison_predicate(predicate: dict) -> str:
    """A comparison's predicate names two inputs (BASE, NEW) with their statement digests, and its outcome."""
    named = "the predicate does not name a BASE and a NEW run"
    inputs = of_type(predicate.get("inputs"), list, named)
    require([i.get("label") for i in inputs] == ["BASE", "NEW"], named)
    for side in inputs:
        require(
            isinstance(side.get("statement_sha256"), str),
            f"{side['label']} has no statement digest: only signed runs are compared under a signature",
        )
        require(isinstance(side.get("dir"), str) and safe_relative(side["dir"]), f"{side['label']} folder is malformed")
    require(predicate.get("outcome") in ("holds", "regressed", "cannot tell"), "the predicate has no outcome")
    return f"comparison, NEW {predicate['outcome']}"


#: A comparison: compare.pdf over compare.json.
COMPARISON = Document.of("comparison", COMPARE_DOCUMENT, check_comparison_predicate)


def _check_side(folder: Path, side: dict, public_key: ec.EllipticCurvePublicKey) -> Check:
    """One line per side: its statement verifies, is the named one, and vouches for its copied files."""

    def run() -> str:
        where = folder / side["dir"]
        raw = (where / ENVELOPE_NAME).read_bytes()
        require(sha256_bytes(raw) == side["statement_sha256"], "its statement is not the one the comparison names")
        checks, statement = check_envelope(raw, public_key, RUN)
        failed = [c for c in checks if c.status == FAIL]
        unverified = f"its statement does not verify: {failed[0].line if failed else ''}"
        require(not failed, unverified)
        statement = present(statement, unverified)
        digests = subject_digests(statement)
        for name in (RESULTS_NAME, ".hydra/config.yaml"):
            if (where / name).is_file():
                require(
                    digests.get(name) == sha256_file(where / name),
                    f"its {name} is not the one its statement vouches for",
                )
        verdict = check_verdict(statement, (where / RESULTS_NAME).read_bytes())
        require(verdict.status != FAIL, verdict.detail)
        return f"run statement verifies, claim {statement['predicate']['verdict']}; rows re-judged"

    return attempt(f"{side['label']} run", run)


def _rederived(folder: Path, predicate: dict, data: bytes | None) -> str:
    """The comparison re-derived from the two copied runs equals the signed compare.json."""
    require(data is not None, "not checked: no signed compare.json")
    base, new = (load_side(s["label"], folder / s["dir"]) for s in predicate["inputs"])
    base.verified = new.verified = True  # each was just verified above
    limits = predicate["limits"]
    allowed = limits.get("allow_different_controls", False)  # a comparison signed before the flag: False
    result = compare(base, new, limits["max_overhead_increase_pp"], limits["max_saving_decrease_pp"], allowed)
    require(frame_to_json(comparison_frame(result)).encode() == data, "compare.json does not follow from the two runs")
    require(
        result["outcome"] == predicate["outcome"],
        f"the statement says NEW {predicate['outcome']}, the runs give {result['outcome']}",
    )
    return f"compare.json = re-derived from both runs; NEW {result['outcome']}"


def verify_comparison(folder: Path, public_key: ec.EllipticCurvePublicKey) -> Verified:
    """A comparison folder: the document, both runs, and the comparison re-derived (module docstring)."""
    found = verify_document_dir(Path(folder), public_key, COMPARISON, note_unlisted=True)
    if found.statement is None:
        return found
    predicate = found.statement["predicate"]
    sides = [_check_side(Path(folder), side, public_key) for side in predicate["inputs"]]
    found.checks += sides
    if all(c.status != FAIL for c in sides):
        found.checks.append(attempt("comparison from runs", lambda: _rederived(Path(folder), predicate, found.data)))
    else:
        found.checks.append(Check(FAIL, "comparison from runs", "not checked: a run does not verify"))
    return found


def verify_comparison_pdf(data: bytes, public_key: ec.EllipticCurvePublicKey) -> Verified:
    """A lone compare.pdf: the document's own checks; re-deriving it needs the comparison folder."""
    said = "both runs' statement digests are signed; a lone compare.pdf cannot show them: verify the comparison folder "
    said += "to re-derive it"
    return verify_lone_pdf(data, public_key, COMPARISON, "runs", lambda statement: said)
