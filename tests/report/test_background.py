"""The report's worker beside the last checks (reportgen.report.background, issue 28 item 9): it starts
only once no timed check is left, writes the very bytes the pipeline's own render writes, reuses the
plots it drew ahead only for unchanged rows, and a worker that is gone leaves the render to the pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REQUIRED, cost_rows, tiny_meta

from reportgen.checks import REGISTRY, plots, run_order
from reportgen.checks.plots import draw_ahead, rows_key, section_plots, timing_plots
from reportgen.config import TIME
from reportgen.report import background
from reportgen.report.render import render_report
from reportgen.results import INFO, Role, Row, claim_verdict, to_frame

EPOCH = "1704164645"  # 2024-01-02T03:04:05Z


def step_rows(n: int = 12) -> list[Row]:
    """Per-step rows of the warm-step time check, as it writes them (timing_plots draws them)."""
    return [
        Row(
            check=TIME,
            item=f"step {k}",
            variant=variant,
            metric="step_time_ms",
            value=10.0 + k % 5 + (variant == "recompute") * 3,
            status=INFO,
            role=Role.STEP,
            unit="ms",
            extra={"step_index": k},
        )
        for variant in ("plain", "recompute")
        for k in range(n)
    ]


def later_rows() -> list[Row]:
    """Rows of a check that runs after the timing check, with columns the earlier rows lack."""
    return [
        Row(
            check="task metrics",
            item="seed 0",
            variant="recompute",
            metric="accuracy",
            value=0.95,
            status=INFO,
            role=Role.RUN,
            extra={"seed": 0, "cache_key": None, "accepted_examples": 4096},
        )
    ]


@pytest.fixture
def registry():
    order = run_order(REGISTRY, distributed=False, joined=False)
    timed = next(i for i, c in enumerate(order) if any(s.name == TIME for s in c.sections))
    yield order, timed
    background.stop()


def test_no_worker_while_a_timed_check_is_left_and_one_after_it(registry):
    order, timed = registry
    background.follow(order, timed - 1, step_rows())
    assert background._worker is None  # the timing check measures with nothing beside it
    background.follow(order, timed, step_rows())
    assert background._worker is not None and background._worker.process.is_alive()
    background.follow(order, timed, step_rows(), world_size=2)  # already started: only fed rows


def test_the_worker_writes_the_bytes_the_pipeline_writes(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    order, timed = registry
    rows = cost_rows() + step_rows()
    background.follow(order, timed, rows)  # forked with the memory and time rows: their plots are drawn there
    rows = rows + later_rows()
    background.follow(order, timed + 1, rows)  # sent to it
    frame = to_frame(rows)
    meta = tiny_meta(Path("/runs/same-folder")) | {"created": "2024-01-02T03:04:05+00:00"}
    verdict = claim_verdict(frame, REQUIRED)
    (tmp_path / "beside").mkdir(), (tmp_path / "here").mkdir()
    paths = background.render_beside(frame, meta, verdict, tmp_path / "beside", required=REQUIRED)
    assert paths == {"html": tmp_path / "beside" / "report.html", "pdf": tmp_path / "beside" / "report.pdf"}
    assert background._worker is None  # ended with the render
    render_report(frame, meta, verdict, tmp_path / "here", required=REQUIRED)
    for name in ("report.html", "report.pdf"):
        assert (tmp_path / "beside" / name).read_bytes() == (tmp_path / "here" / name).read_bytes()
    assert b"<svg" in (tmp_path / "here" / "report.html").read_bytes()  # the plots are in it


def test_plots_drawn_ahead_are_reused_only_for_the_same_rows(monkeypatch):
    monkeypatch.setattr(plots, "_DRAWN", {})  # what the worker holds; this process never draws ahead
    early = to_frame(step_rows())
    draw_ahead(timing_plots, early)
    final = to_frame(step_rows() + later_rows())  # more columns, other dtypes: the same rows of this check
    group = final[final.check == TIME]
    assert rows_key(group) == rows_key(early)
    drawn = section_plots(timing_plots, group)
    assert drawn and drawn is section_plots(timing_plots, early)  # not drawn again
    changed = to_frame(step_rows(13))
    assert rows_key(changed) != rows_key(early)
    assert section_plots(timing_plots, changed) is not drawn  # other rows: drawn from them


def test_a_worker_that_is_gone_leaves_the_render_to_the_pipeline(registry, tmp_path):
    order, timed = registry
    background.follow(order, timed, step_rows())
    background._worker.process.kill()
    background._worker.process.join(5)
    frame = to_frame(step_rows())
    out = tmp_path / "run"
    out.mkdir()
    meta = tiny_meta(out) | {"created": "2024-01-02T03:04:05+00:00"}
    assert background.render_beside(frame, meta, "PASS", out, required=[]) is None
    assert list(out.iterdir()) == []  # nothing written: the pipeline renders as before
    assert background.render_beside(frame, meta, "PASS", out, required=[]) is None  # no worker: None


def test_without_fork_there_is_no_worker(registry, monkeypatch):
    order, timed = registry
    monkeypatch.setattr(background.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    background.follow(order, timed, step_rows())
    assert background._worker is None
