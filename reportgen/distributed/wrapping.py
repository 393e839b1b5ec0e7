"""Each twin spread over the ranks the way the user trains: DDP, FSDP2, FSDP1 or their own function.

The settings under ``distributed`` are passed to torch as given: ``distributed.ddp.*`` to
``DistributedDataParallel``, ``distributed.fsdp.*`` to ``fully_shard`` (FSDP2) or to ``FullyShardedDataParallel``
with ``distributed.fsdp1.*`` (FSDP1), and ``distributed.wrap`` names the user's own ``fn(model, mesh) -> module``.
Both twins are made in the same order (:func:`wrap_order`); an FSDP unit at a recomputed module's path is its
recompute wrapper (:func:`unit_modules`), as torchtitan shards its wrapped blocks.
"""

from __future__ import annotations

import fnmatch
import functools
from typing import Any

import torch
from torch import nn

from reportgen.distributed.launch import Group, mesh_of
from reportgen.distributed.mesh import DATA_PARALLEL, layout_of
from reportgen.twins.recompute import CheckpointWrapper, plain_name
from reportgen.twins.setup import Setup
from reportgen.twins.template import materialise, on_meta
from reportgen.twins.twin import Twin


def strategy_name(dc: Any) -> str:
    """``distributed.strategy`` as a plain string (the schema stores an enum)."""
    return getattr(dc.strategy, "value", str(dc.strategy))


def unit_modules(model: nn.Module, units: list[str]) -> list[tuple[str, nn.Module]]:
    """The modules that become FSDP units: every module whose class name is in ``units`` or whose
    plain-twin path matches one of its globs (``fnmatch``), the model itself excluded.

    A module whose parent is a recompute wrapper is replaced by that wrapper, so both twins get
    the same unit boundaries. Deepest first: FSDP2 shards children before their parents.

    Returns:
        ``[(path in this twin, module)]``; empty when nothing matches.
    """
    by_name = dict(model.named_modules())
    chosen: dict[str, nn.Module] = {}
    for path, module in by_name.items():
        if not path or isinstance(module, CheckpointWrapper):
            continue
        plain = plain_name(path)
        if type(module).__name__ in units or any(fnmatch.fnmatchcase(plain, glob) for glob in units):
            parent = path.rsplit(".", 1)[0] if "." in path else ""
            if parent and isinstance(by_name.get(parent), CheckpointWrapper):
                path, module = parent, by_name[parent]
            chosen[path] = module
    return sorted(chosen.items(), key=lambda item: -item[0].count("."))


def unit_patterns(dc: Any, target_paths: list[str]) -> list[str]:
    """``distributed.fsdp.units``, or (null) the recompute targets' plain paths."""
    units = dc.fsdp.units
    return [str(u) for u in units] if units is not None else [plain_name(p) for p in target_paths]


def _precision(dc: Any, policy: type) -> Any:
    """``policy(param_dtype=..., reduce_dtype=...)`` from ``distributed.fsdp`` (None when neither is set)."""
    dtypes = {k: getattr(dc.fsdp, k) for k in ("param_dtype", "reduce_dtype")}
    return policy(**{k: v and getattr(torch, str(v)) for k, v in dtypes.items()}) if any(dtypes.values()) else None


def wrap_ddp(model: nn.Module, dc: Any, group: Group) -> nn.Module:
    """``DistributedDataParallel(model, **distributed.ddp)`` (``bucket_cap_mb`` null = torch's default)."""
    from torch.nn.parallel import DistributedDataParallel

    # every setting that differs from torch's default, as given (a default is left to torch: torch 2.13 warns
    # on an explicit broadcast_buffers even when it is the default)
    kwargs = {k: v for k, v in ddp_kwargs(dc).items() if v is not None and v != DDP_DEFAULTS[k]}
    ids = [group.device.index] if group.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, **kwargs)


#: ``DistributedDataParallel``'s own defaults (torch 2.x signature).
DDP_DEFAULTS = {
    "find_unused_parameters": False,
    "static_graph": False,
    "gradient_as_bucket_view": False,
    "broadcast_buffers": True,
    "bucket_cap_mb": None,
}


def ddp_kwargs(dc: Any) -> dict[str, Any]:
    """The keyword arguments given to ``DistributedDataParallel``."""
    d = dc.ddp
    flags = {k: bool(getattr(d, k)) for k in DDP_DEFAULTS if k != "bucket_cap_mb"}
    return flags | {"bucket_cap_mb": None if d.bucket_cap_mb is None else float(d.bucket_cap_mb)}


def wrap_fsdp2(model: nn.Module, dc: Any, target_paths: list[str], group: Group) -> nn.Module:
    """``fully_shard`` on each unit (deepest first), then on the root, with ``reshard_after_forward``
    and a ``MixedPrecisionPolicy`` when a dtype is set.

    Raises:
        ValueError: ``distributed.fsdp.units`` matches no module.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": dp_mesh(group), "reshard_after_forward": bool(dc.fsdp.reshard_after_forward)}
    if (policy := _precision(dc, MixedPrecisionPolicy)) is not None:
        kwargs["mp_policy"] = policy
    for _, module in _units(model, dc, target_paths):
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


def dp_mesh(group: Group):
    """The mesh FSDP2 shards over: the data-parallel dimensions of the named mesh (``mesh["dp_shard"]``; both
    ``("dp_replicate", "dp_shard")`` make it 2-D, which ``fully_shard`` runs as HSDP), or the 1-D mesh."""
    mesh = mesh_of(group)
    names = [n for n in DATA_PARALLEL if n in (mesh.mesh_dim_names or ())]
    return mesh[tuple(names)] if names else mesh


def _units(model: nn.Module, dc: Any, target_paths: list[str]) -> list[tuple[str, nn.Module]]:
    patterns = unit_patterns(dc, target_paths)
    units = unit_modules(model, patterns)
    if patterns and not units:
        raise ValueError(
            f"distributed.fsdp.units={patterns} matches no module of the model; name module classes "
            "(Block) or plain module-path globs (blocks.*)"
        )
    return units


def wrap_fsdp1(model: nn.Module, dc: Any, target_paths: list[str], group: Group) -> nn.Module:
    """``FullyShardedDataParallel(model, auto_wrap_policy=<the units>, **distributed.fsdp1)`` with
    ``MixedPrecision`` when a dtype is set (torch's ``lambda_auto_wrap_policy`` over the chosen modules)."""
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    chosen = {id(m) for _, m in _units(model, dc, target_paths)}
    policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: id(m) in chosen)
    # device_id given on every device: without it FSDP1 refuses a CPU-only machine (gloo ranks on CPU)
    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=policy,
        mixed_precision=_precision(dc, MixedPrecision),
        device_id=group.device,
        use_orig_params=bool(dc.fsdp1.use_orig_params),
        sharding_strategy=ShardingStrategy[str(dc.fsdp1.sharding_strategy)],
        sync_module_states=bool(dc.fsdp1.sync_module_states),
    )


def wrap_custom(model: nn.Module, dc: Any, group: Group) -> nn.Module:
    """The user's ``distributed.wrap`` function: ``fn(model, mesh)`` returns the module to train; ``mesh`` is the
    run's :func:`reportgen.distributed.launch.mesh_of` (named N-D with ``distributed.mesh``, e.g. ``mesh["tp"]``)."""
    from hydra.utils import get_method

    wrapped = get_method(str(dc.wrap))(model, mesh_of(group))
    if not isinstance(wrapped, nn.Module):
        raise TypeError(f"distributed.wrap={dc.wrap} returned {type(wrapped).__name__}, not the nn.Module to train")
    return wrapped


def wrap_twin(model: nn.Module, dc: Any, target_paths: list[str], group: Group) -> nn.Module:
    """Spread one twin over the ranks by ``distributed.strategy`` and its settings (module docstring).

    Args:
        model: a plain or recompute twin (recompute already applied to the recompute twin).
        dc: ``cfg.distributed``.
        target_paths: the recompute targets' paths (the default FSDP units).
        group: this rank's :class:`reportgen.distributed.launch.Group`.

    Returns:
        The module to call (DDP/FSDP1 wrapper, the FSDP2-sharded model, or what the user's function returned).
    """
    strategy = strategy_name(dc)
    if strategy in ("fsdp2", "fsdp1"):
        return (wrap_fsdp2 if strategy == "fsdp2" else wrap_fsdp1)(model, dc, target_paths, group)
    return (wrap_ddp if strategy == "ddp" else wrap_custom)(model, dc, group)


def settings_in_force(dc: Any, target_paths: list[str]) -> dict[str, Any]:
    """Every wrapping setting the twins ran with, for page 1 (the strategy's own, nothing else).

    ``dc`` is the schema's :class:`reportgen.config.DistributedConfig` (``Setup.config.distributed``, what page 1
    and the diagnosis both read; a ``DictConfig`` answers the same attributes): settings are given as the plain
    values torch gets (:func:`wrap_fsdp1`).
    """
    strategy, layout = strategy_name(dc), layout_of(dc)
    mesh = {"mesh": layout.said()} if layout.names else {}
    if layout.degree("pp") > 1:  # pipeline stages: no data-parallel wrapping (reportgen.distributed.pipeline)
        pipeline = dc.pipeline
        return mesh | {
            "pipeline.split": ", ".join(map(str, pipeline.split or [])),
            "pipeline.schedule": str(pipeline.schedule),
            "pipeline.microbatches": int(pipeline.microbatches),
        }
    if strategy == "ddp":
        return {f"ddp.{k}": ("torch default (25 MiB)" if v is None else v) for k, v in ddp_kwargs(dc).items()}
    if strategy == "custom":
        return {"wrap": str(dc.wrap)} | mesh
    said = {
        "fsdp.units": ", ".join(unit_patterns(dc, target_paths))
        + ("" if dc.fsdp.units is not None else " (the recompute targets)"),
        "fsdp.param_dtype": dc.fsdp.param_dtype or "the model's",
        "fsdp.reduce_dtype": dc.fsdp.reduce_dtype or "the parameters'",
    }
    if strategy == "fsdp2":
        return said | {"fsdp.reshard_after_forward": bool(dc.fsdp.reshard_after_forward)} | mesh
    f1 = dc.fsdp1
    return said | {
        "fsdp1.use_orig_params": bool(f1.use_orig_params),
        "fsdp1.sharding_strategy": str(f1.sharding_strategy),
        "fsdp1.sync_module_states": bool(f1.sync_module_states),
    }


def wrap_order(dc: Any) -> str:
    """The order in which each twin is made, for page 1."""
    layout = layout_of(dc)
    if layout.degree("pp") > 1:
        pipeline = dc.pipeline
        return (
            "build from the shared initial weights → traced by torch.distributed.pipelining.pipeline at "
            f"{', '.join(map(str, pipeline.split or []))} into {layout.degree('pp')} stages, one per rank → the twin's "
            "own module at each recompute target (the recompute twin's checkpoint_wrapper) → "
            f"Schedule{pipeline.schedule} over {pipeline.microbatches} micro-batches; the same calls on both twins"
        )
    spread = {
        "ddp": "DistributedDataParallel",
        "fsdp2": "fully_shard on each unit, then the root"
        + (f" (over the mesh's {', '.join(n for n in DATA_PARALLEL if n in layout.names)})" if layout.names else ""),
        "fsdp1": "FullyShardedDataParallel with an auto-wrap policy over the units",
        "custom": f"your {dc.wrap}(model, mesh)" + (f" (mesh {layout.said()})" if layout.names else ""),
    }[strategy_name(dc)]
    return (
        f"build from the shared initial weights → recompute applied to the recompute twin's targets → {spread}; "
        "the same calls on both twins"
    )


#: Strategies that spread a meta-device build as it is (``fully_shard`` and a user's wrap accept meta tensors,
#: as torchtitan's parallelisms do); the others get it materialised whole first.
SPREADS_META = ("fsdp2", "custom")


def spread_twin(setup: Setup, group: Group, recompute: bool, optimizer: Any = None) -> Twin:
    """A fresh twin of ``setup`` (shared initial weights, recompute applied to the recompute twin), spread over the
    ranks by :func:`wrap_twin`, with the run's training step and its optimizer (``optimizer``: a ``_target_`` node,
    default ``parity.optimizer``; the task's own where it makes one) made over the spread model.

    A model built on the meta device is spread first and materialised per shard after (:data:`SPREADS_META`:
    ``to_empty`` then its ``init_weights``/``reset_parameters`` under ``cfg.seed``,
    :func:`reportgen.twins.template.materialise`), so no rank ever holds it whole; DDP and FSDP1 need real
    tensors, so under them it is materialised whole first."""
    dc = setup.config.distributed
    model = setup.build(recompute, meta=strategy_name(dc) in SPREADS_META)
    model = wrap_twin(model, dc, [w.path for w in setup.wrapped], group)
    if on_meta(model):  # the spread twin's shards get their storage and values
        materialise(model, group.device, setup.template.seed)
    return Twin.of(model, setup.training_step, setup.config.parity.optimizer if optimizer is None else optimizer)
