"""The ``distributed`` settings a run may use: known keys only (Hydra's ``+distributed.x=...`` appends a key even
to a structured config, so the schema alone does not refuse a typo), and each wrapping setting only with the
strategy that passes it to torch, so no setting is recorded and ignored."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from omegaconf import DictConfig

from reportgen.config import DDPConfig, DistributedConfig, FSDP1Config, FSDPConfig
from reportgen.distributed.mesh import mesh_problems

#: The settings each strategy passes to torch (other groups must keep their defaults).
USED_BY = {"ddp": {"ddp"}, "fsdp2": {"fsdp"}, "fsdp1": {"fsdp", "fsdp1"}, "custom": {"wrap"}}
#: Groups whose values only exist to be passed to a strategy.
GROUPS: dict[str, DDPConfig | FSDPConfig | FSDP1Config] = {
    "ddp": DDPConfig(),
    "fsdp": FSDPConfig(),
    "fsdp1": FSDP1Config(),
}
SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
DTYPES = ("float32", "float64", "bfloat16", "float16")


def known_settings(schema: type = DistributedConfig, prefix: str = "distributed") -> list[str]:
    """Every dotted setting of ``schema`` (nested dataclasses expanded), e.g. ``distributed.ddp.static_graph``."""
    names = []
    for f in dataclasses.fields(schema):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            names += known_settings(type(default), f"{prefix}.{f.name}")
        else:
            names.append(f"{prefix}.{f.name}")
    return names


def _present(node: Any, prefix: str) -> list[str]:
    """Every dotted leaf key under ``node``."""
    if not isinstance(node, (DictConfig, dict)):
        return [prefix]
    return [leaf for key in node.keys() for leaf in _present(node[key], f"{prefix}.{key}")] or [prefix]


def unknown_problems(dc: Any) -> list[str]:
    """One problem per key under ``distributed`` that the schema does not know, naming the closest known one."""
    known = known_settings()
    groups = {name.rsplit(".", 1)[0] for name in known}
    problems = []
    for name in _present(dc, "distributed"):
        if name in known or name in groups:
            continue
        leaf = name.rsplit(".", 1)[-1]
        near = [k for k in known if k.rsplit(".", 1)[-1] == leaf] or difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        problems.append(f"{name} is not a setting{hint}; the distributed settings are {', '.join(known)}")
    return problems


def _changed(dc: Any, group: str) -> list[str]:
    """Settings of ``group`` (``ddp``, ``fsdp``, ``fsdp1``, ``wrap``) that differ from their defaults."""
    if group == "wrap":
        return ["distributed.wrap"] if dc.get("wrap") is not None else []
    defaults, node = GROUPS[group], dc.get(group) or {}
    return [
        f"distributed.{group}.{f.name}={node.get(f.name)}"
        for f in dataclasses.fields(defaults)
        if f.name in node and node.get(f.name) != getattr(defaults, f.name)
    ]


def distributed_setting_problems(dc: Any) -> list[str]:
    """Every problem with ``cfg.distributed``'s wrapping settings (empty when fine).

    Refused: unknown keys; a group's setting changed while the strategy does not pass it to torch
    (or with one process); ``strategy=custom`` without ``wrap``; FSDP1 ``use_orig_params=false``
    (the checks compare parameters by name); unknown sharding strategies and dtypes; a ``distributed.mesh``
    that does not fit the world size or the strategy (:func:`reportgen.distributed.mesh.mesh_problems`).
    """
    if dc is None:
        return []
    problems = unknown_problems(dc)
    if problems:
        return problems
    strategy = getattr(dc.strategy, "value", str(dc.strategy))
    world = dc.get("world_size", 1)
    for group in ("ddp", "fsdp", "fsdp1", "wrap"):
        changed = _changed(dc, group)
        if changed and (group not in USED_BY.get(strategy, set()) or world == 1):
            why = (
                "distributed.world_size=1 (one process, nothing is spread)"
                if world == 1
                else f"distributed.strategy={strategy}"
            )
            users = [s for s, used in USED_BY.items() if group in used]
            problems.append(
                f"{', '.join(changed)} would be ignored with {why}: it is passed to torch only with "
                f"distributed.strategy={' or '.join(users)} and world_size > 1; remove it or change the strategy"
            )
    if strategy == "fsdp1" and not dc.fsdp.reshard_after_forward:
        problems.append(
            "distributed.fsdp.reshard_after_forward=false is FSDP2's; with distributed.strategy=fsdp1 say it "
            "with distributed.fsdp1.sharding_strategy=SHARD_GRAD_OP (gathered parameters kept for backward)"
        )
    if strategy == "custom" and dc.get("wrap") is None:
        problems.append(
            "distributed.strategy=custom needs distributed.wrap=pkg.module.fn, your fn(model, mesh) "
            "returning the module to train"
        )
    if strategy == "fsdp1" and not dc.fsdp1.use_orig_params:
        problems.append(
            "distributed.fsdp1.use_orig_params=false is not supported: the parity checks compare every "
            "parameter and its gradient by name (summon_full_params(with_grads=True) needs the original "
            "parameters); set it true"
        )
    if str(dc.fsdp1.sharding_strategy) not in SHARDING_STRATEGIES:
        problems.append(
            f"distributed.fsdp1.sharding_strategy={dc.fsdp1.sharding_strategy!r} must be one of "
            f"{', '.join(SHARDING_STRATEGIES)}"
        )
    for name in ("param_dtype", "reduce_dtype"):
        if (value := dc.fsdp.get(name)) is not None and value not in DTYPES:
            problems.append(f"distributed.fsdp.{name}={value!r} must be null or one of {', '.join(DTYPES)}")
    if (cap := dc.ddp.get("bucket_cap_mb")) is not None and not cap > 0:
        problems.append(f"distributed.ddp.bucket_cap_mb={cap} must be > 0 (MiB) or null for torch's default")
    return problems + mesh_problems(dc)
