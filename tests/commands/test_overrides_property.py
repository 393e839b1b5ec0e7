"""Property (issue 11, item 13): no command-line override ends in a traceback; every one ends
with a documented exit code. Numbers (NaN, inf, negative), strings and unknown keys."""

from __future__ import annotations

import math
import uuid

import pytest
from conftest import DOCUMENTED_EXIT_CODES, SMALL_RUN, compose_config, run_cli
from hydra.errors import HydraException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf.errors import OmegaConfBaseException

from reportgen.commands.validation import config_problems

#: Settings whose values validation judges, plus names that do not exist. Budget sizes are
#: left out on purpose: a valid but huge budget is a long run, not a bug.
KEYS = [
    "parity.rtol",
    "parity.atol",
    "timing.max_overhead_ratio",
    "timing.max_step_time_ms",
    "timing.target_ci_half_width_pp",
    "budget.metric_tolerance",
    "memory.negligible_saving_share",
    "dtype",
    "device",
    "recompute.determinism_check",
    "larger_batch.lr_scaling",
    "verdict.required",
    "recompute.mode",
    "parity.rtlo",
    "no_such_group.value",
    "+no_such_key",
]
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.integers(-(10**6), 10**6))
WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.:", min_size=0, max_size=12)
SPECIAL = st.sampled_from(
    [
        "null",
        "nan",
        "-inf",
        "float16",
        "cuda",
        "cuda:7",
        "cpu",
        "none",
        "sqrt",
        "default",
        "[gradient parity]",
        "[typo]",
        "[]",
        "'quoted value'",
        "{a: 1}",
        "1e400",
        "${oops}",
    ]
)


def _text(value) -> str:
    """An override's value as a user would type it (Hydra's grammar reads nan, inf, -inf)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return str(value)


OVERRIDES = st.builds(
    lambda key, value: f"{key}={_text(value)}", st.sampled_from(KEYS), st.one_of(NUMBERS, WORDS, SPECIAL)
)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(override=OVERRIDES)
def test_any_override_composes_to_a_refusal_or_a_validation_verdict(override):
    """In process (fast): compose fails with Hydra's/OmegaConf's own error (exit 2 at the CLI), or
    validation returns its paragraph; nothing else is ever raised."""
    try:
        cfg = compose_config("+model=ffn", override)
    except (HydraException, OmegaConfBaseException, ValueError):
        return
    problems = config_problems(cfg)
    assert isinstance(problems, str) and "\n" not in problems
    if "=nan" in override and override.split("=")[0] in ("parity.rtol", "timing.max_overhead_ratio"):
        assert "must be a finite number" in problems


#: Examples of the command-line property: 3 (was 5). Each is a whole ``python -m reportgen`` (a
#: small run when the value is valid, else a refusal before any work), so each costs seconds; the
#: breadth is the in-process property's 25 examples above (every override composes to a refusal
#: or a one-line validation verdict) and test_known_bad_overrides_...'s six refusals below. This
#: one checks that the process turns what it is given into a documented exit code without a
#: traceback. Derandomized, the three are today parity.rtol=0.0 and timing.max_overhead_ratio=1e100
#: (whole runs) and verdict.required=-6.2e+25 (a type refusal).
CLI_EXAMPLES = 3


@pytest.mark.slow
@settings(
    max_examples=CLI_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(override=OVERRIDES)
def test_any_override_on_the_command_line_exits_with_a_documented_code(tmp_path, override):
    """Through ``python -m reportgen`` (slow: a few examples, each a small run or an early refusal)."""
    run_dir = tmp_path / uuid.uuid4().hex
    proc = run_cli(tmp_path, *SMALL_RUN, "report.sign=false", "report.pdf=false", override, f"hydra.run.dir={run_dir}")
    out = proc.stdout + proc.stderr
    assert proc.returncode in DOCUMENTED_EXIT_CODES, out
    assert "Traceback" not in out, out
    if proc.returncode == 2:
        assert "reportgen: " in proc.stdout, out  # one line of ours naming the fix, not only Hydra's


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, code, says",
    [
        ("timing.max_overhead_ratio=nan", 2, "timing.max_overhead_ratio=nan must be a finite number > 0"),
        ("parity.rtol=-1", 2, "parity.rtol=-1 must be >= 0"),
        ("parity.rtlo=1e-3", 2, "parity.rtlo is not a setting (did you mean parity.rtol?)"),
        ("dtype=1.5", 2, "dtype='1.5' must be one of"),
        ("no_such_key=3", 2, "fix the config error above"),  # "+key=" appends a key on purpose: allowed
        ("parity.rtol=${oops}", 2, "parity.rtol cannot be resolved"),
    ],
)
def test_known_bad_overrides_exit_2_with_our_message(tmp_path, override, code, says):
    proc = run_cli(tmp_path, "+model=ffn", override, f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == code and says in proc.stdout, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and not (tmp_path / "run").exists()
