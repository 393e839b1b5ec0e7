"""``python -m reportgen +model=x``: the Hydra entry point (logic lives in reportgen.run).

Exit codes: 0 claim holds, 1 claim fails, 2 could not start, 3 cannot be judged, 70
reportgen's own bug, 130 Ctrl-C, 143 SIGTERM (see :mod:`reportgen.cli`).
"""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from reportgen import cli
from reportgen.config import register_configs
from reportgen.paths import conf_dir

register_configs()


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def _app(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    cli.record(cli.run_job(cfg, hydra_cfg.runtime.output_dir, multirun=hydra_cfg.mode == RunMode.MULTIRUN))


def main() -> None:
    """Console entry point; exits with :mod:`reportgen.cli`'s codes (0, 1, 2, 3, 70, 130, 143)."""
    sys.exit(cli.exit_code(_app))


if __name__ == "__main__":
    main()
