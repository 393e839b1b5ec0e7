"""Running a sharded check's parts on every rank (:func:`run_sharded`): start the ranks or join a launch, agree
on failures after each part (:func:`rank_rows`), gather every rank's rows to rank 0; ranks that fail as processes
become ERROR rows naming them (:func:`failure_rows`)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig

from reportgen.config import DIST_MEMORY
from reportgen.distributed.launch import (
    Group,
    RankFailure,
    all_gather_objects,
    gather_objects,
    join,
    launch,
    launched,
    leave,
    rank_config,
    resolve_backend,
    start_method,
    watchdog,
)
from reportgen.distributed.mesh import layout_of
from reportgen.limits import CheckLimitExceeded, default_max_rss_gib, limited
from reportgen.memory.device_peak import run_device_peak, run_host_peak
from reportgen.results import Role, Row, Status
from reportgen.results.raised import error_row
from reportgen.twins.prepare import prepare
from reportgen.twins.setup import Setup
from reportgen.twins.template import map_large_allocations, on_meta

#: One part of a sharded check: the section its rows go to, and ``fn(setup, group) -> [Row]``
#: (module-level, so that a spawned rank can import it by name).
Part = tuple[str, Callable[[Setup, Group], list[Row]]]


def run_sharded(setup: Setup, cfg: DictConfig | None, parts: Sequence[Part]) -> list[Row]:
    """Every rank's rows of ``parts`` (none when ``distributed.world_size`` is 1); ``cfg``: the composed config a
    spawned rank builds its own setup from (under ``fork`` a rank inherits ``setup`` instead).

    Returns:
        In the process that launched the ranks, or on rank 0 of a torchrun/srun launch, the rows of
        every rank; on the other ranks of such a launch, nothing (rank 0 reports them). A rank that
        raised, crashed or hung gives ERROR rows naming it, and the parts it stopped NOT_RUN rows.

    Raises:
        ValueError: ranks would be spawned but no ``cfg`` was given.
    """
    dc = setup.config.distributed
    if int(dc.world_size) <= 1:
        return []
    if launched():
        return follow(setup, parts) or []
    method = start_method(str(dc.start_method))
    given = setup if method == "fork" else cfg  # a forked rank inherits the setup; a spawned one builds its own
    if given is None:
        raise ValueError(f"distributed.start_method={method} spawns ranks, which need the composed config")
    try:
        results = launch(rank_worker, (given, tuple(parts)), int(dc.world_size), method)
    except RankFailure as exc:
        return failure_rows(exc.ranks, [name for name, _ in parts], exc.signals)
    return list(results[0])


def follow(setup: Setup, parts: Sequence[Part]) -> list[Row] | None:
    """This process's part as one rank of an existing group: join it, measure, gather to rank 0.

    Returns:
        Every rank's rows on rank 0, None on the other ranks.
    """
    dc = setup.config.distributed
    group = join(resolve_backend(str(dc.backend), setup.device), float(dc.timeout_s), setup.device, layout_of(dc))
    try:
        rows = rank_rows(setup, group, parts)
        gathered = gather_objects(rows, group)
    except Exception as exc:  # noqa: BLE001 - a rank that cannot reach the others says so
        return [ranked(error_row(parts[0][0], exc, f"rank {group.rank} gather"), group.rank)]
    finally:
        leave()
    return None if gathered is None else [row for part in gathered for row in part]


def rank_worker(given: Setup | DictConfig, parts: Sequence[Part]) -> list[Row] | None:
    """The function each elastic-launched rank runs: the setup (inherited from the launching
    process under ``fork``; built from the config, on this rank's device, otherwise), then
    :func:`follow`. Building the setup runs under the watchdog too, so a rank stuck there is
    stopped after ``1.5 × timeout_s + 10`` s. Large allocations get their own mappings
    (:func:`reportgen.twins.template.map_large_allocations`), so twin after twin leaves no fragmented heap."""
    map_large_allocations()
    if isinstance(given, Setup):
        return follow(given, parts)
    with watchdog(1.5 * float(given.distributed.timeout_s) + 10):  # the launching process probed the task already
        setup = prepare(rank_config(given), probe_contract=False, rank=True)
    return follow(setup, parts)


def rank_rows(setup: Setup, group: Group, parts: Sequence[Part]) -> list[Row]:
    """Run every part on this rank, in order, each inside its own ``try`` and watchdog; after each
    part the ranks agree (control group) on who failed, and later parts become NOT_RUN rows
    naming those ranks.

    The watchdog (:func:`reportgen.distributed.launch.watchdog`) allows ``1.5 × timeout_s + 10`` s per
    part: longer than a collective's timeout, so a rank waiting for a failed one reports it first.
    """
    timeout = float(setup.config.distributed.timeout_s)
    ceiling = setup.config.checks.max_rss_gib or default_max_rss_gib()  # checks.max_rss_gib watches every rank
    rows: list[Row] = []
    failed: dict[int, str] = {}
    reached = [("its setup", run_host_peak())]  # (stage, peak resident set after it): where the peak was reached
    for name, part in parts:
        if failed:
            if group.rank == 0:
                rows.append(Row.not_run(name, f"not run: {ranks_said(failed)} failed in an earlier part"))
            continue
        start, said = time.perf_counter(), ""
        with watchdog(1.5 * timeout + 10):
            try:
                with warnings.catch_warnings(), limited(f"{name} on rank {group.rank}", None, ceiling):
                    warnings.simplefilter(
                        "ignore", UserWarning
                    )  # as on one process: torch's notes stay off the console
                    measured = part(setup, group)
                if measured:  # the part's wall time, once (seconds sum per check)
                    measured[0].seconds = time.perf_counter() - start
                rows += measured
            except (Exception, CheckLimitExceeded) as exc:  # noqa: BLE001 - a failure on one rank is a row naming it
                where, seconds = f"rank {group.rank}", time.perf_counter() - start
                row = error_row(name, exc, where, seconds, twin=getattr(exc, "reportgen_twin", None))
                rows.append(ranked(row, group.rank))
                said = row.detail
        failed = {r: s for r, s in enumerate(all_gather_objects(said, group)) if s}
        reached.append((name, run_host_peak()))
    return rows + [peak_row(setup, group, parts, next(stage for stage, peak in reached if peak == reached[-1][1]))]


def peak_row(setup: Setup, group: Group, parts: Sequence[Part], reached_in: str = "") -> Row:
    """This rank's own peak over the whole run so far (its setup and every part): the peak resident set
    (``getrusage``), and on CUDA ``max_memory_allocated`` beside it; an INFO row of the memory part's section
    (the first part's when there is none), ``rank`` column set. Page 1 lists every rank's. ``reached_in``: the
    stage (``"its setup"`` or a part's section) at whose end the peak resident set was first what it is now."""
    names = [name for name, _ in parts]
    section = DIST_MEMORY if DIST_MEMORY in names else names[0]
    rss = run_host_peak()
    cuda = run_device_peak(group.device) if group.device.type == "cuda" else None
    detail = f"peak resident set of rank {group.rank}'s process over the run: {rss / 2**30:.2f} GiB (host memory)"
    detail += f", reached in {reached_in}" if reached_in else ""
    extra: dict[str, Any] = {"build_on_meta": on_meta(setup.template.module), "reached_in": reached_in}
    if cuda is not None:
        detail += f"; max_memory_allocated {cuda[0] / 2**30:.2f} GiB on {group.device}"
        extra |= {"run_peak_allocated_bytes": cuda[0], "run_peak_reserved_bytes": cuda[1]}
    row = Row.fact(
        section, "run peak", Role.NOTE, detail, metric="run_peak_rss_bytes", value=float(rss), unit="B", extra=extra
    )
    return ranked(row, group.rank)


def failure_rows(ranks: dict[int, str], names: Sequence[str], signals: dict[int, str] | None = None) -> list[Row]:
    """Rows for ranks that failed as processes (an elastic launch reported them): one ERROR row per
    rank in the first section of ``names``, NOT_RUN rows in the others, each naming the ranks.

    A rank the operating system ended with a signal (``signals``: the OOM killer's SIGKILL, a
    segfault) is the environment, not recompute: its row is INCONCLUSIVE (column ``signal``)."""
    signals = signals or {}
    rows = []
    for r, message in ranks.items():
        status, extra, said = Status.ERROR, {}, f"rank {r} failed: {message}"
        if r in signals:
            status, extra = Status.INCONCLUSIVE, {"signal": signals[r]}
            said += "; the claim cannot be judged from an interrupted run"
        row = Row.fact(names[0], f"rank {r}", Role.EXCEPTION, said, status=status, metric="exception", extra=extra)
        rows.append(ranked(row, r))
    return rows + [Row.not_run(name, f"not run: {ranks_said(ranks)} failed") for name in names[1:]]


def ranks_said(ranks: dict[int, Any]) -> str:
    """``"rank 1"`` or ``"ranks 0, 1"``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def ranked(row: Row, rank: int) -> Row:
    """``row`` with a ``rank`` column, and the rank in its item (``"rank 1: loss"``)."""
    row.extra["rank"] = rank
    if not row.item.startswith("rank "):
        row.item = f"rank {rank}: {row.item}"
    return row
