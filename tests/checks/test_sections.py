"""Typed config sections: ``Setup.config`` is the composed config as its schema's dataclasses
(``OmegaConf.to_object`` once, by ``build_setup``), and each check reads its own section from it."""

from __future__ import annotations

from reportgen.config import Config, MemoryConfig, ParityConfig, RecomputeMode, TimingConfig


def test_setup_config_is_the_schema_dataclasses_with_the_composed_values(setup):
    s = setup("+model=ffn", "parity.batch_size=12", "timing.max_overhead_ratio=1.5", "budget.seeds=[3,4]")
    config = s.config
    assert isinstance(config, Config)
    assert isinstance(config.parity, ParityConfig) and isinstance(config.timing, TimingConfig)
    assert isinstance(config.memory, MemoryConfig)
    assert (config.parity.batch_size, config.timing.max_overhead_ratio, config.budget.seeds) == (12, 1.5, [3, 4])
    assert type(config.budget.seeds) is list and type(config.timing.max_overhead_ratio) is float
    assert config.recompute.mode is RecomputeMode.non_reentrant
    assert config.parity.optimizer == {"_target_": "torch.optim.AdamW", "lr": 1e-3}  # Any: a plain dict
    assert config.model["_target_"] == s.config.model["_target_"]


def test_setup_config_is_made_once(setup):
    s = setup("+model=ffn", "parity.batch_size=5")
    assert s.config is s.config and s.config.parity.batch_size == 5  # converted once, by build_setup
