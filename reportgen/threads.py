"""How many CPU threads torch may use: the ``threads`` setting, resolved and applied (foundation layer).

torch runs each op on ``torch.get_num_threads()`` intra-op threads (OpenMP) and runs
independent ops on ``torch.get_num_interop_threads()`` inter-op threads. On a machine whose
cores are shared, every parallel op waits for all its threads to be scheduled, so more threads
than the cores this process really gets makes steps slower and much noisier, not faster.

``threads: auto`` (the default, ``conf/config.yaml``) therefore takes what the machine gives the
process (``len(os.sched_getaffinity(0))``, which respects ``taskset``, cgroups' cpusets and
SLURM's binding), counts physical cores among those CPUs (hyper-threads share one core's
arithmetic units), and uses half of them, at least 1 and at most :data:`AUTO_CAP`: the other
half stays free for whatever else runs on the machine, so a busy machine slows a run down by
the share of a core it loses, not by a barrier that waits for a descheduled thread at every op.
An explicit ``OMP_NUM_THREADS`` (a parallel launcher's ``hydra.job.env_set``, or the user's
shell) is taken as the user's choice.

The pipeline applies it once, before the twins are built (``reportgen.commands.run.run``); this module
only decides and sets numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

#: Most intra-op threads ``auto`` picks. The models reportgen ships (and most recompute
#: targets checked on a CPU) are small: their matmuls gain little past 4 threads, while every
#: extra thread is one more that must be scheduled at each op's barrier. Measured on the shared
#: 2-core machine this was written on (load average 6-7 from other work; a mlp training step,
#: batch 64): 16 ms median with 1 thread, 1620 ms with 2 (100× slower); with both cores also
#: kept busy by a spinning process, 20 ms with 1 thread and 610 ms with 2. Hence half the
#: physical cores (1 on a 2-core machine), and benchmarks/loaded_machine.py to measure a whole report.
AUTO_CAP = 4


@dataclass(frozen=True)
class Threads:
    """The thread counts a run uses, and why.

    Attributes:
        intra_op: ``torch.set_num_threads`` value, threads.
        inter_op: ``torch.get_num_interop_threads()`` after applying, threads (torch allows
            setting it once per process, so a later job of the same process keeps the first).
        setting: the ``threads`` setting as given (``auto`` or a number).
        source: one phrase saying where ``intra_op`` came from, e.g. ``auto: 2 CPUs available``.
    """

    intra_op: int
    inter_op: int
    setting: str
    source: str

    def describe(self) -> str:
        """``"1 intra-op, 1 inter-op thread (auto: ...)"``, for the report and the log."""
        return (
            f"{self.intra_op} intra-op, {self.inter_op} inter-op thread{'s' if self.inter_op != 1 else ''} "
            f"({self.source})"
        )


def available_cpus() -> int:
    """CPUs this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where it is missing), ≥ 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def physical_cores(cpus: set[int] | None = None) -> int | None:
    """Physical cores among ``cpus`` (default: this process's affinity), from Linux's sysfs topology.

    Returns:
        The count of distinct ``(package, core)`` pairs, or None where sysfs does not say
        (not Linux, a container hiding it).
    """
    if cpus is None:
        cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(
                (
                    topology.joinpath("physical_package_id").read_text().strip(),
                    topology.joinpath("core_id").read_text().strip(),
                )
            )
        except OSError:
            return None
    return len(cores) or None


def threads_problem(setting: object) -> str | None:
    """Why ``setting`` is not a valid ``threads`` value, naming the fix; None when it is valid."""
    text = str(setting).strip().lower()
    if text == "auto" or (text.isdigit() and int(text) > 0):
        return None
    return (
        f"threads={setting!r} is not a thread count: use threads=auto (the default: half the physical cores "
        f"this process may use, at most {AUTO_CAP}) or a whole number ≥ 1, e.g. threads=1"
    )


def resolve_threads(setting: object = "auto", environ: dict | None = None) -> tuple[int, str]:
    """The intra-op thread count for ``setting`` and where it came from.

    Args:
        setting: ``threads`` from the config: ``auto`` or a positive whole number.
        environ: the environment to read ``OMP_NUM_THREADS`` from (default ``os.environ``).

    Returns:
        ``(threads, source)``: a number ≥ 1 and a phrase for the report, e.g.
        ``(1, "auto: half of 2 physical cores of the 2 CPUs available, at most 4")``.

    Raises:
        ValueError: ``setting`` is neither ``auto`` nor a positive number (:func:`threads_problem`).
    """
    problem = threads_problem(setting)
    if problem:
        raise ValueError(problem)
    text = str(setting).strip().lower()
    if text != "auto":
        return int(text), f"threads={int(text)}"
    env = os.environ if environ is None else environ
    omp = str(env.get("OMP_NUM_THREADS", "")).strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp), f"auto: OMP_NUM_THREADS={int(omp)}"
    cpus, cores = available_cpus(), physical_cores()
    return auto_threads(cpus, cores), (
        f"auto: half of {cores or cpus} {'physical cores' if cores else 'CPUs'} "
        f"of the {cpus} CPU{'s' if cpus != 1 else ''} available, at most {AUTO_CAP}"
    )


def auto_threads(cpus: int, cores: int | None) -> int:
    """``threads: auto``'s count: half the physical cores among ``cpus`` CPUs (all CPUs when the
    cores are unknown), at least 1, at most :data:`AUTO_CAP` (module docstring; measurement there)."""
    return max(1, min((min(cores or cpus, cpus)) // 2, AUTO_CAP))


def apply_threads(setting: object = "auto", environ: dict | None = None) -> Threads:
    """Set torch's intra-op and inter-op thread counts for ``setting`` (:func:`resolve_threads`).

    The inter-op count can only be set once per process and before any inter-op work
    (torch raises ``RuntimeError`` otherwise, e.g. in the second job of a sweep run in one
    process); then the count already in force is kept and reported.

    Returns:
        The :class:`Threads` in force afterwards.

    Raises:
        ValueError: ``setting`` is not a valid thread count.
    """
    count, source = resolve_threads(setting, environ)
    torch.set_num_threads(count)
    if torch.get_num_interop_threads() != count:
        try:
            torch.set_num_interop_threads(count)
        except RuntimeError:  # already set, or inter-op work already ran in this process: keep it
            pass
    return Threads(torch.get_num_threads(), torch.get_num_interop_threads(), str(setting), source)
