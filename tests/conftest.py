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


# --- end-to-end runs through the command line (tests/test_integrity.py, test_overrides_property.py)
REPO = TESTS.parent
#: Overrides that make a built-in ffn run take seconds, not minutes (the checks all still run).
SMALL_RUN = ("+model=ffn", "budget.examples=64", "budget.seeds=[0]", "larger_batch.enabled=false",
             "timing.measured_steps=3", "timing.target_ci_half_width_pp=null", "timing.max_measure_seconds=1")
#: Every exit code README and DESIGN.md document for ``python -m reportgen``.
DOCUMENTED_EXIT_CODES = {0, 1, 2, 3, 70, 130, 143}


def cli_env(pythonpath: str = "") -> dict:
    """The environment of a ``python -m reportgen`` subprocess: this checkout first on PYTHONPATH."""
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), pythonpath) if p)}


def run_cli(cwd: Path, *args: str, module: str = "reportgen", pythonpath: str = "", timeout: float = 600):
    """Run ``python -m MODULE ARGS`` in ``cwd`` and wait: a ``subprocess.CompletedProcess`` (text)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=cli_env(pythonpath),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def signing_key_pair(tmp_path_factory) -> tuple[Path, Path]:
    """``(private, public)`` key files made by ``reportgen.keys.generate_key`` (private mode 0600)."""
    from reportgen.keys import generate_key

    return generate_key(tmp_path_factory.mktemp("keys") / "signing-key.pem")
