"""Fixtures that compose the real config with small overrides (lightning-hydra-template style)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from reportgen.config import register_configs
from reportgen.paths import conf_dir

TESTS = Path(__file__).resolve().parent
USER_CONF = TESTS / "user_conf"


def compose_config(*overrides: str, user_conf: bool = False):
    """Compose ``conf/config.yaml`` with ``overrides``; ``user_conf`` adds tests/user_conf to
    the search path, as a user's ``--config-dir`` would."""
    register_configs()
    extra = [f"hydra.searchpath=[file://{USER_CONF}]"] if user_conf else []
    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir())):
        return compose("config", overrides=[*extra, *overrides])


@pytest.fixture
def compose_cfg():
    """``compose_cfg(*overrides, user_conf=False) -> DictConfig``."""
    return compose_config


def pytest_collection_modifyitems(config, items):
    """Skip ``gpu``-marked tests where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# --------------------------------------------------------------------------- sweeps and comparisons

#: A tiny job (+model=ffn, slow checks cut to the bone): a few seconds each on 2 cores.
TINY_JOB = ["+model=ffn", "budget.examples=32", "budget.seeds=[0]", "larger_batch.enabled=false",
            "timing.measured_steps=3", "timing.target_ci_half_width_pp=null", "timing.max_measure_seconds=1"]


def reportgen_cli(cwd: Path, *args: str, module: str = "reportgen", env: dict | None = None):
    """Run ``python -m MODULE ARGS`` in ``cwd`` with the clone on PYTHONPATH; the CompletedProcess."""
    import os
    import subprocess
    import sys

    full_env = {**os.environ, "PYTHONPATH": str(TESTS.parent), **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=900)


def cost_rows(plain_bytes: float = 1000.0, recompute_bytes: float = 250.0, ratio: float = 1.3,
              ci: tuple[float, float] = (1.2, 1.4), metric_diff: float = 0.0, parity: str = "PASS",
              metric: str = "accuracy") -> list:
    """Result rows of one job whose headline costs are known: saved-activation bytes plain vs
    recompute, the overhead ratio with its CI, the per-seed task-metric difference, and a
    gradient-parity row with status ``parity``."""
    from reportgen.results import Row

    return [
        Row("gradient parity", "loss", "recompute", "max_abs_err", 0.0, "atol=1e-05 rtol=1.3e-06", "allclose", parity),
        Row("warm-step memory", "saved activations (total)", "plain", "saved_activation_bytes", plain_bytes, status="INFO"),
        Row("warm-step memory", "saved activations (total)", "recompute", "saved_activation_bytes", recompute_bytes,
            status="PASS"),
        Row("warm-step time", "overhead", "recompute", "overhead_ratio", ratio, status="INFO",
            extra={"ci_low": ci[0], "ci_high": ci[1]}),
        Row("task metrics", "seed 0", "recompute", f"abs_diff_{metric}", metric_diff, "0.0001", "<=",
            "PASS" if metric_diff <= 1e-4 else "FAIL"),
    ]


def write_job(folder: Path, job: int, overrides: list[str], exit_code: int | None, rows: list | None,
              error: str | None = None, required: tuple[str, ...] = ("gradient parity", "warm-step memory",
                                                                      "warm-step time", "task metrics")) -> Path:
    """A job folder as a finished multirun job leaves it: ``job.json`` (unless ``exit_code`` is
    None: a killed job), ``results.json`` (unless ``rows`` is None), ``.hydra/`` with the
    overrides and ``verdict.required``, and a stub report.html when there are results."""
    import json

    from omegaconf import OmegaConf

    from reportgen.results import frame_to_json, to_frame
    from reportgen.sweep import VERDICT_BY_CODE

    folder.mkdir(parents=True)
    (folder / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create(list(overrides)), folder / ".hydra" / "overrides.yaml")
    OmegaConf.save(OmegaConf.create({"verdict": {"required": list(required)}}), folder / ".hydra" / "config.yaml")
    if rows is not None:
        (folder / "results.json").write_text(frame_to_json(to_frame(rows)))
        (folder / "report.html").write_text("<html></html>")
    if exit_code is not None:
        record = {"job": job, "job_id": str(job), "overrides": list(overrides), "exit_code": exit_code,
                  "verdict": VERDICT_BY_CODE.get(exit_code, "CRASHED"), "error": error, "seconds": 1.0}
        (folder / "job.json").write_text(json.dumps(record))
    return folder
