"""The report's detection limit (issue 43, item 2): the smallest relative error in a recomputed activation that
gradient parity catches, found by bisection over the decades 1e-6 … 1 with real faulty backwards; it rises with
the tolerance, is stated on page 1, re-derived by ``reportgen.verify`` (an edited limit fails) and compared by
``reportgen.compare``. Fixtures: reportgen/models/ffn.py, reportgen/models/mlp.py."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from conftest import make_key, signed_run, small_setup, tiny_frame, tiny_meta

from reportgen.checks.controls import fixed_batch
from reportgen.checks.controls.limit import (
    BF16_ROUNDOFF,
    DECADES,
    bisect,
    detection_limit,
    limit_of,
    limit_problems,
    probe,
    stated_limit,
)
from reportgen.compare.derive import Side, limit_change
from reportgen.config import CONTROLS
from reportgen.report.render import render_html
from reportgen.results import Role, Status, to_frame
from reportgen.trust.keys import load_public_key
from reportgen.verify import verify
from reportgen.verify.outcome import FAIL, PASS

#: parity.rtol/atol 1e3 times torch.testing's float32 defaults (1.3e-6, 1e-5).
WIDE = ("parity.rtol=1.3e-3", "parity.atol=1e-2")


def limit_rows(*overrides: str):
    """``(setup, baseline, rows)``: the controls' baseline of a small run and the detection limit's rows on it."""
    setup = small_setup(*overrides)
    base = fixed_batch.baseline(setup, setup.observed)
    assert not isinstance(base, str), base
    return setup, base, detection_limit(setup, base)


@pytest.fixture(scope="module")
def ffn():
    """The ffn's limit at the default tolerances and at :data:`WIDE` ones (one search each)."""
    return {"default": limit_rows("+model=ffn"), "wide": limit_rows("+model=ffn", *WIDE)}


def split(rows):
    """``(probe rows, the limit row)``."""
    *probes, limit = rows
    assert {r.role for r in probes} == {Role.LIMIT_PROBE} and limit.role == Role.DETECTION_LIMIT
    return probes, limit


@pytest.mark.parametrize("first_caught", range(len(DECADES) + 1))
def test_bisection_finds_the_smallest_caught_decade_in_three_probes(first_caught):
    """Whatever decade is the first caught (len(DECADES) = none), three probes find it and bracket it."""
    probed: dict[float, bool] = {}

    def caught(e: float) -> bool:
        probed[e] = e >= DECADES[first_caught] if first_caught < len(DECADES) else False
        return probed[e]

    bisect(caught)
    assert len(probed) <= 3
    limit = limit_of(probed)
    assert (math.isnan(limit) and first_caught == len(DECADES)) or limit == DECADES[first_caught]


def test_an_unbracketed_limit_is_unknown():
    assert math.isnan(limit_of({1e-3: True}))  # 1e-4 never probed: the limit could be lower
    assert limit_of({1e-6: True}) == 1e-6 and limit_of({1e-3: True, 1e-4: False}) == 1e-3


@pytest.mark.parametrize("model", ["ffn", "mlp"])
def test_a_model_states_a_limit_that_its_probes_bracket(model, ffn):
    """The limit is a decade whose probe failed gradient parity, and the decade below it passed gradient parity
    (both re-run here through the same fault and judge): the limit is where detection starts."""
    setup, base, rows = ffn["default"] if model == "ffn" else limit_rows(f"+model={model}")
    probes, limit = split(rows)
    assert limit.status == Status.PASS and limit.unit == "relative" and limit.value in DECADES
    assert limit.extra["region"] == base.region.path and limit.extra["probes"] == len(probes) <= 3
    assert limit.seconds == pytest.approx(sum(p.seconds for p in probes)) and limit.seconds > 0
    assert f"this report detects a recompute error of {limit.value:.0e} relative or larger" in limit.detail
    at, below = probe(setup, base, limit.value), probe(setup, base, limit.value / 10)
    assert at.value == 1.0 and at.extra["caught_by"].endswith(".grad")
    assert limit.value == DECADES[0] or (below.value == 0.0 and below.extra["worst_tolerance_used"] <= 1)


def test_the_limit_rises_when_the_tolerance_rises(ffn):
    """parity.rtol/atol 1000 times wider: the limit moves up (or nothing up to 1 is caught) and passes 2^-8,
    a WARN naming bf16 as what would pass unseen."""
    (_, default), (_, wide) = split(ffn["default"][2]), split(ffn["wide"][2])
    assert default.value < BF16_ROUNDOFF and default.status == Status.PASS
    assert math.isnan(wide.value) or wide.value >= 100 * default.value
    assert wide.status == Status.WARN and wide.detail.endswith("would pass unseen")
    assert "bfloat16 (unit roundoff 3.9e-03)" in wide.detail.split("; a recompute at ")[1]


def test_a_failing_or_unscalable_baseline_states_no_limit(ffn):
    setup, base, _ = ffn["default"]
    (row,) = detection_limit(setup, "not run: the plain twin raised RuntimeError: boom")
    assert row.status == Status.INFO and row.detail.startswith("not stated: not run") and math.isnan(row.value)
    failing = fixed_batch.Baseline(**{**vars(base), "grads_fail": ["0.net.0.weight.grad"]})
    (row,) = detection_limit(setup, failing)
    assert "gradient parity already fails" in row.detail and not row.comparator


# --------------------------------------------------------------------------- page 1, verify, compare


def frame_with(rows):
    """:func:`conftest.tiny_frame` (parity rows) with ``rows`` (the detector controls') after it."""
    return pd.concat([tiny_frame(), to_frame(rows)], ignore_index=True)


def test_page_one_states_the_limit_or_why_not(ffn, tmp_path):
    frame = frame_with(ffn["default"][2])
    page = render_html(frame, tiny_meta(tmp_path), "PASS", ["gradient parity"])
    stated, page = stated_limit(frame), page.replace("&#34;", '"')
    tolerances = page[page.index("<tr><td>Tolerances</td>") :].split("</tr>")[0]
    assert tolerances.endswith(f"<br>{stated['said']}</td>") and stated["detail"] in page  # page 1, the section
    assert (
        stated["said"]
        == f'this report detects a recompute error of {stated["value"]:.0e} relative or larger in region "0"'
    )
    wide = stated_limit(frame_with(ffn["wide"][2]))
    assert wide["status"] == Status.WARN and "bfloat16 (unit roundoff 3.9e-03)" in wide["said"]
    meta = tiny_meta(tmp_path) | {"detectors": "detectors not proven: controls.enabled=false"}
    page = render_html(tiny_frame(), meta, "PASS", ["gradient parity"])  # no controls' rows: the banner says why
    assert "this report detects" not in page and "DETECTORS NOT PROVEN" in page


def test_verify_re_derives_the_limit_and_refuses_an_edited_one(ffn, tmp_path):
    private, public = make_key(tmp_path / "keys")
    key = load_public_key(public)
    frame = frame_with(ffn["default"][2])
    honest = signed_run(tmp_path / "honest", private, pdf=False, frame=frame)
    checks = verify(honest, key)
    assert [c.status for c in checks if c.name == "detection limit"] == [PASS] and not limit_problems(frame)
    limit = frame.role == Role.DETECTION_LIMIT
    lowered = frame.copy()
    lowered.loc[limit, "value"] = 1e-6  # still <= 2^-8, so its own status stays PASS: only the probes tell
    edited = signed_run(tmp_path / "edited", private, pdf=False, frame=lowered)
    (line,) = [c.line for c in verify(edited, key) if c.status == FAIL]
    value = split(ffn["default"][2])[1].value
    assert line == f"FAIL detection limit: the detection limit says 1e-06, its 3 probe(s) give {value:g}"
    wide = frame_with(ffn["wide"][2])
    lenient = wide.copy()
    lenient.loc[lenient.role == Role.DETECTION_LIMIT, ["threshold_value", "status"]] = [1.0, Status.PASS]
    edited = signed_run(tmp_path / "lenient", private, pdf=False, frame=lenient)
    (line,) = [c.line for c in verify(edited, key) if c.status == FAIL]
    assert "the detection limit's threshold_value is 1, a limit's is 0.00390625" in line, line


def test_compare_states_a_changed_limit(ffn, tmp_path):
    sides = {k: Side(k, tmp_path, frame_with(ffn[k][2]), ["gradient parity"], {}) for k in ("default", "wide")}
    change = limit_change(sides["default"], sides["wide"])
    assert change["base"] == f"{split(ffn['default'][2])[1].value:.0e} in region '0'"
    assert change["change"].startswith("the detection limit changed from") and "misses" in change["change"]
    assert limit_change(sides["default"], sides["default"])["change"] == ""
    off = Side("NEW", tmp_path, tiny_frame(), ["gradient parity"], {})
    assert limit_change(sides["default"], off)["new"] == "not stated"


def test_the_limit_rows_belong_to_the_controls(ffn):
    assert {r.check for r in ffn["default"][2]} == {CONTROLS}
