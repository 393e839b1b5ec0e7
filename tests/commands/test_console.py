"""Console WARN lines keep their advice (break-it finding 7): the finding is shortened, never the fix."""

from __future__ import annotations

import pytest
from conftest import run_pipeline

from reportgen.errors import clip_keeping_advice
from reportgen.results import Status

#: Details of WARN rows as real runs wrote them (+model=ffn, +model=mlp, relu_only).
DETAILS = [
    "step peak saving: recompute does not lower the step's peak (by 0.0%, threshold 1.0%): 12.20 KiB plain "
    "(optimizer step) → 12.20 KiB recompute (optimizer step); both peaks are in the optimizer step, where parameters, "
    "gradients and optimizer state (11.92 KiB) are alive and no activation is: recompute cannot lower it at this "
    "batch; activations set the peak only at a larger batch or sequence",
    "overhead confidence: too noisy to trust: ±5.7 pp is wider than the ±2 pp target after 905 rounds (time budget "
    "of 10 s spent); is the machine busy? Rerun on an idle one, or give timing.max_measure_seconds more",
    "saving: +93.6%: recompute costs memory here: it keeps 40.00 KiB more for backward than the plain run "
    "(42.75 KiB → 82.75 KiB); the increase (40.00 KiB) comes from the wrapped module(s) 1 (CheckpointedReLU), "
    "3 (CheckpointedReLU), 5 (CheckpointedReLU), 7 (CheckpointedReLU) and 1 more: each region keeps its input for "
    "the recompute while the layer after it still keeps its output; recompute larger blocks (e.g. whole layers) instead",
]


@pytest.mark.parametrize("detail", DETAILS)
def test_the_advice_is_kept_whole_and_the_finding_shortened(detail):
    line = clip_keeping_advice(detail)
    advice = detail.split("; ")[-1]
    assert len(detail) > 200 and len(line) <= 200
    assert line.endswith(f"; {advice}") and line.startswith(detail[:40])
    assert "…" in line  # it says where it left something out


def test_short_details_and_single_clauses_are_unchanged_or_cut_as_before():
    assert clip_keeping_advice("all fine; nothing to do") == "all fine; nothing to do"
    one = "word " * 60
    assert clip_keeping_advice(one, 100).endswith(" …") and len(clip_keeping_advice(one, 100)) <= 102
    long_advice = "finding; " + "advice " * 39 + "advice"  # an advice longer than the line: kept whole
    assert clip_keeping_advice(long_advice, 100) == long_advice


@pytest.mark.slow
def test_the_console_warn_lines_of_a_run_end_with_their_advice(tmp_path, capsys):
    """+model=ffn: the step peak and the noisy timing are WARN; each console line ends with its row's advice."""
    _, frame = run_pipeline(tmp_path, "+model=ffn")
    out = capsys.readouterr().out
    warned = frame[frame.status == Status.WARN].drop_duplicates("check")
    assert len(warned) >= 1
    for check, detail in warned[["check", "detail"]].values:
        line = next(x for x in out.splitlines() if x.startswith(f"reportgen: WARN {check}: "))
        assert line.endswith(detail.split("; ")[-1]), line


def test_fix_lines_are_one_per_fix_as_page_one_groups_them():
    """The same rule with evidence-specific fixes gives a line each; two rules with one fix give one line."""
    from reportgen.commands.run import why_lines
    from reportgen.results import Role, Row, to_frame

    def diagnosis(check, rule, fix):
        return Row.fact(check, "why it fails", Role.DIAGNOSIS, "", extra={"rule": rule, "fix": fix})

    frame = to_frame(
        [
            diagnosis("gradient parity", "rng", "set preserve_rng_state=true"),
            diagnosis("trajectory parity", "rng", "seed the module's own generator"),
            diagnosis("state parity", "buffers", "set preserve_rng_state=true"),
        ]
    )
    assert why_lines(frame) == [
        "reportgen: fix (gradient parity, state parity): set preserve_rng_state=true",
        "reportgen: fix (trajectory parity): seed the module's own generator",
    ]
