"""``python -m reportgen +model=x``: the Hydra entry point (logic lives in reportgen.run)."""
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from reportgen import cli
from reportgen.config import register_configs
from reportgen.paths import conf_dir

register_configs()


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def _app(cfg: DictConfig) -> None:
    cli.record(cli.run_job(cfg, HydraConfig.get().runtime.output_dir))


def main() -> None:
    """Console entry point; exits 0 (claim holds), 1 (claim fails) or 2 (could not start)."""
    sys.exit(cli.exit_code(_app))


if __name__ == "__main__":
    main()
