"""``python -m reportgen.sign RUN_DIR``: render and sign a finished run that was interrupted before it was signed.

A run whose checks all finished writes results.json, then marks its folder
(``report.pending.json``, :mod:`reportgen.trust.manifest`) while it renders the report and signs
it, and removes the mark when done. Ctrl-C or SIGTERM in that window leaves the mark, and the
console says "all checks finished; the report was not signed". This command finishes such a run:

1. refuses a folder that is not one (no mark, no results.json, or already signed), in one line;
2. re-judges every row of results.json from its own numbers (``reportgen.verify.run.
   status_mismatches``, the verifier's own rule) and refuses a frame whose stated statuses do not
   follow; the verdict is recomputed from those rows (``results.claim_verdict``) with the run's
   ``verdict.required``, never read from anywhere else;
3. refuses a folder whose manifest lists a file the run had not written when its checks finished
   (the seal covers every file written by then: results.csv, Hydra's files, ...), or whose
   results.csv is not results.json's rows, byte for byte;
4. removes what the interrupted run left half done (report, unsigned PDF, statement: never a
   signed output, as the mark says signing had not finished), renders the report and signs it
   like the run would have (subjects: the run's manifest plus what it writes now).

Exit codes: those of the run (0 holds, 1 fails, 3 cannot be judged) once signed; 2 refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from reportgen.checks import required_names
from reportgen.ci import JUNIT_NAME, SUMMARY_NAME, VERDICT_NAME, finish_ci_outputs, write_ci_outputs
from reportgen.claim import claim_required
from reportgen.errors import ExitCode
from reportgen.files import WRITE_ERRNOS, OutputWriteError, write_failure
from reportgen.report.render import render_report
from reportgen.results import Status, claim_verdict, frame_from_json
from reportgen.trust.manifest import PENDING_NAME, clear_pending, planted, seal_holds, start_manifest
from reportgen.trust.signing import (
    ENVELOPE_NAME,
    PDF_NAME,
    RESULTS_NAME,
    UNSIGNED_PDF_NAME,
    SigningError,
    load_signing_key,
    sign_run,
)
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
        signed = (run_dir / ENVELOPE_NAME).is_file()
        state = "signed already" if signed else "not a finished run waiting to be signed"
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


def finish_run(run_dir: str | Path, key_path: str | None = None) -> str:
    """Re-judge, render and sign a finished run interrupted before it was signed (module docstring).

    Args:
        run_dir: the run folder.
        key_path: the private key (default: as for a run: ``report.key_path`` of the run's config,
            ``$REPORTGEN_SIGNING_KEY``, ``~/.config/reportgen/signing-key.pem``).

    Returns:
        The claim verdict, recomputed from results.json.

    Raises:
        FinishRefusedError: see :func:`pending_record`, or rows whose status does not follow.
        reportgen.trust.signing.SigningError: no usable key.
    """
    run_dir = Path(run_dir)
    record = pending_record(run_dir)
    config = run_dir / ".hydra" / "config.yaml"
    cfg = OmegaConf.load(config) if config.is_file() else OmegaConf.create({})
    configured_key = key_path or OmegaConf.select(cfg, "report.key_path", default=None)
    key = load_signing_key(True, configured_key)
    if key is None:  # load_signing_key(True, ...) raises rather than return None; the type says otherwise
        raise SigningError("no signing key")
    if not isinstance(record, dict) or "seal" not in record:
        raise FinishRefusedError(
            f"{run_dir / PENDING_NAME} carries no seal (the run did not sign, or it is not reportgen's mark); "
            "nothing was signed: run the checks again"
        )
    if not seal_holds(run_dir, record, key.public_key):
        raise FinishRefusedError(
            f"{run_dir}: results.json, the config or the mark changed after the checks finished (or the seal is "
            f"another key's than {key.path}); only what the run measured is signed: nothing was signed, run the checks again"
        )
    extra = planted(run_dir, record, LEFT_HALF_DONE)
    if extra:
        raise FinishRefusedError(
            f"{run_dir}: {', '.join(extra[:3])} entered the run's manifest after its checks finished; only what the "
            "run wrote is signed: nothing was signed, remove it (and its manifest line) or run the checks again"
        )
    frame = frame_from_json((run_dir / RESULTS_NAME).read_text())
    csv = run_dir / "results.csv"
    if not csv.is_file() or csv.read_text() != frame.to_csv(index=False):
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
    said = {str(Status.PASS): "HOLDS", str(Status.INCONCLUSIVE): "CANNOT BE JUDGED"}.get(verdict, "FAILS")
    print(
        f"reportgen.sign: signed {Path(args.run_dir)}; every row re-judged from results.json; claim {said} ({verdict})"
    )
    return int(
        {str(Status.PASS): ExitCode.HOLDS, str(Status.INCONCLUSIVE): ExitCode.INCONCLUSIVE}.get(verdict, ExitCode.FAILS)
    )
