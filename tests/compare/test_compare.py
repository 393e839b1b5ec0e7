"""``python -m reportgen.compare BASE NEW``: changes since the last release's report, and its exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import TESTS, job_cost_rows, reportgen_cli, sign_folder, write_job
from omegaconf import OmegaConf

from reportgen.checks.controls.rows import STALE, control_row
from reportgen.commands import compare
from reportgen.compare import derive
from reportgen.config import CONTROLS
from reportgen.results import Row
from reportgen.trust.keys import generate_key


def run_folder(root: Path, name: str, rows: list, config: dict | None = None) -> Path:
    folder = write_job(root / name, 0, [], 0, rows)
    if config is not None:
        OmegaConf.save(OmegaConf.create(config), folder / ".hydra" / "config.yaml")
    return folder


def result(tmp_path, base_rows, new_rows, **limits) -> dict:
    base = compare.load_side("BASE", run_folder(tmp_path, "base", base_rows))
    new = compare.load_side("NEW", run_folder(tmp_path, "new", new_rows))
    base.verified = new.verified = True  # the derivation alone (verification: tests/test_trust_chain.py)
    return compare.compare(base, new, **limits)


def test_saving_drop_beyond_the_limit_regresses(tmp_path):
    out = result(tmp_path, job_cost_rows(1000, 250, 1.30, (1.2, 1.4)), job_cost_rows(1000, 500, 1.32, (1.25, 1.45)))
    costs = out["costs"]
    assert costs["saving_change_pp"] == pytest.approx(-25.0)  # 75% -> 50%
    assert costs["overhead_change_pp"] == pytest.approx(2.0)  # x1.30 -> x1.32: within 5 pp
    assert costs["ci_overlap"] is True
    assert not out["holds"] and len(out["regressions"]) == 1
    assert "saved-activation share fell by 25.0 pp (75.0% → 50.0%)" in out["regressions"][0]


def test_limits_are_configurable(tmp_path):
    out = result(tmp_path, job_cost_rows(1000, 250, 1.30), job_cost_rows(1000, 500, 1.32), max_saving_decrease_pp=30)
    assert out["holds"] and out["regressions"] == []


def test_overhead_rise_with_disjoint_cis_regresses(tmp_path):
    out = result(tmp_path, job_cost_rows(ratio=1.30, ci=(1.25, 1.35)), job_cost_rows(ratio=1.60, ci=(1.55, 1.65)))
    assert out["costs"]["overhead_change_pp"] == pytest.approx(30.0)
    assert out["costs"]["ci_overlap"] is False
    assert out["regressions"] == ["overhead ratio rose by 30.0 pp (1.300 → 1.600), more than the allowed 5 pp"]


def test_new_failing_claim_regresses_and_names_the_checks(tmp_path):
    out = result(tmp_path, job_cost_rows(), job_cost_rows(parity="FAIL"))
    assert out["verdicts"] == {"base": "PASS", "new": "FAIL"}
    changed = {c["check"]: (c["base"], c["new"]) for c in out["checks"] if c["changed"]}
    assert changed == {"gradient parity": ("PASS", "FAIL")}
    assert out["regressions"] == ["NEW's claim fails (gradient parity)"]


def test_the_detector_controls_are_carried_and_an_inconclusive_new_cannot_tell(tmp_path):
    """Issue 35: the controls are a check of the comparison; a NEW a missed control leaves INCONCLUSIVE is
    "cannot tell" (exit 3, as the run's own), never "claim fails"."""
    caught = control_row(STALE, True, "caught", size="another example", caught_by="w.grad")
    blind = control_row(STALE, False, "not caught: the tolerance is too wide", size="another example")
    out = result(tmp_path, [*job_cost_rows(), caught], [*job_cost_rows(), blind])
    changed = {c["check"]: (c["base"], c["new"], c["required"]) for c in out["checks"] if c["changed"]}
    assert changed == {CONTROLS: ("PASS", "INCONCLUSIVE", False)}
    assert out["verdicts"]["new"] == "INCONCLUSIVE" and out["regressions"] == []
    assert out["unclear"] == [f"NEW's claim cannot be judged ({CONTROLS})"] and out["outcome"] == derive.CANNOT_TELL
    csv = derive.comparison_frame(out)  # compare.csv
    assert csv[csv.name == CONTROLS][["base", "new", "change"]].values.tolist() == [["PASS", "INCONCLUSIVE", "changed"]]


def test_runs_that_differ_in_their_detector_controls_cannot_be_told_apart_unless_allowed(tmp_path):
    """Issue 43: BASE ran the controls, NEW ran with controls.enabled=false: a PASS without its detectors proven is
    not the evidence BASE's was, so "cannot tell" (exit 3), unless --allow-different-controls (stated either way)."""
    caught = control_row(STALE, True, "caught", size="another example", caught_by="w.grad")
    off = Row.not_run(CONTROLS, "not run: controls.enabled=false", item="controls")
    out = result(tmp_path, [*job_cost_rows(), caught], [*job_cost_rows(), off])
    assert out["verdicts"] == {"base": "PASS", "new": "PASS"} and out["outcome"] == derive.CANNOT_TELL
    assert "detectors not proven: controls.enabled=false" in out["unclear"][0]
    assert "--allow-different-controls" in out["unclear"][0]
    allowed = result(
        tmp_path / "allowed", [*job_cost_rows(), caught], [*job_cost_rows(), off], allow_different_controls=True
    )
    assert allowed["outcome"] == derive.HOLDS and allowed["limits"]["allow_different_controls"] is True
    assert allowed["unclear"][-1].endswith("compared anyway (--allow-different-controls)")


def test_tolerances_and_config_diff(tmp_path):
    looser = job_cost_rows()
    looser[0].threshold = "atol=1e-03 rtol=1e-03"
    base = compare.load_side(
        "BASE", run_folder(tmp_path, "base", job_cost_rows(), {"parity": {"rtol": None}, "seed": 0})
    )
    new = compare.load_side("NEW", run_folder(tmp_path, "new", looser, {"parity": {"rtol": 0.001}, "seed": 0}))
    base.verified = new.verified = True
    out = compare.compare(base, new)
    assert out["tolerances"] == [
        {"name": "gradient parity · max_abs_err", "base": "1e-05", "new": "atol=1e-03 rtol=1e-03"}
    ]
    assert out["config"] == [{"key": "parity.rtol", "base": "null", "new": "0.001"}]


def test_cli_exit_codes_and_outputs(tmp_path, capsys):
    private, public = generate_key(tmp_path / "keys" / "k.pem")
    required = ["gradient parity", "warm-step memory"]
    base = sign_folder(run_folder(tmp_path, "base", job_cost_rows(1000, 250, 1.30)), private, required)
    worse = sign_folder(
        run_folder(tmp_path, "worse", job_cost_rows(1000, 250, 1.50, ci=(1.45, 1.55))), private, required
    )
    assert compare.main([str(base), str(tmp_path / "nope"), "--no-sign"]) == 2
    assert "no such run folder" in capsys.readouterr().err
    assert compare.main([str(base), str(worse), "--key", str(public), "--no-sign", "--out", str(tmp_path / "c1")]) == 1
    assert "REGRESSED: overhead ratio rose by 20.0 pp" in capsys.readouterr().out
    csv = pd.read_csv(tmp_path / "c1" / "compare.csv")
    assert csv[(csv.kind == "cost") & (csv.name == "overhead_ratio")].change.item() == "+20.00 pp"
    assert (tmp_path / "c1" / "compare.pdf").read_bytes().startswith(b"%PDF")
    assert "UNSIGNED" in (tmp_path / "c1" / "compare.html").read_text()
    assert (
        compare.main(
            [
                str(base),
                str(worse),
                "--key",
                str(public),
                "--no-sign",
                "--no-pdf",
                "--out",
                str(tmp_path / "c2"),
                "--compare.max_overhead_increase_pp",
                "25",
            ]
        )
        == 0
    )


def test_runs_of_unrelated_models_are_not_comparable_exit_2_nothing_written(tmp_path, capsys):
    """+model=ffn against +model=mlp: their costs differ because the models do, not because NEW regressed."""
    ffn = {
        "model": {"_target_": "reportgen.models.ffn.build"},
        "task": {"_target_": "reportgen.tasks.SquaredOutputTask"},
    }
    mlp = {"model": {"_target_": "reportgen.models.mlp.DigitsMLP"}, "task": {"_target_": "reportgen.tasks.DigitsTask"}}
    base = run_folder(tmp_path, "ffn", job_cost_rows(1000, 250, 1.30), ffn)
    other = run_folder(tmp_path, "mlp", job_cost_rows(1000, 900, 1.90, ci=(1.85, 1.95)), mlp)
    same = run_folder(tmp_path, "ffn2", job_cost_rows(1000, 250, 1.31), {**ffn, "seed": 3})
    said = compare.not_comparable(compare.load_side("BASE", base), compare.load_side("NEW", other))
    assert said.startswith(
        "not comparable: BASE and NEW are runs of different models (model reportgen.models.ffn.build"
    )
    assert "≠ reportgen.models.mlp.DigitsMLP" in said and "task reportgen.tasks.SquaredOutputTask ≠ " in said
    assert compare.not_comparable(compare.load_side("BASE", base), compare.load_side("NEW", same)) == ""
    code = compare.main([str(base), str(other), "--no-sign", "--no-pdf", "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("reportgen.compare: cannot start: not comparable")
    assert not (tmp_path / "c").exists()
    assert compare.main([str(base), str(same), "--no-sign", "--no-pdf", "--out", str(tmp_path / "c")]) == 3


def test_the_signed_claim_names_the_model_for_a_lone_pdf(tmp_path):
    """A report.pdf has no .hydra/config.yaml: the signed claim's model, architecture and task are compared."""
    base = compare.load_side("BASE", run_folder(tmp_path, "a", job_cost_rows()))
    new = compare.load_side("NEW", run_folder(tmp_path, "b", job_cost_rows()))
    base.statement = {"predicate": {"claim": {"model": "m.build", "architecture": "m.Net", "task": "m.Task"}}}
    new.statement = {"predicate": {"claim": {"model": "m.build", "architecture": "m.Other", "task": "m.Task"}}}
    assert derive.identity(base) == {"model": "m.build", "architecture": "m.Net", "task": "m.Task"}
    assert "(architecture m.Net ≠ m.Other)" in compare.not_comparable(base, new)
    new.statement["predicate"]["claim"]["architecture"] = "m.Net"
    assert compare.not_comparable(base, new) == ""


def test_no_signing_key_exits_2_naming_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REPORTGEN_SIGNING_KEY", str(tmp_path / "missing.pem"))
    base = run_folder(tmp_path, "base", job_cost_rows())
    assert compare.main([str(base), str(base), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "python -m reportgen.keys generate" in err and "--no-sign" in err


def test_unsigned_runs_do_not_verify_with_a_key(tmp_path, capsys):
    _, public = generate_key(tmp_path / "keys" / "k.pem")
    base = run_folder(tmp_path, "base", job_cost_rows())
    assert (
        compare.main(
            [str(base), str(base), "--key", str(public), "--no-sign", "--no-pdf", "--out", str(tmp_path / "c")]
        )
        == 3
    )
    out = capsys.readouterr().out
    assert "BASE NOT VERIFIED" in out and "CANNOT TELL: BASE does not verify with the given key" in out


# --------------------------------------------------------------------------- end to end

#: Signed runs with PDFs (a side may be a report.pdf); parity and training cut to the bone (the
#: comparison reads their rows, not their length); timing as measured as the 20 ms sleep needs.
SLOW_BLOCK = [
    "--config-dir",
    str(TESTS / "user_conf"),
    "+model=slow_block",
    "budget.examples=32",
    "budget.seeds=[0]",
    "larger_batch.enabled=false",
    "parity.steps=2",
    "memory.warm_steps=1",
    "timing.measured_steps=6",
    "timing.warmup_steps=1",
    "timing.target_ci_half_width_pp=null",
    "timing.max_measure_seconds=3",
]


@pytest.fixture(scope="module")
def signed_pair(tmp_path_factory):
    """Two signed runs: BASE recomputes the cheap block, NEW the one that sleeps 20 ms per forward."""
    root = tmp_path_factory.mktemp("release")
    private, public = generate_key(root / "keys" / "team.pem")
    env = {"REPORTGEN_SIGNING_KEY": str(private), "PYTHONPATH": f"{TESTS.parent}:{TESTS}"}
    for name, target in (("base", "Fast"), ("new", "Slow")):
        proc = reportgen_cli(
            root, *SLOW_BLOCK, f"recompute.targets=[{target}]", f"hydra.run.dir={root / name}", env=env
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return root, private, public, env


@pytest.mark.slow
@pytest.mark.parametrize("as_pdf", [False, True])
def test_slower_recompute_target_is_reported_and_exits_1(signed_pair, as_pdf):
    root, private, public, env = signed_pair
    base, new = (
        (root / "base", root / "new") if not as_pdf else (root / "base" / "report.pdf", root / "new" / "report.pdf")
    )
    out = root / f"cmp-{as_pdf}"
    proc = reportgen_cli(  # compare.pdf: test_cli_exit_codes_and_outputs
        root,
        str(base),
        str(new),
        "--key",
        str(public),
        "--no-pdf",
        "--out",
        str(out),
        module="reportgen.compare",
        env=env,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "BASE VERIFIED" in proc.stdout and "NEW VERIFIED" in proc.stdout
    assert "REGRESSED: overhead ratio rose by" in proc.stdout
    frame = pd.read_csv(out / "compare.csv")
    change = frame[(frame.kind == "cost") & (frame.name == "overhead_ratio")].change.item()
    assert float(change.removesuffix(" pp")) > 30  # 20 ms of sleep recomputed on a ~20 ms step
    targets = [r for r in frame[frame.kind == "config"].to_dict("records") if "targets" in r["name"]]
    assert targets and "Slow" in targets[0]["new"] and "Fast" in targets[0]["base"]
    statement = json.loads(
        __import__("base64").b64decode(json.loads((out / "compare.dsse.json").read_text())["payload"])
    )
    digests = {i["label"]: i["statement_sha256"] for i in statement["predicate"]["inputs"]}
    assert all(digests.values()) and statement["predicate"]["exit_code"] == 1


@pytest.mark.slow
def test_faster_new_release_exits_0(signed_pair):
    root, private, public, env = signed_pair
    proc = reportgen_cli(
        root,
        str(root / "new"),
        str(root / "base"),
        "--key",
        str(public),
        "--no-pdf",
        "--out",
        str(root / "cmp-faster"),
        module="reportgen.compare",
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith(f"OK: comparison in {root / 'cmp-faster' / 'compare.html'}")
