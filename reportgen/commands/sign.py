"""``python -m reportgen.sign RUN_DIR``: render and sign a finished run that was interrupted before it was signed
(docs/trust.md, "A finished run can be signed later"): refuse a folder that is not one, whose seal does not hold,
whose manifest gained a file or whose rows do not follow from their numbers; then recompute the verdict from
results.json, render the report and sign it as the run would have. Exit codes: the run's (0, 1, 3); 2 refused
(one line: what cannot be signed and the fix, e.g. a claim a run refuses today); 70 reportgen's own bug (one
line; the traceback in the run's ``__main__.log``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from reportgen.checks import required_names
from reportgen.ci import JUNIT_NAME, SUMMARY_NAME, VERDICT_NAME, finish_ci_outputs, write_ci_outputs
from reportgen.ci.summary import SAID
from reportgen.ci.verdict import exit_code
from reportgen.claim import ClaimError, claim_required, parse_claim
from reportgen.errors import ExitCode, console_text, exception_label
from reportgen.files import WRITE_ERRNOS, OutputWriteError, write_failure
from reportgen.report.render import render_report
from reportgen.results import claim_verdict, frame_from_json, results_csv
from reportgen.trust.documents import ENVELOPE_NAME, PDF_NAME, RESULTS_NAME, UNSIGNED_PDF_NAME
from reportgen.trust.keys import SigningError, load_signing_key
from reportgen.trust.manifest import (
    PENDING_NAME,
    changed_since_seal,
    clear_pending,
    planted,
    seal_holds,
    start_manifest,
)
from reportgen.trust.signing import sign_run
from reportgen.verify.run import status_mismatches

#: What an interrupted render or signing may have left; rewritten by :func:`finish_run`.
LEFT_HALF_DONE = ("report.html", PDF_NAME, UNSIGNED_PDF_NAME, ENVELOPE_NAME, JUNIT_NAME, SUMMARY_NAME, VERDICT_NAME)


class FinishRefusedError(Exception):
    """The folder is not a finished, unsigned run, or its rows do not follow from their numbers."""


def pending_record(run_dir: Path) -> dict:
    """The mark of a finished, unsigned run.

    Raises:
        FinishRefusedError: no such folder, no mark, no results.json, or already signed.
    """
    if not run_dir.is_dir():
        raise FinishRefusedError(f"{run_dir}: no such run folder")
    mark = run_dir / PENDING_NAME
    if not mark.is_file():
        state = "signed already" if (run_dir / ENVELOPE_NAME).is_file() else "not a finished run waiting to be signed"
        raise FinishRefusedError(
            f"{run_dir} is {state} (no {PENDING_NAME}); only a run interrupted after all its "
            "checks finished is signed later"
        )
    if not (run_dir / RESULTS_NAME).is_file():
        raise FinishRefusedError(
            f"{run_dir} has no {RESULTS_NAME}: its checks did not all finish, so there is nothing to sign"
        )
    try:
        return json.loads(mark.read_text())
    except (OSError, ValueError) as exc:
        raise FinishRefusedError(f"{mark} cannot be read ({exc}); run the checks again") from None


def unsignable_claim(run_dir: Path, cfg, record: dict) -> None:
    """Refuse a run whose claim a run would refuse today (a clause that cannot miss, a bound beyond any finite
    value: :func:`reportgen.claim.parse_claim`) or whose mark holds a number JSON cannot carry (the signed
    statement is strict JSON), before anything is written.

    Raises:
        FinishRefusedError: one line naming the clause or the value and the fix.
    """
    try:
        parse_claim(cfg.get("claim"))
    except ClaimError as exc:
        raise FinishRefusedError(
            f"{run_dir}: its claim cannot be signed: {exc}. Nothing was signed: fix claim.clauses and run the checks again"
        ) from None
    try:
        json.dumps(record.get("meta"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise FinishRefusedError(
            f"{run_dir / PENDING_NAME}: its metadata holds a value a signed statement cannot carry ({exc}); "
            "nothing was signed: run the checks again"
        ) from None


def finish_run(run_dir: str | Path, key_path: str | None = None) -> str:
    """Re-judge, render and sign the run folder ``run_dir``, a finished run interrupted before it was signed
    (module docstring); returns the claim verdict, recomputed from results.json. ``key_path`` is the private key
    (default: as for a run: ``report.key_path`` of the run's config, ``$REPORTGEN_SIGNING_KEY``,
    ``~/.config/reportgen/signing-key.pem``).

    Raises:
        FinishRefusedError: see :func:`pending_record`, or rows whose status does not follow.
        reportgen.trust.keys.SigningError: no usable key.
    """
    run_dir = Path(run_dir)
    record = pending_record(run_dir)
    config = run_dir / ".hydra" / "config.yaml"
    cfg = OmegaConf.load(config) if config.is_file() else OmegaConf.create({})
    key = load_signing_key(True, key_path or OmegaConf.select(cfg, "report.key_path", default=None))
    if key is None:  # load_signing_key(True, ...) raises rather than return None; the type says otherwise
        raise SigningError("no signing key")
    if not isinstance(record, dict) or "seal" not in record:
        raise FinishRefusedError(
            f"{run_dir / PENDING_NAME} carries no seal (the run did not sign, or it is not reportgen's mark); "
            "nothing was signed: run the checks again"
        )
    if not seal_holds(run_dir, record, key.public_key):
        changed = changed_since_seal(run_dir, record)
        what = (
            f"{', '.join(changed[:3])}{' and more' if len(changed) > 3 else ''} changed after the checks finished"
            if changed
            else f"the mark ({PENDING_NAME}) changed after the checks finished (or the seal is another key's than "
            f"{key.path})"
        )
        raise FinishRefusedError(
            f"{run_dir}: {what}; only what the run measured is signed: nothing was signed, run the checks again"
        )
    extra = planted(run_dir, record, LEFT_HALF_DONE)
    if extra:
        raise FinishRefusedError(
            f"{run_dir}: {', '.join(extra[:3])} entered the run's manifest after its checks finished; only what the "
            "run wrote is signed: nothing was signed, remove it (and its manifest line) or run the checks again"
        )
    unsignable_claim(run_dir, cfg, record)
    frame = frame_from_json((run_dir / RESULTS_NAME).read_text())
    csv = run_dir / "results.csv"
    if not csv.is_file() or csv.read_text() != results_csv(frame):
        raise FinishRefusedError(
            f"{run_dir}: results.csv is not results.json's rows; nothing was signed: run the checks again"
        )
    peak_on_miss = OmegaConf.select(cfg, "memory.peak_on_miss", default=None)
    wrong = status_mismatches(frame, {"memory.peak_on_miss": peak_on_miss})
    if wrong:
        raise FinishRefusedError(
            f"{len(wrong)} row(s) of {run_dir / RESULTS_NAME} state a status their numbers do "
            f"not give, e.g. {wrong[0]}; nothing was signed"
        )
    world = int(OmegaConf.select(cfg, "distributed.world_size", default=1) or 1)
    required = required_names(
        OmegaConf.select(cfg, "verdict.required", default=None), distributed=world > 1
    ) + claim_required(cfg.get("claim"))
    verdict = claim_verdict(frame, required)
    for name in LEFT_HALF_DONE:
        (run_dir / name).unlink(missing_ok=True)
    start_manifest(run_dir)
    meta = record["meta"] | {"signature": f"sha256:{key.fingerprint}"}
    render_report(frame, meta, verdict, run_dir, pdf=bool(record.get("pdf", True)), required=required)
    write_ci_outputs(frame, meta, verdict, required, run_dir)  # as the run would have: signed with the rest
    sign_run(frame, meta, verdict, run_dir, key, required=required)
    clear_pending(run_dir)
    finish_ci_outputs(frame, verdict, run_dir)
    return verdict


def _traceback_log(run_dir: Path, exc: BaseException) -> Path:
    """Append ``exc``'s traceback to the run's own log (Hydra's ``__main__.log``, never a statement subject) when
    the folder has one, else to a new file in the temporary folder; returns the file written."""
    text = "reportgen.sign failed:\n" + "".join(traceback.format_exception(exc))
    log = run_dir / "__main__.log"
    try:
        if log.is_file():
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(text)
            return log
    except OSError:
        pass
    fd, name = tempfile.mkstemp(prefix="reportgen-sign-", suffix=".log")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return Path(name)


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring. Returns 0, 1 or 3 (the claim), or 2 (refused)."""
    parser = argparse.ArgumentParser(
        prog="python -m reportgen.sign",
        description="Render and sign a finished run that was interrupted before signing.",
    )
    parser.add_argument("run_dir", help="the run folder (outputs/DATE/TIME) holding report.pending.json")
    parser.add_argument("--key", help="private signing key (default: as for a run)")
    args = parser.parse_args(argv)
    try:
        verdict = finish_run(args.run_dir, args.key)
    except (FinishRefusedError, SigningError) as exc:
        print(f"reportgen.sign: refused: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except OSError as exc:  # a full disk or read-only folder is the user's to fix: one line, exit 2
        if exc.errno not in WRITE_ERRNOS:
            raise
        failure = exc if isinstance(exc, OutputWriteError) else write_failure(Path(exc.filename or args.run_dir), exc)
        print(f"reportgen.sign: {failure}; results.json and the mark are kept: run it again", file=sys.stderr)
        return int(ExitCode.USAGE)
    except Exception as exc:  # noqa: BLE001 - reportgen's own bug: one line, the traceback in a log file
        log = _traceback_log(Path(args.run_dir), exc)
        print(
            f"reportgen.sign: internal error, a bug in reportgen: {exception_label(exc)}: "
            f"{console_text((str(exc).strip().splitlines() or [''])[0])}. Full traceback: {log}. Nothing was signed; "
            "results.json and the mark are kept. Please report it with that log.",
            file=sys.stderr,
        )
        return int(ExitCode.BUG)
    said = SAID.get(verdict, "FAILS")
    print(
        f"reportgen.sign: signed {Path(args.run_dir)}; every row re-judged from results.json; claim {said} ({verdict})"
    )
    return exit_code(verdict)
