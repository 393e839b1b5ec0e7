"""The release claim (issue 26): clauses parsed from claim=<name>, judged as rows from a real run's
frame, shown on page 1, signed, re-derived by verify; and the CI outputs (junit.xml, summary.md,
verdict.json).

The frame is a real ``+model=mlp claim=mlp_release parity.batch_size=512`` run
(tests/data/mlp_claim_results.json.gz, small budgets, CPU).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import compose_config
from omegaconf import OmegaConf
from rows import allclose_row

from reportgen.ci import finish_ci_outputs, write_ci_outputs
from reportgen.ci.junit import junit_xml
from reportgen.ci.summary import append_step_summary, md, summary_markdown
from reportgen.claim import ClaimError, claim_table, clause_rows, parse_claim
from reportgen.config import GRADIENT_PARITY, MEMORY, RELEASE_CLAIM, TIME
from reportgen.results import Role, Row, Status, claim_verdict, frame_from_json, frame_to_json, to_frame

DATA = Path(__file__).resolve().parents[1] / "data"
#: The checks a one-process run requires by default, and the claim's own section.
REQUIRED = [
    "gradient parity",
    "optimizer-step parity",
    "state parity",
    "trajectory parity",
    "warm-step memory",
    "warm-step time",
    "task metrics",
    RELEASE_CLAIM,
]


@pytest.fixture(scope="module")
def measured():
    """The checks' rows of the stored mlp run (its clause rows dropped: each test judges its own)."""
    frame = frame_from_json(gzip.open(DATA / "mlp_claim_results.json.gz").read().decode())
    return frame[frame.check != RELEASE_CLAIM].reset_index(drop=True)


def _claim(*clauses: str, text: str = "Recompute saves memory, cheaply."):
    return parse_claim(OmegaConf.create({"text": text, "clauses": list(clauses)}))


def _row(frame, check, role, variant="recompute"):
    return frame[(frame.check == check) & (frame.role == role) & (frame.variant == variant)].iloc[0]


# --------------------------------------------------------------------------- parsing


def test_clauses_parse_to_quantity_comparator_bound():
    claim = _claim(
        "peak_saving_share >= 40%",
        "overhead_ratio <= 1.30",
        "step_time_ms < 250",
        "fits: batch 16 at seq 1024 within 80 GiB",
        "Task  metric within tolerance",
    )
    kinds = [(c.metric, c.comparator, c.bound) for c in claim.clauses]
    assert kinds == [
        ("parity_checks_not_passing", "<=", 0.0),
        ("peak_saving_share", ">=", 0.4),
        ("overhead_ratio_ci_high", "<=", 1.3),
        ("step_time_ms", "<", 250.0),
        ("fits_peak_bytes", "<=", 80 * 2**30),
        ("task_seeds_outside_tolerance", "<=", 0.0),
    ]
    assert (claim.clauses[4].batch, claim.clauses[4].seq) == (16, 1024)
    assert claim.clauses[0].text == "training unchanged"  # always part of the claim, added first


@pytest.mark.parametrize(
    "clause, says",
    [
        ("overhead_ratio >= 1.3", "overhead_ratio is bounded with <= or <"),
        ("peak_saving <= 0.4", "unknown quantity 'peak_saving'"),
        ("fits: batch 16 within 80 GB", "binary units"),
        ("fits: 16 within 80 GiB", "write `fits: batch 16 within 80 GiB`"),
        ("memory is fine", "is not one reportgen reads"),
    ],
)
def test_a_clause_reportgen_cannot_read_is_one_line_naming_the_forms(clause, says):
    with pytest.raises(ClaimError, match=says.replace("(", r"\(").replace("[", r"\[")):
        _claim(clause)


def test_no_claim_file_keeps_the_generic_claim():
    assert parse_claim(compose_config("+model=mlp").claim) is None


def test_claim_group_and_command_line_compose_against_the_schema():
    claim = parse_claim(compose_config("+model=mlp", "claim=mlp_release").claim)
    assert [c.kind for c in claim.clauses] == ["training unchanged", "quantity", "quantity", "fits", "task metric"]
    cfg = compose_config("+model=mlp", "claim.text=Batch 8 fits.", 'claim.clauses=["fits: batch 8 within 1 GiB"]')
    assert parse_claim(cfg.claim).clauses[1].batch == 8
    with pytest.raises(Exception, match="txt"):
        compose_config("+model=mlp", "claim.txt=typo")


def test_a_bad_clause_stops_the_run_before_any_model_work(tmp_path, capsys):
    from reportgen.commands import run as pipeline

    cfg = compose_config("+model=mlp", 'claim.clauses=["overhead_ratio >= 1.3"]')
    assert pipeline.run(cfg, tmp_path) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        "reportgen: cannot start: claim clause 'overhead_ratio >= 1.3': overhead_ratio is bounded "
        "with <= or <, e.g. `overhead_ratio <= 1.3`"
    ]
    assert not (tmp_path / "results.json").exists()


# --------------------------------------------------------------------------- judging


def test_each_clause_reads_its_measured_row(measured):
    claim = _claim(
        "peak_saving_share >= 0.01", "overhead_ratio <= 50", "step_time_ms <= 100000", "task metric within tolerance"
    )
    rows = {r.item: r for r in clause_rows(measured, claim)}
    peak = _row(measured, MEMORY, Role.PEAK_SAVING)
    overhead = _row(measured, TIME, Role.OVERHEAD)
    median = _row(measured, TIME, Role.MEDIAN)
    assert rows["peak_saving_share >= 0.01"].value == peak.value > 0.2
    assert rows["overhead_ratio <= 50"].value == overhead.ci_high > overhead.value  # judged on the CI's upper end
    assert rows["step_time_ms <= 100000"].value == median.value
    assert rows["training unchanged"].value == 0 and rows["task metric within tolerance"].value == 0
    assert {r.status for r in rows.values()} == {Status.PASS}
    assert all(r.role == Role.CLAUSE and r.check == RELEASE_CLAIM for r in rows.values())


def test_a_bound_just_beyond_the_measurement_fails_naming_the_clause(measured):
    peak = _row(measured, MEMORY, Role.PEAK_SAVING).value
    overhead = _row(measured, TIME, Role.OVERHEAD)
    beyond, within = f"peak_saving_share >= {peak * 1.001:.6f}", f"peak_saving_share >= {peak * 0.999:.6f}"
    straddle = f"overhead_ratio <= {(overhead.value + overhead.ci_high) / 2:.6f}"  # median within, CI not
    rows = {r.item: r for r in clause_rows(measured, _claim(beyond, within, straddle))}
    assert (rows[beyond].status, rows[within].status, rows[straddle].status) == (Status.FAIL, Status.PASS, Status.FAIL)
    assert "cannot tell" in rows[straddle].detail
    frame = to_frame(list(rows.values()))
    assert claim_verdict(to_frame([*_measured_rows(measured), *rows.values()]), REQUIRED) == Status.FAIL
    table = {c["clause"]: c["outcome"] for c in claim_table(frame)}
    assert table == {"training unchanged": "met", beyond: "not met", within: "met", straddle: "not met"}


def _measured_rows(measured):
    """The stored frame's rows as Row objects (their stated statuses)."""
    fields = {
        "check",
        "item",
        "variant",
        "metric",
        "value",
        "threshold",
        "comparator",
        "status",
        "detail",
        "seconds",
        "role",
        "unit",
        "threshold_value",
        "on_miss",
    }
    out = []
    for record in measured.to_dict("records"):
        record = {k: v for k, v in record.items() if not (isinstance(v, float) and math.isnan(v))}
        row = Row(
            **{k: v for k, v in record.items() if k in fields},
            extra={k: v for k, v in record.items() if k not in fields},
        )
        out.append(row)
    return out


def test_a_missing_measurement_cannot_tell_and_fails_the_claim(measured):
    without_time = measured[measured.check != TIME]
    rows = {r.item: r for r in clause_rows(without_time, _claim("overhead_ratio <= 2", "fits: batch 8 within 1 GiB"))}
    assert rows["overhead_ratio <= 2"].status == Status.NOT_RUN and math.isnan(rows["overhead_ratio <= 2"].value)
    assert rows["fits: batch 8 within 1 GiB"].status == Status.NOT_RUN  # no prediction given
    assert claim_table(to_frame(list(rows.values())))[1]["outcome"] == "cannot tell"


def test_training_unchanged_counts_failing_parity_checks(measured):
    broken = allclose_row(GRADIENT_PARITY, "blocks.0.w.grad", 0.5, 0.49, threshold="atol=1e-05")
    rows = clause_rows(to_frame([*_measured_rows(measured), broken]), _claim("peak_saving_share >= 0.01"))
    assert (rows[0].value, rows[0].status) == (1.0, Status.FAIL) and GRADIENT_PARITY in rows[0].detail


def test_fits_is_judged_on_the_predicted_peak(measured):
    claim = _claim("fits: batch 4096 within 64 MiB", "fits: batch 4096 within 8 MiB")
    fits = {c.text: {"predicted_bytes": 20 * 2**20, "method": "test"} for c in claim.clauses[1:]}
    rows = clause_rows(measured, claim, fits)
    assert [r.status for r in rows[1:]] == [Status.PASS, Status.FAIL] and rows[1].threshold_value == 64 * 2**20


def test_stored_fits_prediction_scales_the_measured_peak(measured):
    """The stored run's fits clause: batch 4096 from a measured batch of 512, by the batch slope (the digits
    task draws at most its 1438 training images, so the estimator cannot draw 4096)."""
    stored = frame_from_json(gzip.open(DATA / "mlp_claim_results.json.gz").read().decode())
    fits = stored[(stored.check == RELEASE_CLAIM) & (stored.clause_kind == "fits")].iloc[0]
    peak = _row(measured, MEMORY, Role.STEP_PEAK)
    fixed = sum(peak[f"at_peak_{c}_bytes"] for c in ("parameters", "buffers", "gradients", "optimizer_state"))
    assert fits.value == pytest.approx(fixed + (peak.value - fixed) * 4096 / 512)
    assert "scaled by 4096/512" in fits.fits_method


# --------------------------------------------------------------------------- CI outputs


def _judged_frame(measured, *clauses):
    claim = _claim(*clauses)
    return to_frame([*_measured_rows(measured), *clause_rows(measured, claim)]), claim


def test_junit_validates_and_has_one_case_per_check_clause_and_verdict(measured):
    lxml = pytest.importorskip("lxml.etree")
    frame, claim = _judged_frame(measured, "peak_saving_share >= 0.99", "overhead_ratio <= 50")
    frame.loc[frame.check == "task metrics", "status"] = Status.ERROR  # an error is <error>
    verdict = claim_verdict(frame, REQUIRED)
    data = junit_xml(frame, verdict, REQUIRED, "mlp | <run>", "python -m reportgen.verify X --key K")
    schema = lxml.XMLSchema(lxml.parse(str(DATA / "junit.xsd")))
    schema.assertValid(lxml.fromstring(data))
    suite = ET.fromstring(data).find("testsuite")
    cases = suite.findall("testcase")
    checks = [c for c in frame.check.unique() if c != RELEASE_CLAIM]
    assert len(cases) == len(checks) + len(claim.clauses) + 1 == int(suite.get("tests"))
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert failed == {"clause: peak_saving_share >= 0.99", "claim verdict"}
    assert [c.get("name") for c in cases if c.find("error") is not None] == ["task metrics"]
    assert suite.get("failures") == "2" and suite.get("errors") == "1" and suite.get("name") == "mlp | <run>"
    assert (
        "Fix: recompute more" in next(c for c in cases if c.get("name").startswith("clause: peak")).find("failure").text
    )


def test_summary_says_fail_escapes_names_and_appends_never_overwrites(measured, tmp_path):
    frame, claim = _judged_frame(measured, "peak_saving_share >= 0.99")
    meta = {"claim": {"model": "my|model", "release": claim.record()}, "signature": "sha256:ab"}
    text = summary_markdown(frame, meta, claim_verdict(frame, REQUIRED), REQUIRED, tmp_path)
    assert text.startswith("## reportgen: claim FAILS (FAIL)") and "my\\|model" in text
    assert "| peak\\_saving\\_share &gt;= 0.99 |" in text and "❌ not met" in text
    assert "python -m reportgen.verify" in text
    assert md("a|b<script>`x`") == "a\\|b&lt;script&gt;\\`x\\`"
    target = tmp_path / "step-summary.md"
    target.write_text("earlier step\n")
    env = {"GITHUB_STEP_SUMMARY": str(target)}
    append_step_summary(text, env), append_step_summary(text, env)
    assert (
        target.read_text().startswith("earlier step\n") and target.read_text().count("## reportgen: claim FAILS") == 2
    )
    assert append_step_summary(text, {}) is None


def test_sweep_junit_has_one_case_per_job(measured):
    lxml = pytest.importorskip("lxml.etree")
    from reportgen.ci.junit import sweep_junit_xml

    failing, _ = _judged_frame(measured, "peak_saving_share >= 0.99")
    jobs = [
        {
            "job": 0,
            "dir": "0",
            "overrides": ["+model=mlp"],
            "exit_code": 0,
            "verdict": Status.PASS,
            "error": None,
            "frame": measured,
            "required": REQUIRED,
        },
        {
            "job": 1,
            "dir": "1",
            "overrides": ["claim=x"],
            "exit_code": 1,
            "verdict": Status.FAIL,
            "error": "claim fails",
            "frame": failing,
            "required": REQUIRED,
        },
        {
            "job": 2,
            "dir": "2",
            "overrides": [],
            "exit_code": 70,
            "verdict": "NO_OUTCOME",
            "error": "killed",
            "frame": None,
            "required": [],
        },
    ]
    data = sweep_junit_xml(jobs, "sweep")
    lxml.XMLSchema(lxml.parse(str(DATA / "junit.xsd"))).assertValid(lxml.fromstring(data))
    cases = ET.fromstring(data).find("testsuite").findall("testcase")
    assert [c.get("name") for c in cases] == ["job 0: +model=mlp", "job 1: claim=x", "job 2: (no overrides)"]
    assert [(c.find("failure") is not None, c.find("error") is not None) for c in cases] == [
        (False, False),
        (True, False),
        (False, True),
    ]
    assert "peak_saving_share >= 0.99" in cases[1].find("failure").text


def test_comparison_junit_and_summary_name_each_regression(tmp_path):
    lxml = pytest.importorskip("lxml.etree")
    from reportgen.ci.junit import comparison_junit_xml
    from reportgen.ci.summary import comparison_markdown

    rose = "overhead ratio rose by 12.0 pp (1.300 → 1.420), more than the allowed 5 pp"
    result = {
        "verdicts": {"base": Status.PASS, "new": Status.PASS},
        "regressions": [rose],
        "unclear": [],
        "outcome": "regressed",
        "limits": {"max_overhead_increase_pp": 5.0, "max_saving_decrease_pp": 5.0},
        "costs": {
            "base": {"overhead_ratio": 1.3, "saved_activation_share": 0.75},
            "new": {"overhead_ratio": 1.42, "saved_activation_share": None},
            "overhead_change_pp": 12.0,
            "saving_change_pp": None,
        },
    }
    data = comparison_junit_xml(result, "compare")
    lxml.XMLSchema(lxml.parse(str(DATA / "junit.xsd"))).assertValid(lxml.fromstring(data))
    cases = {c.get("name"): c for c in ET.fromstring(data).iter("testcase")}
    assert cases["overhead ratio rises at most 5 pp"].find("failure").get("message") == rose
    assert cases["saved-activation share falls at most 5 pp"].find("skipped") is not None
    assert all(cases[n].find("failure") is None for n in ("BASE verifies", "NEW verifies", "NEW's claim holds"))
    text = comparison_markdown(result, "base|run", "new", tmp_path)
    assert (
        text.startswith("## reportgen compare: REGRESSED")
        and "base\\|run" in text
        and "| 1.300 | 1.420 | +12.0 pp |" in text
    )


# --------------------------------------------------------------------------- signed and verified


@pytest.fixture(scope="module")
def pristine_claim_run(measured, tmp_path_factory, signing_key_pair):
    """A signed run folder of the stored frame with a release claim whose peak clause is not met (made once)."""
    from conftest import tiny_meta

    from reportgen.commands.run import write_results
    from reportgen.report.render import render_report
    from reportgen.trust.keys import load_signing_key, signature_label
    from reportgen.trust.signing import sign_run

    out = tmp_path_factory.mktemp("claim") / "run"
    out.mkdir()
    frame, claim = _judged_frame(measured, "peak_saving_share >= 0.99", "overhead_ratio <= 50")
    key = load_signing_key(True, str(signing_key_pair[0]))
    meta = tiny_meta(out, signature_label(key))
    meta["claim"]["release"] = claim.record()
    verdict = claim_verdict(frame, REQUIRED)
    write_results(frame, out)
    render_report(frame, meta, verdict, out, pdf=False, required=REQUIRED)
    write_ci_outputs(frame, meta, verdict, REQUIRED, out)
    sign_run(frame, meta, verdict, out, key, required=REQUIRED)
    finish_ci_outputs(frame, verdict, out)
    return out, frame, meta, key


@pytest.fixture
def claim_run(pristine_claim_run, tmp_path):
    """A private copy of :func:`pristine_claim_run`'s folder (tests edit files in it), with its frame, meta and key."""
    import shutil

    out, *rest = pristine_claim_run
    return (Path(shutil.copytree(out, tmp_path / "run")), *rest)


def _verify(folder, public):
    from reportgen.trust.keys import load_public_key
    from reportgen.verify import verify_target

    return {c.name: c for c in verify_target(folder, load_public_key(public)).checks}


def test_page_one_and_the_statement_carry_the_claim(claim_run):
    out, *_ = claim_run
    html = (out / "report.html").read_text()
    assert "Recompute saves memory, cheaply." in html and "peak_saving_share &gt;= 0.99" in html and "not met" in html
    statement = json.loads(
        __import__("base64").b64decode(json.loads((out / "statement.dsse.json").read_text())["payload"])
    )
    assert statement["predicate"]["claim"]["release"]["clauses"][1]["bound"] == 0.99
    assert {s["name"] for s in statement["subject"]} >= {"junit.xml", "summary.md"}
    record = json.loads((out / "verdict.json").read_text())
    assert (record["verdict"], record["exit_code"]) == (Status.FAIL, 1)
    assert [c["outcome"] for c in record["clauses"]] == ["met", "not met", "met"]


def test_verify_rejudges_clauses_and_binds_verdict_json(claim_run, signing_key_pair):
    out, *_ = claim_run
    checks = _verify(out, signing_key_pair[1])
    assert checks["release claim"].status == "PASS" and "3 clauses" in checks["release claim"].detail
    assert checks["verdict.json"].status == "PASS"
    assert all(c.status != "FAIL" for c in checks.values())
    record = json.loads((out / "verdict.json").read_text())
    record["verdict"], record["exit_code"] = Status.PASS, 0
    (out / "verdict.json").write_text(json.dumps(record))
    assert _verify(out, signing_key_pair[1])["verdict.json"].status == "FAIL"


def test_an_edited_clause_result_fails_verification(claim_run, signing_key_pair):
    """Edited in results.json: the digest fails and the row's status no longer follows from its value."""
    out, *_ = claim_run
    frame = frame_from_json((out / "results.json").read_text())
    frame.loc[frame.item == "peak_saving_share >= 0.99", "status"] = Status.PASS
    (out / "results.json").write_text(frame_to_json(frame))
    checks = _verify(out, signing_key_pair[1])
    assert checks["subject results.json"].status == "FAIL"


def test_a_re_signed_clause_value_fails_its_re_derivation(claim_run, signing_key_pair, tmp_path):
    """A forger with the key who makes the clause's value meet its bound (status consistent with it) is
    caught: the value no longer follows from the memory check's signed row."""
    from reportgen.trust.signing import sign_run

    out, frame, meta, key = claim_run
    forged = frame.copy()
    mask = forged.item == "peak_saving_share >= 0.99"
    forged.loc[mask, "value"], forged.loc[mask, "status"] = 0.995, Status.PASS
    folder = tmp_path / "forged"
    folder.mkdir()
    from reportgen.commands.run import write_results

    write_results(forged, folder)
    sign_run(forged, meta, claim_verdict(forged, REQUIRED), folder, key, required=REQUIRED)
    checks = _verify(folder, signing_key_pair[1])
    assert checks["verdict"].status == "PASS"  # statuses follow from the (forged) values ...
    assert checks["release claim"].status == "FAIL"  # ... but the value does not follow from the measurement
    assert "the signed numbers give" in checks["release claim"].detail


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_mlp_claim_end_to_end_and_a_bound_just_beyond_fails_naming_it(tmp_path, capsys):
    """The mlp claim file runs; then a peak-saving bound just beyond what was measured (the tracker's
    bytes are exact, so the second run measures the same share) turns the verdict to FAIL naming it."""
    from conftest import run_pipeline

    args = ("+model=mlp", "parity.batch_size=512", "claim=mlp_release")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    code, frame = run_pipeline(tmp_path / "a", *args)
    table = {c["clause"]: c for c in claim_table(frame)}
    assert list(table) == [
        "training unchanged",
        "peak_saving_share >= 0.20",
        "overhead_ratio <= 2.5",
        "fits: batch 4096 within 1 GiB",
        "task metric within tolerance",
    ]
    assert all(c["value"] is not None for c in table.values())  # each clause with its measured value
    share = table["peak_saving_share >= 0.20"]["value"]
    assert share > 0.2 and table["peak_saving_share >= 0.20"]["outcome"] == "met"
    html = (tmp_path / "a" / "report.html").read_text()
    page_one = html[: html.index("<h2>Checks</h2>")]
    assert "so batch 4096 fits in 1 GiB" in page_one
    assert all(c["measured"] in page_one for c in table.values())
    capsys.readouterr()
    beyond = f"peak_saving_share >= {share * 1.0001:.8f}"
    clauses = f'claim.clauses=["{beyond}","fits: batch 4096 within 1 GiB"]'
    code, frame = run_pipeline(tmp_path / "b", "+model=mlp", "parity.batch_size=512", clauses)
    assert code == 1 and claim_verdict(frame, REQUIRED) == Status.FAIL
    assert {c["clause"]: c["outcome"] for c in claim_table(frame)}[beyond] == "not met"
    console = capsys.readouterr().out.splitlines()
    assert console[-3].startswith(f"reportgen: clause NOT MET: {beyond}") and "webbrowser" in console[-2]
    assert console[-1].startswith("reportgen: claim FAILS (FAIL); report: ")  # the verdict is the last line
    assert (tmp_path / "b" / "summary.md").read_text().startswith("## reportgen: claim FAILS (FAIL)")
    assert json.loads((tmp_path / "b" / "verdict.json").read_text())["exit_code"] == 1
    doc = (DATA.parents[1] / "docs" / "results-schema.md").read_text().splitlines()
    documented = {
        n for line in doc if line.startswith("| `") for n in re.findall(r"`([a-z_0-9]+)`", line.split("|")[1])
    }
    assert set(frame.columns) - documented == set()  # the clause rows' columns are in docs/results-schema.md
