"""The claim sentence and its clauses agree (issue 36, item 3): every quantity the sentence states
is judged by a clause at least as strictly, or the claim is refused before model work; with
``claim.unjudged_ok=true`` it is printed on page 1 as "not judged" and signed with the claim."""

from __future__ import annotations

import pytest
from conftest import compose_config
from omegaconf import OmegaConf

from reportgen.claim import ClaimError, parse_claim
from reportgen.claim.clauses import claim_from_record
from reportgen.claim.sentence import FITS_IN, OVERHEAD, SAVING, stated_quantities
from reportgen.paths import conf_dir

NINETY = "Recomputing every block cuts peak memory by 90 % at zero overhead."


def _parse(text: str, *clauses: str, ok: bool = False):
    return parse_claim(OmegaConf.create({"text": text, "clauses": list(clauses), "unjudged_ok": ok}))


@pytest.mark.parametrize(
    "text, expected",
    [
        (NINETY, [("90 %", SAVING, 0.9), ("zero overhead", OVERHEAD, 1.0)]),
        ("saves 30 % of peak memory with 10 % overhead", [("30 %", SAVING, 0.3), ("10 %", OVERHEAD, 1.1)]),
        ("at 25 % overhead, the peak is 20 % lower", [("25 %", OVERHEAD, 1.25), ("20 %", SAVING, 0.2)]),
        ("runs 12 % better", [("12 %", "", 0.12)]),
    ],
)
def test_the_sentence_s_quantities_are_read_with_what_they_are_of(text, expected):
    assert [(s.words, s.kind, pytest.approx(s.value)) for s in stated_quantities(text)] == expected


def test_a_fits_statement_carries_its_batch_sequence_and_memory():
    (fits,) = [s for s in stated_quantities("so batch 64 at sequence 1024 fits in 80 GiB") if s.kind == FITS_IN]
    assert (fits.batch, fits.seq, fits.value) == (64, 1024, 80 * 2**30)


def test_the_shipped_claims_state_nothing_their_clauses_do_not_judge():
    for name in ("gpt_release", "mlp_release"):
        assert parse_claim(OmegaConf.load(conf_dir() / "claim" / f"{name}.yaml")).unjudged == ()


def test_a_ninety_percent_sentence_over_a_weaker_clause_is_refused_naming_both_quantities():
    with pytest.raises(ClaimError) as raised:
        _parse(NINETY, "peak_saving_share >= 0.5")
    said = str(raised.value)
    assert '"90 %" (a memory saving): add `peak_saving_share >= 0.9`' in said
    assert '"zero overhead" (a step-time overhead): add `overhead_ratio <= 1`' in said
    assert "claim.unjudged_ok=true" in said and "\n" not in said


@pytest.mark.parametrize(
    "clauses, left",
    [
        (["peak_saving_share >= 0.9", "overhead_ratio <= 1.0"], 0),
        (["peak_saving_share >= 0.95", "overhead_ratio <= 1.0"], 0),  # stricter than the sentence: judged
        (["peak_saving_share >= 0.89", "overhead_ratio <= 1.0"], 1),  # weaker: the 90 % is not judged
        (["peak_saving_share >= 0.9", "overhead_ratio <= 1.01"], 1),
    ],
)
def test_a_clause_judges_a_quantity_only_as_strictly_as_stated(clauses, left):
    assert len(_parse(NINETY, *clauses, ok=True).unjudged) == left


def test_a_fits_clause_must_match_the_stated_shape_and_memory():
    text = "so batch 64 at sequence 1024 fits in 80 GiB"
    assert _parse(text, "fits: batch 64 at seq 1024 within 80 GiB").unjudged == ()
    assert _parse(text, "fits: batch 64 at seq 1024 within 70 GiB").unjudged == ()
    for other in ("fits: batch 32 at seq 1024 within 80 GiB", "fits: batch 64 at seq 512 within 80 GiB"):
        assert len(_parse(text, other, ok=True).unjudged) == 1
    assert len(_parse("fits in 80 GB at batch 64", "fits: batch 64 within 80 GiB", ok=True).unjudged) == 1


def test_unjudged_ok_keeps_the_claim_with_its_unjudged_quantities_signed():
    claim = _parse(NINETY, "peak_saving_share >= 0.5", ok=True)
    assert claim.unjudged == ('"90 %" (a memory saving)', '"zero overhead" (a step-time overhead)')
    assert claim_from_record(claim.record()) == claim


def test_the_ninety_percent_claim_stops_the_run_before_any_model_work(tmp_path, capsys):
    from reportgen.commands import run as pipeline

    cfg = compose_config("+model=ffn", f"claim.text='{NINETY}'", 'claim.clauses=["peak_saving_share >= 0.5"]')
    assert pipeline.run(cfg, tmp_path) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("reportgen: cannot start: claim.text states what no clause judges")
    assert not (tmp_path / "results.json").exists()
