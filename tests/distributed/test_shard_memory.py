"""A sharded twin holds its shard (issue 42, item 1): rank sync compares one tensor at a time by name and shape
(ranks holding different tensors under one name are an ERROR naming them, never "in sync"), and every rank's
peak resident memory stays within its shard of two training states plus a fixed allowance."""

from __future__ import annotations

import datetime
import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import SHARDED_PARTS_ONLY, TESTS, USER_CONF, reportgen, run_dirs

from reportgen.config import DIST_STEP_PARITY
from reportgen.distributed.launch import Group
from reportgen.distributed.sync import measure, sync_row
from reportgen.results import Status

#: Each case: every rank's shape of ``head.weight`` (rank 0's, rank 1's); every rank also holds ``bias`` = its rank.
CASES = {"shapes differ": [(4, 8), (8, 8)], "same tensors": [(4, 8), (4, 8)]}


def _sync_on_rank(rank: int, port: int, out: str) -> None:
    """One gloo rank: :func:`measure` of each of :data:`CASES`; rank 0 writes ``{case: its rank-sync row}``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    group = Group(rank, 2, "gloo", dist.new_group(backend="gloo"), torch.device("cpu"))
    said = {}
    for case, shapes in CASES.items():
        state = {"head.weight": torch.zeros(shapes[rank]), "bias": torch.full((3,), float(rank))}
        drift = measure(state, group, 1, None, None)
        if rank == 0:
            row = sync_row(DIST_STEP_PARITY, "recompute", [drift], 2, None, None)
            said[case] = {"status": str(row.status), "detail": row.detail, "drifting": drift.drifting}
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(said, handle)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def synced(tmp_path_factory) -> dict:
    """``{case: rank 0's rank-sync row}`` of :data:`CASES`, measured on 2 gloo ranks."""
    out = tmp_path_factory.mktemp("sync") / "rows.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_sync_on_rank, args=(port, str(out)), nprocs=2)
    return json.loads(out.read_text())


def test_ranks_holding_different_tensors_under_one_name_are_an_error_naming_them(synced):
    row = synced["shapes differ"]
    assert row["status"] == Status.ERROR
    assert "head.weight" in row["detail"] and "[8, 8]" in row["detail"] and "[4, 8]" in row["detail"]
    assert "in sync" not in row["detail"] and not row["drifting"]


def test_ranks_holding_the_same_names_are_compared_tensor_by_tensor(synced):
    row = synced["same tensors"]
    assert row["status"] == Status.FAIL  # "bias" differs by 1.0 on rank 1: compared, not skipped
    assert row["drifting"] == [[1, "bias", 1.0]]


GIB = 2**30


def shard_bound_gib(params: int, world_size: int = 2) -> float:
    """2 × (one rank's shard of one fp32 AdamW training state: parameters, gradients, two moments) + 1.5 GiB."""
    return 2 * (16 * params / world_size) / GIB + 1.5


def _run_peaks(tmp_path, size: str, meta: bool) -> tuple[list[dict], list[float]]:
    proc = reportgen(
        tmp_path,
        "--config-dir",
        str(USER_CONF),
        "+model=meta_llama",
        f"model.size={size}",
        f"model.meta={str(meta).lower()}",
        "distributed.world_size=2",
        "distributed.strategy=fsdp2",
        "distributed.timeout_s=300",
        *SHARDED_PARTS_ONLY,
        pythonpath=str(TESTS),
    )
    [out] = run_dirs(tmp_path)
    rows = json.loads((out / "results.json").read_text())
    assert not [r for r in rows if r["status"] == "ERROR"], proc.stdout[-3000:]
    peaks = sorted(
        (r for r in rows if r["metric"] == "run_peak_rss_bytes" and r.get("rank") is not None), key=lambda r: r["rank"]
    )
    assert [r["rank"] for r in peaks] == [0, 1]
    html = (out / "report.html").read_text()
    assert "peak resident memory per rank" in html
    print(f"{size} meta={meta}: " + ", ".join(f"rank {int(r['rank'])} {r['value'] / GIB:.2f} GiB" for r in peaks))
    return rows, [r["value"] / GIB for r in peaks]


@pytest.mark.slow
def test_a_25m_model_on_fsdp2_stays_within_1_5_gib_per_rank(tmp_path):
    _, peaks = _run_peaks(tmp_path, "25m", meta=True)
    assert max(peaks) <= 1.5


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("meta", [True, False], ids=["meta-build", "host-build"])
def test_a_100m_model_on_fsdp2_holds_its_shard_per_rank(tmp_path, meta):
    """The one heavy test (about 100M parameters on 2 CPU ranks, several minutes on 2 cores)."""
    _, peaks = _run_peaks(tmp_path, "100m", meta=meta)
    assert max(peaks) <= shard_bound_gib(102_253_568)
