"""Every ``distributed.strategy`` (ddp, fsdp2, fsdp1, custom) runs a report to its end: ``python -m reportgen``
on 2 CPU ranks (gloo) exits 0, with no ERROR row, a rendered page 1 that lists the strategy's settings in force
and a signed statement. Page 1 (``metadata.distributed_claim``) and the diagnosis
(``metadata.recompute_settings``) read ``Setup.config.distributed``, the schema's dataclasses; ``settings_in_force``
once subscripted it and so ended every fsdp1 run with exit 70 after all checks had passed."""

from __future__ import annotations

import json
import time

import pytest
from conftest import FORKSERVER, SMALL, TESTS, reportgen, run_dirs
from omegaconf import OmegaConf

from reportgen.config import DistributedConfig
from reportgen.distributed.wrapping import settings_in_force

#: ``distributed.strategy`` → the overrides its report runs with (torch's defaults: only custom needs one) and a
#: line page 1 lists for it.
RUNS = {
    "ddp": ((), "ddp.static_graph=False"),
    "fsdp2": ((), "fsdp.reshard_after_forward=True"),
    "fsdp1": ((), "fsdp1.sharding_strategy=FULL_SHARD"),
    "custom": (
        ("distributed.wrap=user_models.dist_wrapping.wrap_ddp_static",),
        "wrap=user_models.dist_wrapping.wrap_ddp_static",
    ),
}
#: Each strategy's own settings off torch's defaults, where it has any: page 1 must say the same from either
#: form of the config (sync_module_states only composed here: FSDP1 refuses it on CPU parameters).
SETTINGS = {
    "ddp": (("distributed.ddp.static_graph=true", "distributed.ddp.bucket_cap_mb=1"), "ddp.static_graph=True"),
    "fsdp2": (("distributed.fsdp.reshard_after_forward=false",), "fsdp.reshard_after_forward=False"),
    "fsdp1": (
        ("distributed.fsdp1.sharding_strategy=SHARD_GRAD_OP", "distributed.fsdp1.sync_module_states=true"),
        "fsdp1.sharding_strategy=SHARD_GRAD_OP",
    ),
    "custom": RUNS["custom"],
}
#: A tiny mlp (2 residual blocks of width 16) on 2 ranks, a global batch of 4, one timed step, one trajectory step
#: (tests/distributed/test_distributed_wrapping.py's settings) and :data:`conftest.SMALL`'s budget of 32 examples,
#: one seed: the task-metrics checks are required, so a run without them cannot exit 0.
TINY = (
    "+model=mlp",
    "model.depth=2",
    "model.width=16",
    "model.hidden=32",
    "distributed.world_size=2",
    "distributed.timeout_s=60",
    FORKSERVER,
    *(o for o in SMALL if not o.startswith("report.")),
    "parity.batch_size=4",
    "parity.steps=1",
    "timing.warmup_steps=0",
    "timing.measured_steps=1",
    "timing.max_overhead_ratio=1e6",  # a loaded 2-core machine: the subject is the run's end, not the overhead
    "run.max_estimated_minutes=null",
    "report.pdf=false",
)


@pytest.mark.parametrize("strategy", list(SETTINGS))
def test_settings_in_force_are_the_same_from_a_dictconfig_and_from_the_schemas_dataclasses(strategy, compose_cfg):
    dc = compose_cfg(
        "+model=mlp", "distributed.world_size=2", f"distributed.strategy={strategy}", *SETTINGS[strategy][0]
    )
    typed = OmegaConf.to_object(dc).distributed
    assert isinstance(typed, DistributedConfig)  # what Setup.config holds (twins.setup.build_setup)
    said = settings_in_force(dc.distributed, ["blocks.0", "blocks.1"])
    assert settings_in_force(typed, ["blocks.0", "blocks.1"]) == said and said
    key, value = SETTINGS[strategy][1].split("=", 1)
    assert str(said[key]) == value


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(RUNS))
def test_each_strategy_runs_its_report_to_the_end(strategy, tmp_path, signing_key_pair):
    private, _ = signing_key_pair
    started = time.perf_counter()
    proc = reportgen(
        tmp_path,
        *TINY,
        f"distributed.strategy={strategy}",
        *RUNS[strategy][0],
        "report.sign=true",
        f"report.key_path={private}",
        pythonpath=str(TESTS),  # user_models.dist_wrapping (strategy custom)
    )
    wall = time.perf_counter() - started
    print(f"{strategy}: exit {proc.returncode} in {wall:.1f} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [out] = run_dirs(tmp_path)
    rows = json.loads((out / "results.json").read_text())
    assert rows and not [r for r in rows if r["status"] == "ERROR"]
    assert {r["check"] for r in rows if r.get("rank") is not None} >= {"distributed gradient parity"}
    html = (out / "report.html").read_text()
    assert f"2 ranks · {strategy} · backend gloo" in html and RUNS[strategy][1] in html
    assert (out / "statement.dsse.json").exists()
