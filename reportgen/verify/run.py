"""Verify one run: a run folder or its lone report.pdf (checks 1-8 of ``reportgen.verify``)."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec
from omegaconf import OmegaConf

from reportgen.checks import flagged_names, roles_of
from reportgen.checks.controls.limit import limit_problems, stated_limit
from reportgen.checks.controls.rows import FAULTS
from reportgen.ci.verdict import VERDICT_NAME
from reportgen.config import CONTROLS, RELEASE_CLAIM
from reportgen.results import Kind, Role, Status, claim_verdict, frame_from_json, judge_record, results_csv
from reportgen.trust.documents import RUN_DOCUMENT
from reportgen.trust.statement import row_tolerances
from reportgen.verify.claim import check_claim, check_verdict_file
from reportgen.verify.common import Document, Verified, subject_digests, verify_document_dir, verify_signed_pdf
from reportgen.verify.outcome import FAIL, Check, attempt, require


def configured_on_miss(record: dict, config: dict | None) -> str | None:
    """The ``on_miss`` the checks give this row, where it does not come from the row itself: FAIL
    for a recompute parity row (a role of kind ``PARITY`` that a registered check declares,
    ``reportgen.checks.roles_of``: a miss is always FAIL, no setting makes it advisory, whatever
    ``on_miss`` the row says); INCONCLUSIVE for a detector control (a missed fault); ``memory.peak_on_miss``
    of ``config`` (a flattened run config) for the step-peak saving; ``None`` (the row's own) otherwise."""
    if record.get("role") in roles_of(Kind.PARITY) and record.get("variant") == "recompute":
        return Status.FAIL
    if record.get("role") == Role.CONTROL:
        return Status.INCONCLUSIVE
    if record.get("role") == Role.PEAK_SAVING and config and config.get("memory.peak_on_miss"):
        return str(config["memory.peak_on_miss"]).strip("\"'")  # a flattened config holds it as JSON text
    return None


def status_mismatches(frame, config: dict | None = None) -> list[str]:
    """Rows whose stated status is not the one their values give, one line each (empty = all agree).

    A row with a comparator must carry ``judge_record``'s status, judged with the ``on_miss`` the
    checks configure (:func:`configured_on_miss`, never a lenient one a row was edited to say); a
    row without one may state only a fact (never PASS or FAIL); FLAGGED belongs to flagged
    experiments only.

    Args:
        frame: the results frame.
        config: the run's config flattened to ``{"memory.peak_on_miss": ...}`` (optional).
    """
    flagged = flagged_names()
    problems = []
    for record in frame.to_dict("records"):
        record = {k: v for k, v in record.items() if not (isinstance(v, float) and v != v)}
        stated = record.get("status")
        name = f"{record.get('check')} / {record.get('item')} / {record.get('variant')} / {record.get('metric')}"
        configured = configured_on_miss(record, config)
        if record.get("comparator") and configured and (record.get("on_miss") or Status.FAIL) != configured:
            problems.append(f"row {name} says on_miss {record.get('on_miss')!r}; its check misses as {configured}")
        if record.get("comparator"):
            expected = judge_record(record)
            if expected != stated:
                problems.append(
                    f"row {name} says {stated}, its value {record.get('value')!r} "
                    f"{record.get('comparator')} {record.get('threshold_value', record.get('threshold'))!r} "
                    f"gives {expected}"
                )
        elif stated in (Status.PASS, Status.FAIL):
            problems.append(f"row {name} says {stated} without a comparison to derive it from")
        if (stated == Status.FLAGGED) != (record.get("check") in flagged):
            problems.append(
                f"row {name} says {stated}, but only the flagged experiments "
                f"({', '.join(sorted(flagged))}) are FLAGGED, and all their rows"
            )
    return problems


def check_verdict(statement: dict, results: bytes) -> Check:
    """Check 8: every row's status follows from its signed numbers, and the statement's verdict
    follows from those statuses (``results.claim_verdict``)."""

    def recompute() -> str:
        predicate = statement["predicate"]
        frame = frame_from_json(results.decode())
        wrong = status_mismatches(frame)
        require(not wrong, "; ".join(wrong[:3]) + (f" (and {len(wrong) - 3} more rows)" if len(wrong) > 3 else ""))
        recomputed = claim_verdict(frame, predicate["required"])
        require(
            recomputed == predicate["verdict"],
            f"the statement says {predicate['verdict']}, results.json gives {recomputed}",
        )
        return (
            f"statement {predicate['verdict']} = recomputed from the {len(frame)} row statuses of results.json "
            f"(each recomputed from its value) with required checks {', '.join(predicate['required']) or '(none)'}"
        )

    return attempt("verdict", recompute)


def _listed(entries: list[dict]) -> str:
    """``atol=0.00001 rows=42 rtol=0.0000013, ...``: predicate entries on one line, keys sorted."""
    return ", ".join(" ".join(f"{k}={e[k]}" for k in sorted(e)) for e in entries) or "none"


def check_tolerances(predicate: dict, frame) -> str:
    """The statement's tolerances are the rows': ``used`` and ``thresholds`` re-derived from the signed
    results.json (``reportgen.trust.statement.row_tolerances``), and its ``rtol``/``atol`` (page 1's) a pair used."""
    stated, derived = predicate.get("tolerances") or {}, row_tolerances(frame)
    for key, want in derived.items():
        if key == "used" and key not in stated:  # signed before statements listed them: the pair below still is
            continue
        got = stated.get(key) or []
        extra, missing = [e for e in got if e not in want], [e for e in want if e not in got]
        require(got == want, f"tolerances.{key}: the statement says {_listed(extra)}, results.json {_listed(missing)}")
    headline = {"rtol": stated.get("rtol"), "atol": stated.get("atol")}
    pairs = [{"rtol": u["rtol"], "atol": u["atol"]} for u in derived["used"]]
    require(not pairs or headline in pairs, f"the statement's {_listed([headline])} is no pair the parity rows used")
    return f"the parity rows of results.json used {_listed(derived['used'])}, as the statement says"


def check_limit(frame) -> str:
    """The detection limit follows from its probes (``reportgen.checks.controls.limit.limit_problems``): an edited
    limit, threshold or ``on_miss`` fails naming it."""
    problems = limit_problems(frame)
    require(not problems, "; ".join(problems))
    stated = stated_limit(frame)
    if stated is None:
        return "none stated (the detector controls did not run)"
    if not stated["measured"]:
        return f"stated without a search: {stated['detail']}"
    value = "none caught up to 1" if stated["value"] is None else f"{stated['value']:.0e} relative"
    return f"{value} in region {stated['region']!r}, re-derived from its probes"


def check_csv(path: Path, frame) -> str:
    """results.csv holds exactly results.json's rows (the CSV pandas writes of the signed frame, byte for
    byte): a signed CSV can never say other than the signed JSON it sits beside."""
    require(path.read_text() == results_csv(frame), "results.csv is not the rows of results.json")
    return f"the {len(frame)} rows of results.json, byte for byte"


def check_run_predicate(predicate: dict) -> str:
    """A run's predicate states a verdict (PASS, FAIL or INCONCLUSIVE) and a non-empty list of
    required checks: a claim that requires nothing is empty and never verifies."""
    require(
        predicate.get("verdict") in (Status.PASS, Status.FAIL, Status.INCONCLUSIVE)
        and isinstance(predicate.get("required"), list),
        "the predicate has no verdict or required checks",
    )
    require(len(predicate["required"]) > 0, "the claim requires no check (verdict.required=[]): an empty claim")
    return f"claim verdict {predicate['verdict']}"


def check_controls(config_text: str, frame) -> str:
    """The detector controls are the signed config's: where ``.hydra/config.yaml`` says ``controls.enabled: true``,
    results.json holds a row of every fault (``reportgen.checks.controls.rows.FAULTS``), or an ERROR row of the
    check itself, and no "controls.enabled=false" row; a results.json re-signed with control rows deleted (the one
    that made the claim INCONCLUSIVE, say) fails naming the faults it lacks."""
    config = OmegaConf.to_container(OmegaConf.create(config_text)) if config_text.strip() else {}
    controls = config.get("controls") if isinstance(config, dict) else None
    enabled = controls.get("enabled") if isinstance(controls, dict) else None
    rows = frame[frame.check == CONTROLS]
    if enabled is not True:
        return f"the signed config sets controls.enabled: {enabled}; {len(rows)} control rows"
    require(not (rows.role == Role.DISABLED).any(), "a row says the controls were off; the config says enabled: true")
    if (rows.status == Status.ERROR).any():
        return f"the signed config enables them; the check raised (an ERROR row), {len(rows)} rows"
    missing = [f for f in FAULTS if not ((rows.role == Role.CONTROL) & (rows["item"] == f)).any()]
    require(
        not missing,
        f"the signed .hydra/config.yaml says controls.enabled: true, but results.json has no row of the control(s) "
        f"{', '.join(map(repr, missing))}",
    )
    return f"the signed config enables them and results.json has a row of each of the {len(FAULTS)} faults"


#: A run: report.pdf over results.json (docs/architecture.md, "Outputs").
RUN = Document.of("run", RUN_DOCUMENT, check_run_predicate)


def _with_verdict(found: Verified, folder: Path | None = None) -> list[Check]:
    """The document's checks plus check 8 on the results.json its statement vouches for: row
    statuses and verdict, the release claim's clauses (``reportgen.verify.claim``) and, in a
    folder, verdict.json (which replaces its "not covered" note)."""
    if found.statement is None:
        return found.checks
    if found.data is None:
        return found.checks + [Check(FAIL, "verdict", "not checked: no signed results.json")]
    checks = [check_verdict(found.statement, found.data)]
    try:
        frame = frame_from_json(found.data.decode())
    except ValueError:
        return found.checks + checks
    predicate = found.statement["predicate"]
    checks.append(attempt(RELEASE_CLAIM, lambda: check_claim(predicate, frame)))
    checks.append(attempt("tolerances", lambda: check_tolerances(predicate, frame)))
    checks.append(attempt("detection limit", lambda: check_limit(frame)))
    if folder is not None and (folder / "results.csv").is_file():
        checks.append(attempt("results.csv", lambda: check_csv(folder / "results.csv", frame)))
    config = folder / ".hydra" / "config.yaml" if folder is not None else None
    if config is not None and config.is_file() and ".hydra/config.yaml" in subject_digests(found.statement):
        checks.append(attempt("detector controls", lambda: check_controls(config.read_text(), frame)))
    if folder is not None:
        found.checks = [c for c in found.checks if c.name != f"not covered: {VERDICT_NAME}"]
        checks += [c for c in [check_verdict_file(folder, predicate, frame)] if c is not None]
    return found.checks + checks


def verify_run_pdf(data: bytes, public_key: ec.EllipticCurvePublicKey) -> Verified:
    """A lone report.pdf's checks (1-8) and what they vouch for (the statement, results.json)."""
    found = verify_signed_pdf(data, public_key, RUN)[0]
    found.checks = _with_verdict(found)
    return found


def verify_run(run_dir: Path, public_key: ec.EllipticCurvePublicKey) -> Verified:
    """A run folder's checks and what they vouch for (the statement, results.json's bytes)."""
    found = verify_document_dir(Path(run_dir), public_key, RUN)
    found.checks = _with_verdict(found, Path(run_dir))
    return found
