"""``python -m reportgen.sweep summarize SWEEP_DIR`` (console script ``reportgen-sweep``)."""

from __future__ import annotations

import sys
from pathlib import Path

from reportgen.files import OutputWriteError
from reportgen.sweep.jobs import job_dirs
from reportgen.sweep.summary import SweepMismatch, summarize
from reportgen.sweep.table import console_table
from reportgen.trust.signing import SigningError


def main(argv: list[str] | None = None) -> int:
    """``python -m reportgen.sweep summarize SWEEP_DIR``: write (again) and sign a sweep's summary.

    Returns:
        The worst job's exit code; 2 when the folder holds no sweep, the key is unusable or a
        file cannot be written.
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m reportgen.sweep", description="Write a sweep's summary again (e.g. after an interrupted one)."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    again = commands.add_parser("summarize", help="rewrite and sign the summary of a finished sweep folder")
    again.add_argument("sweep_dir", help="the sweep folder (hydra.sweep.dir, e.g. multirun/DATE/TIME)")
    again.add_argument("--key", help="signing key (default: as for a run)")
    again.add_argument("--no-sign", action="store_true", help="write an UNSIGNED summary")
    again.add_argument("--no-pdf", action="store_true", help="HTML, CSV and JSON only")
    args = parser.parse_args(argv)
    sweep_dir = Path(args.sweep_dir)
    if not sweep_dir.is_dir() or not job_dirs(sweep_dir):
        print(
            f"reportgen.sweep: cannot start: {sweep_dir} holds no sweep jobs (pass hydra.sweep.dir, "
            "e.g. multirun/DATE/TIME)",
            file=sys.stderr,
        )
        return 2
    try:
        frame, code = summarize(
            sweep_dir,
            sign=not args.no_sign,
            key_path=args.key,
            pdf=not args.no_pdf,
            command=f"python -m reportgen.sweep summarize {sweep_dir}",
            rewrite=True,
        )
    except (SigningError, OutputWriteError, SweepMismatch) as exc:
        said = "refused" if isinstance(exc, SweepMismatch) else "cannot write the summary"
        print(f"reportgen.sweep: {said}: {exc}", file=sys.stderr)
        return 2
    print(console_table(frame, code, sweep_dir / "summary.html"))
    return code
