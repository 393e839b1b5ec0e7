"""Every quantity of the claim sentence is bound to a clause (issue 44, item 2).

Paraphrases ("halves", "ninety percent", "10x", "90pct", "no slowdown") are quantities like "90 %":
each must be judged by a clause of the same metric, direction and a bound no weaker, or the claim is
refused before model work; with ``claim.unjudged_ok=true`` the sentence is "not judged" in every output
(page 1, summary.md, verdict.json, junit.xml, the sweep summary, a comparison). A clause that cannot miss
(``peak_saving_share >= 0``) or has no finite bound (``overhead_ratio <= 1e999``) is refused, exit 2,
before any model work.

The frame is a real ``+model=mlp claim=mlp_release parity.batch_size=512`` run
(tests/data/mlp_claim_results.json.gz), its clause rows judged again for each claim here.
"""

from __future__ import annotations

import gzip
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import compose_config, tiny_meta
from omegaconf import OmegaConf

from reportgen.ci import finish_ci_outputs, write_ci_outputs
from reportgen.claim import ClaimError, clause_rows, parse_claim
from reportgen.claim.rows import not_judged, sentence_rows
from reportgen.claim.sentence import OVERHEAD, SAVING, STEP_TIME, stated_quantities
from reportgen.config import RELEASE_CLAIM
from reportgen.results import Role, Status, claim_verdict, frame_from_json, to_frame

DATA = Path(__file__).resolve().parents[1] / "data"
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
#: The issue's four paraphrases, each over a clause that does not bind what it states.
PARAPHRASES = {
    "halves": "Recomputation halves peak memory with no slowdown.",
    "ninety percent": "Recomputation cuts peak memory by ninety percent.",
    "10x": "Recomputation needs 10x less peak memory.",
    "90pct": "Recomputation saves 90pct of peak memory.",
}


def _parse(text: str, *clauses: str, ok: bool = False):
    return parse_claim(OmegaConf.create({"text": text, "clauses": list(clauses), "unjudged_ok": ok}))


@pytest.mark.parametrize(
    "text, expected",
    [
        (PARAPHRASES["halves"], [("halves", SAVING, 0.5), ("no slowdown", OVERHEAD, 1.0)]),
        (PARAPHRASES["ninety percent"], [("ninety percent", SAVING, 0.9)]),
        (PARAPHRASES["10x"], [("10x", SAVING, 0.9)]),
        (PARAPHRASES["90pct"], [("90pct", SAVING, 0.9)]),
        (
            "ninety-five per cent less memory at 1.5× slower steps",
            [("ninety-five per cent", SAVING, 0.95)] + [("1.5×", OVERHEAD, 1.5)],
        ),
        ("at most doubles the step time; 250 ms per step", [("doubles", OVERHEAD, 2.0), ("250 ms", STEP_TIME, 250)]),
        (
            "with step time unchanged and without extra memory",
            [("step time unchanged", OVERHEAD, 1.0), ("without extra memory", SAVING, 0.0)],
        ),
        ("On an H100, GPT-2 in bf16 recomputes 12 layers", [("12", "", math.nan)]),
    ],
)
def test_paraphrases_are_quantities_with_what_they_are_of(text, expected):
    got = [(s.words, s.kind, s.value) for s in stated_quantities(text)]
    assert [(w, k) for w, k, _ in got] == [(w, k) for w, k, _ in expected]
    assert [v for *_, v in got] == pytest.approx([v for *_, v in expected], nan_ok=True)


@pytest.mark.parametrize("name", PARAPHRASES)
def test_a_paraphrase_no_clause_binds_is_refused_naming_it(name):
    with pytest.raises(ClaimError) as raised:
        _parse(PARAPHRASES[name], "peak_saving_share >= 0.2")
    said = str(raised.value)
    assert said.startswith("claim.text states what no clause judges") and "\n" not in said
    assert f'"{name}" (a memory saving)' in said or f'"{name.split()[0]}' in said


def test_a_paraphrase_bound_by_clauses_as_strict_is_judged():
    claim = _parse(PARAPHRASES["halves"], "peak_saving_share >= 0.5", "overhead_ratio <= 1.0")
    assert claim.unjudged == ()
    weaker = _parse(PARAPHRASES["halves"], "peak_saving_share >= 0.49", "overhead_ratio <= 1.0", ok=True)
    assert weaker.unjudged == ('"halves" (a memory saving)',)  # direction and metric match, the bound is weaker


@pytest.mark.parametrize(
    "clause, says",
    [
        ("peak_saving_share >= 0", "cannot miss"),
        ("peak_saving_share >= 0 %", "cannot miss"),
        ("peak_saving_share >= 150%", "cannot be met"),
        ("overhead_ratio <= 1e999", "not a finite number"),
        ("step_time_ms < 1e999", "not a finite number"),
        ("overhead_ratio <= 0", "cannot be met"),
        ("fits: batch 8 within 1e999 GiB", "not a finite size"),
    ],
)
def test_a_clause_that_cannot_miss_or_has_no_finite_bound_is_refused(clause, says):
    with pytest.raises(ClaimError) as raised:
        _parse("", clause)
    said = str(raised.value)
    assert said.startswith(f"claim clause {clause!r}: ") and says in said and "\n" not in said


@pytest.mark.parametrize("clause", ["peak_saving_share >= 0", "overhead_ratio <= 1e999"])
def test_the_issue_s_clauses_stop_the_run_before_any_model_work(clause, tmp_path, capsys, monkeypatch):
    from reportgen.commands import run as pipeline

    def no_model_work(cfg):
        raise AssertionError("the model was built")

    monkeypatch.setattr(pipeline, "prepare", no_model_work)
    cfg = compose_config("+model=ffn", f"claim.text='{PARAPHRASES['halves']}'", f'claim.clauses=["{clause}"]')
    assert pipeline.run(cfg, tmp_path) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [out[0]] and out[0].startswith(f"reportgen: cannot start: claim clause {clause!r}: ")
    assert not any(p.name.startswith("results") for p in tmp_path.iterdir())


# --------------------------------------------------------------------------- every output says "not judged"


@pytest.fixture(scope="module")
def measured():
    """The checks' rows of the stored mlp run (its clause rows dropped)."""
    frame = frame_from_json(gzip.open(DATA / "mlp_claim_results.json.gz").read().decode())
    return frame[frame.check != RELEASE_CLAIM].reset_index(drop=True)


def _signed_run(measured, out: Path, claim, key):
    """A signed run folder of ``measured`` with ``claim`` judged, as the pipeline writes it."""
    from reportgen.commands.run import write_results
    from reportgen.report.render import render_report
    from reportgen.trust.keys import signature_label
    from reportgen.trust.signing import sign_run

    out.mkdir(parents=True)
    (out / ".hydra").mkdir()
    (out / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(compose_config("+model=mlp")))
    frame = to_frame([*_as_rows(measured), *clause_rows(measured, claim), *sentence_rows(claim)])
    meta = tiny_meta(out, signature_label(key))
    meta["claim"]["release"] = claim.record()
    verdict = claim_verdict(frame, REQUIRED)
    write_results(frame, out)
    render_report(frame, meta, verdict, out, pdf=False, required=REQUIRED)
    write_ci_outputs(frame, meta, verdict, REQUIRED, out)
    sign_run(frame, meta, verdict, out, key, required=REQUIRED)
    finish_ci_outputs(frame, verdict, out)
    return frame, verdict


def _as_rows(frame):
    """The stored frame's rows as Row objects (their stated statuses)."""
    from reportgen.results import Row

    fields = {"check", "item", "variant", "metric", "value", "threshold", "comparator", "status", "detail"}
    fields |= {"seconds", "role", "unit", "threshold_value", "on_miss"}
    out = []
    for record in frame.to_dict("records"):
        record = {k: v for k, v in record.items() if not (isinstance(v, float) and math.isnan(v))}
        extra = {k: v for k, v in record.items() if k not in fields}
        out.append(Row(**{k: v for k, v in record.items() if k in fields}, extra=extra))
    return out


@pytest.mark.parametrize("name", PARAPHRASES)
def test_a_sentence_not_judged_says_so_in_every_output(name, measured, tmp_path, signing_key_pair):
    from reportgen.ci.summary import comparison_markdown
    from reportgen.compare.derive import compare, comparison_frame, load_side
    from reportgen.sweep.table import console_table, summary_frame
    from reportgen.trust.keys import load_public_key, load_signing_key
    from reportgen.verify import verify_target

    claim = _parse(PARAPHRASES[name], "peak_saving_share >= 0.2", ok=True)
    assert claim.unjudged and name.split()[0] in claim.unjudged[0]
    key = load_signing_key(True, str(signing_key_pair[0]))
    out = tmp_path / "run"
    frame, verdict = _signed_run(measured, out, claim, key)
    assert verdict == Status.PASS  # the clauses hold; the sentence is not what was judged
    assert not_judged(frame) == list(claim.unjudged)
    html = (out / "report.html").read_text()
    assert "Not judged:" in html[: html.index("<h2>Checks</h2>")]  # page 1
    assert "The sentence is not judged" in (out / "summary.md").read_text()
    record = json.loads((out / "verdict.json").read_text())
    assert (record["sentence"], record["not_judged"]) == ("not judged", list(claim.unjudged))
    case = next(c for c in ET.parse(out / "junit.xml").iter("testcase") if c.get("name") == "claim sentence")
    assert case.find("skipped").get("message").startswith("not judged: the sentence states")
    checks = {c.name: c for c in verify_target(out, load_public_key(signing_key_pair[1])).checks}
    assert checks["release claim"].status == "PASS" and checks["verdict.json"].status == "PASS"
    job = {"job": 0, "dir": str(out), "overrides": ["+model=mlp"], "exit_code": 0, "verdict": verdict}
    job |= {"error": None, "frame": frame, "required": REQUIRED, "has_report": True}
    sweep = summary_frame([job])
    assert set(sweep.not_judged) == {"; ".join(claim.unjudged)}
    assert "the claim sentence is not judged" in console_table(sweep, 0, tmp_path)
    result = compare(load_side("BASE", out), load_side("NEW", out))
    assert result["not_judged"] == {"base": list(claim.unjudged), "new": list(claim.unjudged)}
    assert "claim sentence" in set(comparison_frame(result).name)
    assert "not judged: " in comparison_markdown(result, "base", "new", tmp_path)


def test_verify_fails_a_signed_frame_without_the_not_judged_row(measured):
    from reportgen.verify.claim import check_claim
    from reportgen.verify.outcome import VerifyError

    claim = _parse(PARAPHRASES["10x"], "peak_saving_share >= 0.2", ok=True)
    rows = _as_rows(measured)
    frame = to_frame([*rows, *clause_rows(measured, claim)])  # the sentence row left out
    with pytest.raises(VerifyError, match="unjudged"):
        check_claim({"claim": {"release": claim.record()}}, frame)
    assert "clauses" in check_claim(
        {"claim": {"release": claim.record()}}, to_frame([*rows, *clause_rows(measured, claim), *sentence_rows(claim)])
    )
    assert (frame.role == Role.SENTENCE).sum() == 0


def test_sign_refuses_a_pending_run_whose_clause_has_no_finite_bound_in_one_line(tmp_path, signing_key_pair, capsys):
    """A run folder left pending by a version that let ``overhead_ratio <= 1e999`` through (its signed statement
    cannot carry infinity): ``reportgen.sign`` refuses it in one line, exit 2, naming the clause; nothing signed."""
    from conftest import tiny_frame

    from reportgen.claim.clauses import QUANTITY, Claim, Clause
    from reportgen.commands import sign
    from reportgen.commands.run import write_results
    from reportgen.trust.keys import load_private_key
    from reportgen.trust.manifest import mark_pending, start_manifest

    private, _ = signing_key_pair
    out = tmp_path / "run"
    (out / ".hydra").mkdir(parents=True)
    (out / ".hydra" / "config.yaml").write_text('claim:\n  clauses: ["overhead_ratio <= 1e999"]\n')
    for name in ("overrides.yaml", "hydra.yaml"):
        (out / ".hydra" / name).write_text("{}\n")
    infinite = Clause(
        text="overhead_ratio <= 1e999", kind=QUANTITY, metric="overhead_ratio_ci_high", comparator="<=", bound=math.inf
    )
    claim = Claim(text="overhead_ratio <= 1e999.", clauses=(infinite,))
    start_manifest(out)
    write_results(to_frame([*_as_rows(tiny_frame()), *clause_rows(tiny_frame(), claim)]), out)
    meta = tiny_meta(out)
    meta["claim"]["release"] = claim.record()
    mark_pending(out, meta, REQUIRED, pdf=False, sign=True, private_key=load_private_key(private))
    assert sign.main([str(out), "--key", str(private)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "claim clause 'overhead_ratio <= 1e999': the bound inf is not a finite number" in err[0]
    assert not (out / "statement.dsse.json").exists() and (out / "report.pending.json").is_file()
