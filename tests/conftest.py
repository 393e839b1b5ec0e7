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
