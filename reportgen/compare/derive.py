"""Two signed runs side by side: what changed, and whether NEW regressed (``reportgen.commands.compare``'s logic).

Read by the ``reportgen.commands.compare`` command, which verifies, renders and signs, and by
``reportgen.verify``, which re-derives a signed comparison from the two runs it names. Nothing
here verifies or writes anything.

A regression in time is called only when it can be told from noise: the overhead rose by
more than the limit, and either the two runs' 95% CIs do not overlap or both runs' own
timing met its CI-width target. Otherwise the comparison says it cannot tell (exit 3).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from reportgen.checks import required_names
from reportgen.checks.controls.limit import stated_limit
from reportgen.claim.rows import not_judged
from reportgen.errors import UsageError
from reportgen.files import sha256_bytes
from reportgen.results import Role, Status, check_summary, claim_verdict, frame_from_json
from reportgen.results.frame import detectors
from reportgen.sweep.table import job_costs
from reportgen.trust.attachments import AttachmentError, read_attachments
from reportgen.trust.documents import ENVELOPE_NAME, RESULTS_NAME, DocumentSpec

#: in-toto predicate type of a comparison's statement.
COMPARE_PREDICATE_TYPE = "https://reportgen.invalid/attestation/recompute-compare/v1"
#: A comparison: compare.pdf over compare.json (``compare.dsse.json``, ``compare.unsigned.pdf``).
COMPARE_DOCUMENT = DocumentSpec.named("compare", COMPARE_PREDICATE_TYPE)
#: Defaults of the regression thresholds, percentage points.
MAX_OVERHEAD_INCREASE_PP = 5.0
MAX_SAVING_DECREASE_PP = 5.0
#: Outcomes of a comparison and their exit codes.
HOLDS, REGRESSED, CANNOT_TELL = "holds", "regressed", "cannot tell"
OUTCOME_EXIT = {HOLDS: 0, REGRESSED: 1, CANNOT_TELL: 3}


class CompareError(UsageError):
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
        problem: why it does not verify, one line (empty when it does).
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
    problem: str = ""

    @property
    def verdict(self) -> str:
        """The claim verdict recomputed from the frame (``results.claim_verdict``)."""
        return claim_verdict(self.frame, self.required)


def _flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts → ``{"a.b": "value"}`` with values as compact JSON text."""
    if isinstance(data, dict):
        return {k: v for key, value in data.items() for k, v in _flatten(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): json.dumps(data, sort_keys=True, default=str)}


def load_side(label: str, path: str | Path) -> Side:
    """Read one side: a run folder (results.json, .hydra/config.yaml, statement.dsse.json) or a
    report.pdf (its attached results.json and statement.dsse.json).

    Raises:
        CompareError: no such path, or it holds no results.json.
    """
    path = Path(path)
    envelope = None
    if path.is_dir():
        if not (path / RESULTS_NAME).exists():
            raise CompareError(
                f"{label} {path} has no {RESULTS_NAME}: pass a finished run folder "
                "(outputs/DATE/TIME) or its report.pdf"
            )
        results = (path / RESULTS_NAME).read_text()
        if (path / ENVELOPE_NAME).exists():
            envelope = (path / ENVELOPE_NAME).read_bytes()
        config_file = path / ".hydra" / "config.yaml"
        config = OmegaConf.to_container(OmegaConf.load(config_file), resolve=False) if config_file.exists() else {}
    elif path.is_file():
        try:
            files = read_attachments(path.read_bytes())
        except AttachmentError as exc:
            raise CompareError(f"{label} {path} is not a reportgen report.pdf ({exc})") from None
        if RESULTS_NAME not in files:
            raise CompareError(f"{label} {path} has no attached {RESULTS_NAME}: is it a reportgen report.pdf?")
        results = files[RESULTS_NAME].decode()
        envelope = files.get(ENVELOPE_NAME)
        config = {}
    else:
        raise CompareError(f"{label} {path}: no such run folder or report.pdf")
    # the in-toto statement inside the DSSE envelope, not verified here (``--key`` does that)
    statement = json.loads(base64.b64decode(json.loads(envelope)["payload"])) if envelope else None
    predicate = (statement or {}).get("predicate", {})
    if not config and predicate:  # a lone PDF: what the signed claim says about the settings
        config = {
            "claim": predicate.get("claim", {}),
            "tolerances": {k: v for k, v in predicate.get("tolerances", {}).items() if k != "thresholds"},
            "command": predicate.get("command"),
        }
    required = predicate.get("required") or required_names(
        OmegaConf.select(OmegaConf.create(config), "verdict.required", default=None)
    )
    return Side(
        label,
        path,
        frame_from_json(results),
        list(required),
        _flatten(config),
        statement,
        sha256_bytes(envelope) if envelope else None,
    )


#: What makes two runs comparable: the same model factory, model class and task, each as the signed
#: claim states it (``predicate.claim``), else as the run's ``.hydra/config.yaml`` gives it.
IDENTITY = (
    ("model", ("claim.model", "model._target_")),
    ("architecture", ("claim.architecture",)),
    ("task", ("claim.task", "task._target_")),
)


def identity(side: Side) -> dict[str, str]:
    """The side's model factory, architecture (the model's class) and task, where it states them."""
    claim = _flatten({"claim": ((side.statement or {}).get("predicate") or {}).get("claim") or {}})
    found = {
        name: [v for k in keys if (v := claim.get(k) or side.config.get(k)) is not None and v not in ("null", '""')]
        for name, keys in IDENTITY
    }
    return {name: str(json.loads(values[0])) for name, values in found.items() if values}


def not_comparable(base: Side, new: Side) -> str:
    """Why BASE and NEW are not two releases of one model, or ``""`` when they are (or cannot say).

    A comparison of unrelated models (``+model=ffn`` against ``+model=mlp``) would call their different
    costs a regression; only what both sides state is compared (a side that states nothing is not refused).
    """
    b, n = identity(base), identity(new)
    differ = [f"{name} {b[name]} ≠ {n[name]}" for name, _ in IDENTITY if name in b and name in n and b[name] != n[name]]
    if not differ:
        return ""
    return (
        f"not comparable: BASE and NEW are runs of different models ({'; '.join(differ)}); compare two runs of the "
        "same model and task (the last release's report and the new one)"
    )


def _costs(side: Side) -> dict[str, Any]:
    """The side's headline costs (``sweep.job_costs``) and whether its own timing can be trusted:
    its overhead CI met the width target (the ``overhead_ci`` row passed), None when not measured."""
    ci = side.frame[side.frame.role == Role.OVERHEAD_CI]
    return {**job_costs(side.frame), "timing_trusted": None if ci.empty else bool((ci.status == Status.PASS).all())}


def _limit_said(frame: pd.DataFrame) -> tuple[str, float | None]:
    """A run's detection limit for a comparison: ``("1e-03 in region '0'", 1e-3)``, ``("none caught up to 1 in
    region '0'", inf)``, or ``("not stated", None)`` (controls off, nothing to scale, an older run)."""
    stated = stated_limit(frame)
    if stated is None or not stated["measured"]:
        return "not stated", None
    if stated["value"] is None:
        return f"none caught up to 1 in region {stated['region']!r}", float("inf")
    return f"{stated['value']:.0e} in region {stated['region']!r}", stated["value"]


def limit_change(base: Side, new: Side) -> dict[str, str]:
    """The two runs' detection limits (the smallest relative recompute error gradient parity catches,
    ``reportgen.checks.controls.limit``) and, when they differ, one sentence saying which way: ``{"base", "new",
    "change"}`` (``change`` "" when equal). Stated, never deciding the outcome (a tolerance change is stated the
    same way)."""
    (b_said, b), (n_said, n) = _limit_said(base.frame), _limit_said(new.frame)
    change = ""
    if b_said != n_said:
        way = (
            ": NEW's gradient parity misses recompute errors BASE's caught"
            if b is not None and n is not None and n > b
            else ": NEW's gradient parity catches smaller recompute errors"
            if b is not None and n is not None and n < b
            else ""
        )
        change = f"the detection limit changed from {b_said} (BASE) to {n_said} (NEW){way}"
    return {"base": b_said, "new": n_said, "change": change}


def compare(
    base: Side,
    new: Side,
    max_overhead_increase_pp: float = MAX_OVERHEAD_INCREASE_PP,
    max_saving_decrease_pp: float = MAX_SAVING_DECREASE_PP,
    allow_different_controls: bool = False,
) -> dict[str, Any]:
    """NEW against BASE: verdicts, per-check status changes, cost changes, tolerances, config diff.

    Args:
        base, new: from :func:`load_side`.
        max_overhead_increase_pp: a larger rise of the overhead ratio (recompute / plain step
            time), in percentage points of the plain step time (1.30 → 1.40 is +10 pp), is a regression.
        max_saving_decrease_pp: a larger drop of the saved-activation share, in percentage
            points of the plain twin's saved bytes (75% → 60% is −15 pp), is a regression.
        allow_different_controls: compare runs that differ in their detector controls (one proven, the other
            not: :func:`reportgen.results.frame.detectors`) instead of "cannot tell"; stated in ``unclear``
            either way.

    Returns:
        ``{"verdicts", "checks", "costs", "tolerances", "config", "regressions", "unclear",
        "outcome", "holds", "limits"}``; ``regressions`` lists one sentence per reason NEW is
        worse, ``unclear`` one per change that cannot be told from noise; ``outcome`` is
        ``holds``, ``regressed`` or ``cannot tell`` (module docstring).
    """
    b_sum = check_summary(base.frame, base.required).set_index("check").status.to_dict()
    n_sum = check_summary(new.frame, new.required).set_index("check").status.to_dict()
    checks = [
        {
            "check": c,
            "base": b_sum.get(c),
            "new": n_sum.get(c),
            "changed": b_sum.get(c) != n_sum.get(c),
            "required": c in new.required,
        }
        for c in dict.fromkeys([*b_sum, *n_sum])
    ]
    bc, nc = _costs(base), _costs(new)
    saving_change, overhead_change = (
        None if bc[key] is None or nc[key] is None else 100.0 * (nc[key] - bc[key])
        for key in ("saved_activation_share", "overhead_ratio")
    )
    overlap = None
    if None not in (bc["overhead_ci_low"], bc["overhead_ci_high"], nc["overhead_ci_low"], nc["overhead_ci_high"]):
        overlap = bc["overhead_ci_low"] <= nc["overhead_ci_high"] and nc["overhead_ci_low"] <= bc["overhead_ci_high"]
    costs = {"base": bc, "new": nc, "saving_change_pp": saving_change, "overhead_change_pp": overhead_change}
    costs["ci_overlap"] = overlap

    def thresholds(frame: pd.DataFrame) -> dict[str, str]:
        return {
            f"{c} · {m}": t for c, m, t in zip(frame.check, frame.metric, frame.threshold) if isinstance(t, str) and t
        }

    bt, nt = thresholds(base.frame), thresholds(new.frame)
    tolerances = [
        {"name": k, "base": bt.get(k), "new": nt.get(k)} for k in sorted({*bt, *nt}) if bt.get(k) != nt.get(k)
    ]
    config = [
        {"key": k, "base": base.config.get(k), "new": new.config.get(k)}
        for k in sorted({*base.config, *new.config})
        if base.config.get(k) != new.config.get(k)
    ]
    regressions, unclear = [], []
    b_det, n_det = detectors(base.frame), detectors(new.frame)
    controls = (
        f"the runs differ in their detector controls (BASE: {b_det or 'proven'}; NEW: {n_det or 'proven'})"
        if b_det != n_det  # a PASS without its detectors proven is not the same evidence as one with them
        else ""
    )
    if controls and not allow_different_controls:
        unclear.append(f"{controls}: compare runs made alike, or pass --allow-different-controls")
    if new.verdict == Status.INCONCLUSIVE:  # cannot be judged (the run's own exit 3) is no failure
        said = [c["check"] for c in checks if c["new"] == Status.INCONCLUSIVE]
        unclear.append(f"NEW's claim cannot be judged ({', '.join(said) or 'see its report'})")
    elif new.verdict != Status.PASS:
        failing = [c["check"] for c in checks if c["required"] and c["new"] not in (Status.PASS, "WARN", "INFO", None)]
        regressions.append(f"NEW's claim fails ({', '.join(failing) or 'required checks missing'})")
    if overhead_change is not None and overhead_change > max_overhead_increase_pp:
        rose = (
            f"overhead ratio rose by {overhead_change:.1f} pp ({bc['overhead_ratio']:.3f} → "
            f"{nc['overhead_ratio']:.3f}), more than the allowed {max_overhead_increase_pp:g} pp"
        )
        if overlap is False or (bc["timing_trusted"] and nc["timing_trusted"]):
            regressions.append(rose)
        else:
            noisy = [s.label for s, c in ((base, bc), (new, nc)) if not c["timing_trusted"]]
            unclear.append(
                f"{rose}, but the 95% CIs overlap and the timing of {' and '.join(noisy)} was too noisy "
                "to trust (its CI missed the width target): rerun both on a quiet machine"
            )
    if saving_change is not None and -saving_change > max_saving_decrease_pp:
        regressions.append(
            f"saved-activation share fell by {-saving_change:.1f} pp "
            f"({100 * bc['saved_activation_share']:.1f}% → {100 * nc['saved_activation_share']:.1f}%), "
            f"more than the allowed {max_saving_decrease_pp:g} pp"
        )
    unverified = [
        f"{side.label} {side.problem or 'does not verify (no key to verify it with, or it is unsigned)'}"
        for side in (base, new)
        if side.verified is not True
    ]
    unclear += unverified  # nothing unverified decides the outcome, either way
    outcome = CANNOT_TELL if unverified else (REGRESSED if regressions else (CANNOT_TELL if unclear else HOLDS))
    if controls and allow_different_controls:
        unclear.append(f"{controls}; compared anyway (--allow-different-controls)")  # stated, not deciding
    return {
        "verdicts": {"base": base.verdict, "new": new.verdict},
        "not_judged": {"base": not_judged(base.frame), "new": not_judged(new.frame)},  # the sentence, stated
        "checks": checks,
        "detection_limit": limit_change(base, new),  # stated beside the checks, never deciding
        "costs": costs,
        "tolerances": tolerances,
        "config": config,
        "regressions": regressions,
        "unclear": unclear,
        "outcome": outcome,
        "holds": outcome == HOLDS,
        "limits": {
            "max_overhead_increase_pp": max_overhead_increase_pp,
            "max_saving_decrease_pp": max_saving_decrease_pp,
            "allow_different_controls": allow_different_controls,
        },
    }


def comparison_frame(result: dict) -> pd.DataFrame:
    """compare.csv: one row per check, cost and changed setting: ``kind, name, base, new, change``."""
    costs, base, new = result["costs"], result["verdicts"]["base"], result["verdicts"]["new"]
    rows = [("verdict", "claim", base, new, "changed" if base != new else "")]
    left = result.get("not_judged") or {}
    if left.get("base") or left.get("new"):  # a claim sentence that states what no clause judges
        base_said, new_said = ("; ".join(left.get(side) or []) or "judged" for side in ("base", "new"))
        rows.append(("not judged", "claim sentence", base_said, new_said, ""))
    rows += [("check", c["check"], c["base"], c["new"], "changed" if c["changed"] else "") for c in result["checks"]]
    limit = result.get("detection_limit")
    if limit:
        rows.append(
            ("limit", "detection limit (relative)", limit["base"], limit["new"], "changed" if limit["change"] else "")
        )
    changes = {"saved_activation_share": costs["saving_change_pp"], "overhead_ratio": costs["overhead_change_pp"]}
    for name in ("saved_activation_share", "overhead_ratio", "overhead_ci_low", "overhead_ci_high", "metric_abs_diff"):
        change = "" if changes.get(name) is None else f"{changes[name]:+.2f} pp"
        rows.append(("cost", name, costs["base"][name], costs["new"][name], change))
    rows += [("tolerance", t["name"], t["base"], t["new"], "changed") for t in result["tolerances"]]
    rows += [("config", c["key"], c["base"], c["new"], "changed") for c in result["config"]]
    rows += [("regression", r, None, None, "regressed") for r in result["regressions"]]
    rows += [("unclear", r, None, None, "cannot tell") for r in result["unclear"]]
    return pd.DataFrame(rows, columns=["kind", "name", "base", "new", "change"])
