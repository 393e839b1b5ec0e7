"""The named device mesh of a sharded run (``distributed.mesh``), its dimensions named as torchtitan names them
(torchtitan/distributed/parallel_dims.py): ``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``, laid out in
that order whatever order the setting writes them in (the pipeline outermost, tensor parallel innermost, so
tensor-parallel peers are neighbouring ranks), as ``init_device_mesh`` numbers ranks (row-major).

The batch is split over the data-parallel dimensions only (``dp_replicate`` × ``dp_shard``): tensor- and
context-parallel peers, and the stages of one pipeline, see the same examples. Unset, the mesh is 1-D over every
rank (no names) and every rank is a data-parallel rank, as before the setting existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Mesh dimension names in the order the mesh lays them out (torchtitan's ``ParallelDims.build_mesh``).
DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
#: The data-parallel dimensions: the only ones the batch is split over.
DATA_PARALLEL = ("dp_replicate", "dp_shard")
#: What each dimension does, for page 1 and the refusals.
ROLES = {
    "pp": "pipeline stages",
    "dp_replicate": "data parallel, replicated (DDP, or HSDP's replicas)",
    "dp_shard": "data parallel, sharded (FSDP)",
    "cp": "context parallel",
    "tp": "tensor parallel",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """How a run's ranks are arranged: the named degrees of ``distributed.mesh``, or the 1-D mesh.

    Attributes:
        world_size: ranks.
        degrees: ``((name, degree), ...)`` in :data:`DIMS` order; empty for the 1-D mesh over all ranks.
    """

    world_size: int
    degrees: tuple[tuple[str, int], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The mesh dimension names (``mesh_dim_names``); empty for the 1-D mesh."""
        return tuple(name for name, _ in self.degrees)

    @property
    def shape(self) -> tuple[int, ...]:
        """The mesh shape: the degrees, or ``(world_size,)`` for the 1-D mesh."""
        return tuple(degree for _, degree in self.degrees) or (self.world_size,)

    def degree(self, name: str) -> int:
        """The degree of dimension ``name`` (1 when the mesh does not name it)."""
        return dict(self.degrees).get(name, 1)

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: ``dp_replicate × dp_shard``, or every rank on the 1-D mesh (the shares of a batch)."""
        return math.prod(self.degree(d) for d in DATA_PARALLEL) if self.degrees else self.world_size

    def coordinates(self, rank: int) -> dict[str, int]:
        """``{dimension: index}`` of global ``rank`` on the mesh (row-major, as ``init_device_mesh`` numbers
        ranks: ``torch.arange(world_size).view(shape)``); empty for the 1-D mesh."""
        out, rest = {}, rank
        for name, degree in reversed(self.degrees):
            out[name], rest = rest % degree, rest // degree
        return {name: out[name] for name in self.names}

    def dp_rank(self, rank: int) -> int:
        """Which share of the batch global ``rank`` takes, ``0 .. dp_size - 1``: its ``dp_replicate`` index ×
        ``dp_shard`` + its ``dp_shard`` index (the global rank itself on the 1-D mesh)."""
        if not self.degrees:
            return rank
        at = self.coordinates(rank)
        return at.get("dp_replicate", 0) * self.degree("dp_shard") + at.get("dp_shard", 0)

    def said(self) -> str:
        """The layout as page 1 writes it: ``"dp_shard=2 × tp=2"``, or ``"1-D, 4 ranks"``."""
        if not self.degrees:
            return f"1-D, {self.world_size} ranks"
        return " × ".join(f"{name}={degree}" for name, degree in self.degrees)


def _items(mesh: Any) -> list[tuple[str, Any]]:
    """``distributed.mesh``'s set degrees as ``(name, degree)`` pairs in :data:`DIMS` order (the schema's
    :class:`reportgen.config.MeshConfig`, a DictConfig or a dict; None or every degree null: none)."""
    if mesh is None:
        return []
    get = mesh.get if isinstance(mesh, dict) or hasattr(mesh, "keys") else lambda k, d=None: getattr(mesh, k, d)
    return [(name, value) for name in DIMS if (value := get(name, None)) is not None]


def layout_of(dc: Any) -> Layout:
    """The :class:`Layout` of ``cfg.distributed`` (a DictConfig or the schema's dataclass): ``distributed.mesh``'s
    degrees in :data:`DIMS` order, or the 1-D mesh when it is unset. Assumes :func:`mesh_problems` found none."""
    degrees = tuple((name, int(degree)) for name, degree in _items(getattr(dc, "mesh", None)))
    return Layout(world_size=int(dc.world_size), degrees=degrees)


def dp_degree(mesh: Any, world_size: int) -> int:
    """The data-parallel degree of a ``distributed.mesh`` value (no degree set: ``world_size``), for the
    validator's "a multiple of the shares" rules; a degree that is not a whole number counts as 1
    (:func:`mesh_problems` refuses it)."""
    given = dict(_items(mesh))
    if not given:
        return world_size
    return math.prod(v for k, v in given.items() if k in DATA_PARALLEL and isinstance(v, int) and v >= 1)


def mesh_problems(dc: Any) -> list[str]:
    """Every problem with ``distributed.mesh`` (empty when it is unset or fine), each naming the fix.

    Refused (names outside :data:`DIMS` are the schema's: Hydra refuses them at compose time): degrees that are
    not whole numbers ≥ 1, degrees whose product is not
    ``distributed.world_size``, a mesh with one process (it would be recorded and ignored), a mesh with
    ``ddp``/``fsdp1`` (they spread over every rank as one data-parallel group; pipeline stages alone are
    :func:`reportgen.distributed.pipeline.pipeline_problems`' to judge), and tensor or context
    parallelism without the user's own function (``strategy=custom``: reportgen's FSDP2 shards over the
    data-parallel dimensions only and would leave ``tp``/``cp`` ranks as plain copies).
    """
    items = _items(getattr(dc, "mesh", None))
    if not items:
        return []
    written = "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    setting = f"distributed.mesh={written}"
    bad = [k for k, v in items if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        return [f"{setting}: the degree of {', '.join(bad)} must be a whole number ≥ 1"]
    world, product = int(dc.world_size), math.prod(v for _, v in items)
    strategy = getattr(dc.strategy, "value", str(dc.strategy))
    problems = []
    if world == 1:
        problems.append(f"{setting} would be ignored with distributed.world_size=1 (one process); remove it")
    elif product != world:
        times = " × ".join(str(v) for _, v in items)
        problems.append(
            f"{setting} lays out {product} ranks ({times}) but distributed.world_size={world}; set "
            f"distributed.world_size={product}, or degrees whose product is {world}"
        )
    # a mesh of pipeline stages alone spreads nothing over data-parallel ranks (reportgen/distributed/pipeline.py)
    if strategy in ("ddp", "fsdp1") and any(v > 1 for k, v in items if k != "pp"):
        problems.append(
            f"{setting} would be ignored with distributed.strategy={strategy} (it spreads over every rank as one "
            "data-parallel group); the mesh is given to fully_shard (strategy=fsdp2: its dp_replicate and dp_shard "
            "dimensions) and to your distributed.wrap (strategy=custom): use one of those, or remove the mesh"
        )
    spread = [k for k, v in items if k in ("tp", "cp") and v > 1]
    if strategy == "fsdp2" and spread:
        problems.append(
            f"{setting} with distributed.strategy=fsdp2: reportgen shards over dp_replicate and dp_shard only, "
            f"and {', '.join(ROLES[k] for k in spread)} is applied by your own function; set "
            "distributed.strategy=custom distributed.wrap=pkg.module.fn (docs/distributed_wrapping.md, "
            '"Two dimensions")'
        )
    if strategy == "fsdp2" and not any(k in DATA_PARALLEL for k, _ in items):
        problems.append(f"{setting} with distributed.strategy=fsdp2 needs a dp_shard or dp_replicate dimension")
    return problems
