"""``python -m reportgen.compare BASE NEW [--key PUB]``: what changed since the last release's report.

BASE and NEW are run folders (``outputs/DATE/TIME``) or signed ``report.pdf`` files. With
``--key`` both are verified first (``reportgen.verify``); a side that does not verify makes
the comparison exit 1. The comparison report (``compare.csv/json/html/pdf``, signed like a
run when signing is on) shows, NEW against BASE:

- the claim verdict and each check's status, and which changed;
- saved-activation share and step-time overhead ratio (``reportgen.render.headline_costs``),
  the overhead's 95% CIs side by side and whether they overlap; the largest held-out metric
  difference between the twins;
- tolerances and thresholds that changed, and the config diff (from ``.hydra/config.yaml``
  in a run folder; from the signed statement's claim for a lone PDF).

Exit code: 0 NEW holds and did not regress; 1 NEW fails, regresses (overhead up by more than
``--max-overhead-increase-pp`` percentage points of the plain step time, or saving down by more
than ``--max-saving-decrease-pp`` points of the plain saved bytes), or a side does not verify;
2 the command cannot start (no such run, unusable key, no signing key).
"""
from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from .results import PASS, atomic_write, check_summary, claim_verdict, frame_from_json, frame_to_json
from .signing import ENVELOPE_NAME, RESULTS_NAME

EXIT_OK, EXIT_REGRESSED, EXIT_USAGE = 0, 1, 2
#: in-toto predicate type of a comparison's statement.
COMPARE_PREDICATE_TYPE = "https://reportgen.invalid/attestation/recompute-compare/v1"
#: Defaults of the regression thresholds, percentage points.
MAX_OVERHEAD_INCREASE_PP = 5.0
MAX_SAVING_DECREASE_PP = 5.0


class CompareError(Exception):
    """A side cannot be read (no such run, no results); the message names what to pass instead."""


@dataclass
class Side:
    """One report being compared.

    Attributes:
        label: ``"BASE"`` or ``"NEW"``.
        path: the run folder or PDF given.
        frame: its results frame (results.json).
        required: the checks its verdict needs (from its statement, else its config, else the default).
        config: flattened settings, ``{"parity.rtol": "null", ...}``.
        statement: the in-toto statement inside its DSSE envelope, or ``None`` when unsigned.
        envelope_sha256: SHA-256 of its statement.dsse.json, hex (``None`` when unsigned).
        verified: ``None`` when no key was given, else whether ``reportgen.verify`` passed.
        verify_lines: what ``reportgen.verify`` printed for it.
    """

    label: str
    path: Path
    frame: pd.DataFrame
    required: list[str]
    config: dict[str, str]
    statement: dict | None = None
    envelope_sha256: str | None = None
    verified: bool | None = None
    verify_lines: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """The claim verdict recomputed from the frame (``results.claim_verdict``)."""
        return claim_verdict(self.frame, self.required)


def _flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts → ``{"a.b": "value"}`` with values as compact JSON text."""
    if isinstance(data, dict):
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): json.dumps(data, sort_keys=True, default=str)}


def _statement(envelope: bytes) -> dict:
    """The in-toto statement inside a DSSE envelope (not verified here: ``--key`` does that)."""
    return json.loads(base64.b64decode(json.loads(envelope)["payload"]))


def load_side(label: str, path: str | Path) -> Side:
    """Read one side: a run folder (results.json, .hydra/config.yaml, statement.dsse.json) or a
    report.pdf (its attached results.json and statement.dsse.json).

    Raises:
        CompareError: no such path, or it holds no results.json.
    """
    import hashlib

    path = Path(path)
    envelope = None
    if path.is_dir():
        if not (path / RESULTS_NAME).exists():
            raise CompareError(f"{label} {path} has no {RESULTS_NAME}: pass a finished run folder "
                               "(outputs/DATE/TIME) or its report.pdf")
        results = (path / RESULTS_NAME).read_text()
        if (path / ENVELOPE_NAME).exists():
            envelope = (path / ENVELOPE_NAME).read_bytes()
        config_file = path / ".hydra" / "config.yaml"
        config = OmegaConf.to_container(OmegaConf.load(config_file), resolve=False) if config_file.exists() else {}
    elif path.is_file():
        from pyhanko.pdf_utils.reader import PdfFileReader

        from .verify import VerifyError, _embedded_files

        import io

        try:
            files = _embedded_files(PdfFileReader(io.BytesIO(path.read_bytes()), strict=False))
        except (VerifyError, Exception) as exc:  # noqa: BLE001 - any unreadable PDF is the same answer
            raise CompareError(f"{label} {path} is not a reportgen report.pdf ({exc})") from None
        if RESULTS_NAME not in files:
            raise CompareError(f"{label} {path} has no attached {RESULTS_NAME}: is it a reportgen report.pdf?")
        results = files[RESULTS_NAME].decode()
        envelope = files.get(ENVELOPE_NAME)
        config = {}
    else:
        raise CompareError(f"{label} {path}: no such run folder or report.pdf")
    statement = _statement(envelope) if envelope else None
    predicate = (statement or {}).get("predicate", {})
    if not config and predicate:  # a lone PDF: what the signed claim says about the settings
        config = {"claim": predicate.get("claim", {}), "tolerances": {k: v for k, v in predicate.get("tolerances", {}).items()
                                                                      if k != "thresholds"},
                  "command": predicate.get("command")}
    from .checks import required_names

    required = predicate.get("required") or required_names(OmegaConf.select(OmegaConf.create(config),
                                                                            "verdict.required", default=None))
    return Side(label, path, frame_from_json(results), list(required), _flatten(config), statement,
                hashlib.sha256(envelope).hexdigest() if envelope else None)


def _costs(side: Side) -> dict[str, Any]:
    from .sweep import job_costs

    return job_costs(side.frame)


def _pp(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def compare(base: Side, new: Side, max_overhead_increase_pp: float = MAX_OVERHEAD_INCREASE_PP,
            max_saving_decrease_pp: float = MAX_SAVING_DECREASE_PP) -> dict[str, Any]:
    """NEW against BASE: verdicts, per-check status changes, cost changes, tolerances, config diff.

    Args:
        base, new: from :func:`load_side`.
        max_overhead_increase_pp: a larger rise of the overhead ratio (recompute / plain step
            time), in percentage points of the plain step time (1.30 → 1.40 is +10 pp), is a regression.
        max_saving_decrease_pp: a larger drop of the saved-activation share, in percentage
            points of the plain twin's saved bytes (75% → 60% is −15 pp), is a regression.

    Returns:
        ``{"verdicts", "checks", "costs", "tolerances", "config", "regressions", "holds"}``;
        ``regressions`` lists one sentence per reason NEW is worse, ``holds`` is True when
        NEW's claim holds and nothing regressed.
    """
    b_sum = check_summary(base.frame, base.required).set_index("check").status.to_dict()
    n_sum = check_summary(new.frame, new.required).set_index("check").status.to_dict()
    checks = [{"check": c, "base": b_sum.get(c), "new": n_sum.get(c), "changed": b_sum.get(c) != n_sum.get(c),
               "required": c in new.required}
              for c in dict.fromkeys([*b_sum, *n_sum])]
    bc, nc = _costs(base), _costs(new)
    saving_change = None if bc["saved_activation_share"] is None or nc["saved_activation_share"] is None else \
        _pp(nc["saved_activation_share"] - bc["saved_activation_share"])
    overhead_change = None if bc["overhead_ratio"] is None or nc["overhead_ratio"] is None else \
        _pp(nc["overhead_ratio"] - bc["overhead_ratio"])
    overlap = None
    if None not in (bc["overhead_ci_low"], bc["overhead_ci_high"], nc["overhead_ci_low"], nc["overhead_ci_high"]):
        overlap = bc["overhead_ci_low"] <= nc["overhead_ci_high"] and nc["overhead_ci_low"] <= bc["overhead_ci_high"]
    costs = {"base": bc, "new": nc, "saving_change_pp": saving_change, "overhead_change_pp": overhead_change,
             "ci_overlap": overlap}

    def thresholds(frame: pd.DataFrame) -> dict[str, str]:
        return {f"{c} · {m}": t for c, m, t in zip(frame.check, frame.metric, frame.threshold) if isinstance(t, str) and t}

    bt, nt = thresholds(base.frame), thresholds(new.frame)
    tolerances = [{"name": k, "base": bt.get(k), "new": nt.get(k)} for k in sorted({*bt, *nt}) if bt.get(k) != nt.get(k)]
    config = [{"key": k, "base": base.config.get(k), "new": new.config.get(k)}
              for k in sorted({*base.config, *new.config}) if base.config.get(k) != new.config.get(k)]
    regressions = []
    if new.verdict != PASS:
        failing = [c["check"] for c in checks if c["required"] and c["new"] not in (PASS, "WARN", "INFO", None)]
        regressions.append(f"NEW's claim fails ({', '.join(failing) or 'required checks missing'})")
    if overhead_change is not None and overhead_change > max_overhead_increase_pp:
        regressions.append(f"overhead ratio rose by {overhead_change:.1f} pp ({bc['overhead_ratio']:.3f} → "
                           f"{nc['overhead_ratio']:.3f}), more than the allowed {max_overhead_increase_pp:g} pp")
    if saving_change is not None and -saving_change > max_saving_decrease_pp:
        regressions.append(f"saved-activation share fell by {-saving_change:.1f} pp "
                           f"({100 * bc['saved_activation_share']:.1f}% → {100 * nc['saved_activation_share']:.1f}%), "
                           f"more than the allowed {max_saving_decrease_pp:g} pp")
    for side in (base, new):
        if side.verified is False:
            regressions.append(f"{side.label} does not verify with the given key")
    return {"verdicts": {"base": base.verdict, "new": new.verdict}, "checks": checks, "costs": costs,
            "tolerances": tolerances, "config": config, "regressions": regressions, "holds": not regressions,
            "limits": {"max_overhead_increase_pp": max_overhead_increase_pp,
                       "max_saving_decrease_pp": max_saving_decrease_pp}}


def comparison_frame(result: dict) -> pd.DataFrame:
    """compare.csv: one row per check, cost and changed setting: ``kind, name, base, new, change``."""
    rows = [{"kind": "verdict", "name": "claim", "base": result["verdicts"]["base"], "new": result["verdicts"]["new"],
             "change": "changed" if result["verdicts"]["base"] != result["verdicts"]["new"] else ""}]
    rows += [{"kind": "check", "name": c["check"], "base": c["base"], "new": c["new"], "change": "changed" if c["changed"] else ""}
             for c in result["checks"]]
    costs = result["costs"]
    for name, key, change in (("saved_activation_share", "saved_activation_share", costs["saving_change_pp"]),
                              ("overhead_ratio", "overhead_ratio", costs["overhead_change_pp"]),
                              ("overhead_ci_low", "overhead_ci_low", None), ("overhead_ci_high", "overhead_ci_high", None),
                              ("metric_abs_diff", "metric_abs_diff", None)):
        rows.append({"kind": "cost", "name": name, "base": costs["base"][key], "new": costs["new"][key],
                     "change": "" if change is None else f"{change:+.2f} pp"})
    rows += [{"kind": "tolerance", "name": t["name"], "base": t["base"], "new": t["new"], "change": "changed"}
             for t in result["tolerances"]]
    rows += [{"kind": "config", "name": c["key"], "base": c["base"], "new": c["new"], "change": "changed"}
             for c in result["config"]]
    rows += [{"kind": "regression", "name": r, "base": None, "new": None, "change": "regressed"} for r in result["regressions"]]
    return pd.DataFrame(rows, columns=["kind", "name", "base", "new", "change"])


def render_comparison(result: dict, base: Side, new: Side, out_dir: Path, created: str, signature: str,
                      pdf: bool = True) -> dict[str, Path]:
    """Write compare.csv, compare.json, compare.html (and compare.pdf) into ``out_dir``.

    Raises:
        FileExistsError: a comparison exists already in ``out_dir``.
    """
    from .render import environment, write_pdf

    frame = comparison_frame(result)
    table = frame_to_json(frame)
    view = {"result": result, "created": created, "signature": signature,
            "sides": [{"label": s.label, "path": str(s.path), "verdict": s.verdict, "verified": s.verified,
                       "verify_lines": s.verify_lines, "signed": s.statement is not None,
                       "created": (s.statement or {}).get("predicate", {}).get("created", "—")} for s in (base, new)]}
    html = environment().get_template("compare.html.j2").render(**view)
    paths = {"csv": atomic_write(out_dir / "compare.csv", frame.to_csv(index=False)),
             "json": atomic_write(out_dir / "compare.json", table),
             "html": atomic_write(out_dir / "compare.html", html)}
    if pdf:
        attached = ("compare.json", table.encode(), "Data", "The comparison this document was rendered from.")
        paths["pdf"] = atomic_write(out_dir / "compare.pdf", write_pdf(html, created, [attached]))
    return paths


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring. Returns the exit code (0, 1 or 2)."""
    from .keys import KeyFileError, load_public_key
    from .metadata import report_time
    from .signing import SigningError, load_signing_key, sign_document, signature_label

    parser = argparse.ArgumentParser(prog="python -m reportgen.compare",
                                     description="Compare a new reportgen report with the last release's.")
    parser.add_argument("base", help="the last release's run folder or report.pdf")
    parser.add_argument("new", help="the new run folder or report.pdf")
    parser.add_argument("--key", help="public key (PEM) both reports must verify with; without it nothing is verified")
    parser.add_argument("--out", help="folder for the comparison (default comparisons/DATE/TIME)")
    parser.add_argument("--max-overhead-increase-pp", "--compare.max_overhead_increase_pp", type=float,
                        default=MAX_OVERHEAD_INCREASE_PP, dest="max_overhead",
                        help="largest allowed rise of the overhead ratio, percentage points (default %(default)s)")
    parser.add_argument("--max-saving-decrease-pp", "--compare.max_saving_decrease_pp", type=float,
                        default=MAX_SAVING_DECREASE_PP, dest="max_saving",
                        help="largest allowed drop of the saved-activation share, percentage points (default %(default)s)")
    parser.add_argument("--signing-key", help="private key that signs the comparison (default: as for a run: "
                                              "$REPORTGEN_SIGNING_KEY, else ~/.config/reportgen/signing-key.pem)")
    parser.add_argument("--no-sign", action="store_true", help="write an UNSIGNED comparison")
    parser.add_argument("--no-pdf", action="store_true", help="HTML only")
    args = parser.parse_args(argv)
    for noisy in ("pyhanko", "pyhanko_certvalidator", "securesystemslib", "fontTools", "weasyprint", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    try:
        public_key = load_public_key(args.key) if args.key else None
        signing_key = load_signing_key(not args.no_sign, args.signing_key)
        base, new = load_side("BASE", args.base), load_side("NEW", args.new)
    except (KeyFileError, SigningError, CompareError) as exc:
        print(f"reportgen.compare: cannot start: {exc}".replace("report.sign=false", "--no-sign"), file=sys.stderr)
        return EXIT_USAGE
    if public_key is not None:
        from .verify import FAIL, verify

        for side in (base, new):
            checks = verify(side.path, public_key)
            side.verified = not any(c.status == FAIL for c in checks)
            side.verify_lines = [c.line for c in checks]
            print(f"{side.label} {'VERIFIED' if side.verified else 'NOT VERIFIED'}: {side.path}")
            for line in side.verify_lines if not side.verified else []:
                print(f"  {line}")
    result = compare(base, new, args.max_overhead, args.max_saving)
    now = dt.datetime.now()
    out_dir = Path(args.out or Path("comparisons") / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S-%f"))
    out_dir.mkdir(parents=True, exist_ok=True)
    created = report_time()
    render_comparison(result, base, new, out_dir, created, signature_label(signing_key), pdf=not args.no_pdf)
    code = EXIT_OK if result["holds"] else EXIT_REGRESSED
    if signing_key is not None:
        predicate = {"exit_code": code, "created": created, "holds": result["holds"],
                     "regressions": result["regressions"], "verdicts": result["verdicts"], "limits": result["limits"],
                     "signer": {"publicKeySha256": signing_key.fingerprint},
                     "inputs": [{"label": s.label, "path": str(s.path), "verified": s.verified,
                                 "statement_sha256": s.envelope_sha256} for s in (base, new)]}
        sign_document(out_dir, "compare", ["compare.csv", "compare.json", "compare.html"], predicate,
                      COMPARE_PREDICATE_TYPE, signing_key,
                      f"reportgen comparison; NEW {'holds' if result['holds'] else 'regressed or fails'}")
    costs = result["costs"]
    print(f"claim {result['verdicts']['base']} → {result['verdicts']['new']}; "
          f"saved activations {_fmt_pp(costs['saving_change_pp'])}; overhead {_fmt_pp(costs['overhead_change_pp'])}"
          f"{'' if costs['ci_overlap'] is None else (' (CIs overlap)' if costs['ci_overlap'] else ' (CIs do not overlap)')}")
    for reason in result["regressions"]:
        print(f"REGRESSED: {reason}")
    print(f"{'OK' if result['holds'] else 'REGRESSED'}: comparison in {out_dir / 'compare.html'}")
    return code


def _fmt_pp(value: float | None) -> str:
    return "not measured on both sides" if value is None else f"{value:+.1f} pp"


if __name__ == "__main__":
    sys.exit(main())
