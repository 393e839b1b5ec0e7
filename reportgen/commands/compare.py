"""``python -m reportgen.compare BASE NEW [--key PUB]``: what changed since the last release's report
(docs/reviewers.md, "Compare with the last release"; exit codes: docs/exit-codes.md).

BASE and NEW are run folders or signed ``report.pdf`` files. Both are verified first (with ``--key`` or else the
public key beside the default signing key) and every row of both is re-judged from its numbers; the comparison
(``compare.csv/json/html/pdf``, the verdicts, each check's status, costs, tolerances and config diff, NEW against
BASE) is signed only when both sides verify, with copies of both sides' signed files under ``inputs/`` so
``reportgen.verify`` can re-derive it. Nothing unverified yields 0 or 1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import shutil
import sys
from pathlib import Path

from reportgen.ci.junit import JUNIT_NAME, comparison_junit_xml
from reportgen.ci.summary import SUMMARY_NAME, append_step_summary, comparison_markdown
from reportgen.compare.derive import (
    COMPARE_DOCUMENT,
    MAX_OVERHEAD_INCREASE_PP,
    MAX_SAVING_DECREASE_PP,
    OUTCOME_EXIT,
    CompareError,
    Side,
    compare,
    comparison_frame,
    load_side,
    not_comparable,
)
from reportgen.errors import ExitCode
from reportgen.files import atomic_write
from reportgen.report.metadata import report_time
from reportgen.report.pdf import write_pdf
from reportgen.report.render import environment
from reportgen.results import frame_to_json
from reportgen.trust.attachments import read_attachments
from reportgen.trust.documents import ENVELOPE_NAME, RESULTS_NAME
from reportgen.trust.keys import (
    KeyFileError,
    SigningError,
    default_key_path,
    load_public_key,
    load_signing_key,
    public_key_path,
    signature_label,
)
from reportgen.trust.signing import sign
from reportgen.verify import verify
from reportgen.verify.outcome import FAIL
from reportgen.verify.run import status_mismatches

#: Where a side's signed files are copied inside the comparison folder, by label.
INPUTS = {"BASE": "inputs/base", "NEW": "inputs/new"}
#: A run folder's files that a comparison re-derives from (relative to the run folder).
SIDE_FILES = (RESULTS_NAME, ENVELOPE_NAME, ".hydra/config.yaml")


def render_comparison(
    result: dict, base: Side, new: Side, out_dir: Path, created: str, signature: str, pdf: bool = True
) -> dict[str, Path]:
    """Write compare.csv, compare.json, compare.html (and compare.pdf) into ``out_dir``.

    Raises:
        FileExistsError: a comparison exists already in ``out_dir``.
    """
    frame = comparison_frame(result)
    table = frame_to_json(frame)
    sides = [
        {k: getattr(s, k) for k in ("label", "verdict", "verified", "verify_lines")}
        | {"path": str(s.path), "signed": s.statement is not None}
        | {"created": (s.statement or {}).get("predicate", {}).get("created", "—")}
        for s in (base, new)
    ]
    template = environment().get_template("compare.html.j2")
    html = template.render(result=result, created=created, signature=signature, sides=sides)
    paths = {
        "csv": atomic_write(out_dir / "compare.csv", frame.to_csv(index=False)),
        "json": atomic_write(out_dir / "compare.json", table),
        "html": atomic_write(out_dir / "compare.html", html),
    }
    if pdf:
        attached = ("compare.json", table.encode(), "Data", "The comparison this document was rendered from.")
        paths["pdf"] = atomic_write(out_dir / "compare.pdf", write_pdf(html, created, [attached]))
    return paths


def check_side(side: Side, public_key, given: bool) -> None:
    """Verify ``side`` with ``public_key`` (None: only re-judge its rows) and set ``side.verified``: True verified;
    False a row states a status its numbers do not give, or it does not verify with a key ``given`` by ``--key``
    (exit 1); None not verified otherwise (with the default key: the comparison stays unsigned). Also sets
    ``side.verify_lines`` and ``side.problem``."""
    wrong = status_mismatches(side.frame, side.config)  # on_miss as the checks configure it, not the row's own
    if public_key is not None:
        checks = verify(side.path, public_key)
        side.verify_lines = [c.line for c in checks]
        failed = [c.line for c in checks if c.status == FAIL]
        side.verified = True if not failed else (False if given else None)
        side.problem = f"does not verify with the {'given' if given else 'default'} key: {failed[0]}" if failed else ""
    if wrong:
        side.verified, side.problem = False, f"{len(wrong)} row(s) state a status their numbers do not give: {wrong[0]}"
        side.verify_lines += [f"FAIL {line}" for line in wrong]


def copy_inputs(side: Side, out_dir: Path) -> list[str]:
    """Copy a side's signed files into ``out_dir/inputs/<label>`` (from the folder, or from the PDF's
    attachments); returns their paths relative to ``out_dir`` (statement subjects)."""
    target = out_dir / INPUTS[side.label]
    written = []
    if side.path.is_dir():
        sources = {name: side.path / name for name in SIDE_FILES if (side.path / name).is_file()}
        for name, source in sources.items():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / name)
            written.append(f"{INPUTS[side.label]}/{name}")
    else:
        files = read_attachments(side.path.read_bytes())
        target.mkdir(parents=True, exist_ok=True)
        for name in (RESULTS_NAME, ENVELOPE_NAME):
            if name in files:
                atomic_write(target / name, files[name])
                written.append(f"{INPUTS[side.label]}/{name}")
    return written


def _out_dir(given: str | None) -> Path:
    """``--out``, or ``outputs/comparisons/DATE/TIME`` (like Hydra's run folders).

    Raises:
        CompareError: ``--out`` exists already (a comparison never overwrites one).
    """
    if given:
        out = Path(given)
        if out.exists():
            raise CompareError(
                f"--out {out} exists already; a comparison never writes into an existing folder: "
                "choose a new folder or leave --out out (outputs/comparisons/DATE/TIME)"
            )
        return out
    now = dt.datetime.now()
    return Path("outputs") / "comparisons" / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S-%f")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reportgen.compare", description="Compare a new reportgen report with the last release's."
    )
    parser.add_argument("base", help="the last release's run folder or report.pdf")
    parser.add_argument("new", help="the new run folder or report.pdf")
    parser.add_argument(
        "--key",
        help="public key (PEM) both reports must verify with (default: the public key beside the default signing key)",
    )
    parser.add_argument("--out", help="a new folder for the comparison (default outputs/comparisons/DATE/TIME)")
    parser.add_argument(
        "--max-overhead-increase-pp",
        "--compare.max_overhead_increase_pp",
        type=float,
        default=MAX_OVERHEAD_INCREASE_PP,
        dest="max_overhead",
        help="largest allowed rise of the overhead ratio, percentage points (default %(default)s)",
    )
    parser.add_argument(
        "--max-saving-decrease-pp",
        "--compare.max_saving_decrease_pp",
        type=float,
        default=MAX_SAVING_DECREASE_PP,
        dest="max_saving",
        help="largest allowed drop of the saved-activation share, percentage points (default %(default)s)",
    )
    parser.add_argument(
        "--allow-different-controls",
        action="store_true",
        help="compare runs that differ in their detector controls (one with them, one without) instead of "
        "'cannot tell' (exit 3); stated in the comparison",
    )
    parser.add_argument(
        "--signing-key",
        help="private key that signs the comparison (default: as for a run: "
        "$REPORTGEN_SIGNING_KEY, else ~/.config/reportgen/signing-key.pem)",
    )
    parser.add_argument("--no-sign", action="store_true", help="write an UNSIGNED comparison")
    parser.add_argument("--no-pdf", action="store_true", help="HTML only")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring. Returns the exit code (0, 1, 2 or 3)."""
    args = _parser().parse_args(argv)
    for noisy in ("pyhanko", "pyhanko_certvalidator", "securesystemslib", "fontTools", "weasyprint", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    try:
        public_key = load_public_key(args.key) if args.key else None
        if not args.key:  # the public key beside the default signing key, when there is one
            with contextlib.suppress(KeyFileError, OSError):
                public_key = load_public_key(public_key_path(default_key_path()[0]))
        signing_key = load_signing_key(not args.no_sign, args.signing_key)
        base, new = load_side("BASE", args.base), load_side("NEW", args.new)
        if not_comparable(base, new):
            raise CompareError(not_comparable(base, new))
        out_dir = _out_dir(args.out)
    except (KeyFileError, SigningError, CompareError) as exc:
        print(f"reportgen.compare: cannot start: {exc}".replace("report.sign=false", "--no-sign"), file=sys.stderr)
        return ExitCode.USAGE
    for side in (base, new):
        check_side(side, public_key, given=bool(args.key))
        said = {True: "VERIFIED", False: "NOT VERIFIED", None: "NOT VERIFIED"}
        print(f"{side.label} {said[side.verified]}: {side.path}" + (f" ({side.problem})" if side.problem else ""))
    unverified = [s.label for s in (base, new) if not s.verified]
    if signing_key is not None and unverified:
        print(
            f"reportgen.compare: the comparison is written UNSIGNED: {' and '.join(unverified)} did not verify, "
            "and reportgen signs only what it verified"
        )
        signing_key = None
    result = compare(base, new, args.max_overhead, args.max_saving, args.allow_different_controls)
    code = OUTCOME_EXIT[result["outcome"]]
    out_dir.mkdir(parents=True)
    created = report_time()
    render_comparison(result, base, new, out_dir, created, signature_label(signing_key), pdf=not args.no_pdf)
    summary = comparison_markdown(result, str(base.path), str(new.path), out_dir)  # CI outputs, signed below
    atomic_write(out_dir / JUNIT_NAME, comparison_junit_xml(result, f"reportgen compare ({out_dir.name})"))
    atomic_write(out_dir / SUMMARY_NAME, summary)
    if signing_key is not None:
        inputs = [*copy_inputs(base, out_dir), *copy_inputs(new, out_dir)]
        predicate = {"exit_code": code, "created": created}
        predicate |= {k: result[k] for k in ("outcome", "holds", "regressions", "unclear", "verdicts", "limits")}
        predicate |= {
            "signer": {"publicKeySha256": signing_key.fingerprint},
            "inputs": [
                {"label": s.label, "path": str(s.path), "dir": INPUTS[s.label], "statement_sha256": s.envelope_sha256}
                for s in (base, new)
            ],
        }
        subjects = ["compare.csv", "compare.json", "compare.html", JUNIT_NAME, SUMMARY_NAME, *inputs]
        reason = f"reportgen comparison; NEW {result['outcome']}"
        sign(out_dir, COMPARE_DOCUMENT, predicate, signing_key, reason, subjects)
    append_step_summary(summary)
    _print_result(result, out_dir)
    return code


def _print_result(result: dict, out_dir: Path) -> None:
    costs = result["costs"]
    print(
        f"claim {result['verdicts']['base']} → {result['verdicts']['new']}; "
        f"saved activations {_fmt_pp(costs['saving_change_pp'])}; overhead {_fmt_pp(costs['overhead_change_pp'])}"
        f"{'' if costs['ci_overlap'] is None else (' (CIs overlap)' if costs['ci_overlap'] else ' (CIs do not overlap)')}"
    )
    for reason in result["regressions"]:
        print(f"REGRESSED: {reason}")
    for reason in result["unclear"]:
        print(f"CANNOT TELL: {reason}")
    said = {"holds": "OK", "regressed": "REGRESSED", "cannot tell": "CANNOT TELL"}[result["outcome"]]
    print(f"{said}: comparison in {out_dir / 'compare.html'}")


def _fmt_pp(value: float | None) -> str:
    return "not measured on both sides" if value is None else f"{value:+.1f} pp"
