"""Process groups, launch and gathering for sharded twins (``distributed.world_size > 1``); machinery only:
``reportgen.checks.distributed`` measures with it, wrapping a twin is :mod:`.wrapping`, whole tensors :mod:`.full`.

Ranks are started with torch's own elastic launcher (``elastic_launch``, the machinery behind ``torchrun``); under
an existing ``torchrun`` or SLURM ``srun`` launch (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` set) reportgen joins
that group. The default process group (``distributed.backend``) carries the training collectives; a second gloo
group ("control") carries rows and the ranks' agreement on failures, so a rank whose training collective timed out
can still say so.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import logging
import os
import shlex
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from reportgen.distributed.mesh import Layout
from reportgen.errors import Terminated
from reportgen.structure import batch_size_of, map_tensors

#: Environment of an existing launch (torchrun, srun with these exported): join its group.
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class RankFailure(Exception):
    """One or more ranks of an elastic launch failed (raised, were stopped, or crashed).

    Attributes:
        ranks: ``{global rank: one-line message}``, the first failure first.
        signals: ``{global rank: signal name}`` of the ranks the operating system ended with a
            signal (``SIGKILL`` from the OOM killer, ``SIGSEGV``, ...), not by their own code.
    """

    def __init__(self, ranks: dict[int, str], signals: dict[int, str] | None = None):
        super().__init__("; ".join(f"rank {r}: {m}" for r, m in ranks.items()))
        self.ranks = ranks
        self.signals = signals or {}


#: Signals torch's elastic agent turns into ``SignalException`` while ranks run.
AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


@dataclass
class Group:
    """This process's place in the sharded run.

    Attributes:
        rank: global rank, 0 .. world_size - 1.
        world_size: number of ranks.
        backend: the default group's backend (``gloo`` or ``nccl``).
        control: a gloo group for rows and failure agreement (its own timeout).
        device: the device this rank's twins run on.
        layout: the named mesh degrees (``distributed.mesh``), or the 1-D mesh over every rank (None: 1-D).
        mesh: the device mesh (None until :func:`mesh_of` makes it).
    """

    rank: int
    world_size: int
    backend: str
    control: Any
    device: torch.device
    layout: Layout | None = None
    mesh: Any = None

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks (``dp_replicate × dp_shard``; every rank on the 1-D mesh): the shares of a batch."""
        return self.world_size if self.layout is None else self.layout.dp_size

    @property
    def dp_rank(self) -> int:
        """This rank's share of a batch, ``0 .. dp_size - 1``: tensor/context-parallel peers take the same one."""
        return self.rank if self.layout is None else self.layout.dp_rank(self.rank)


def launched() -> bool:
    """True inside an existing launch: ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` are all set."""
    return all(name in os.environ for name in LAUNCH_ENV)


def adopt_slurm_env() -> bool:
    """Inside a SLURM job step with several tasks (``srun``, or Hydra's submitit launcher with
    ``tasks_per_node``/``nodes``), export what torch's ``env://`` rendezvous reads, unless a
    launcher set it already: ``RANK`` = ``SLURM_PROCID``, ``WORLD_SIZE`` = ``SLURM_NTASKS``,
    ``LOCAL_RANK`` = ``SLURM_LOCALID``, ``MASTER_ADDR`` = the job's first node, ``MASTER_PORT``
    from the job id (submitit's ``TorchDistributedEnvironment`` when installed does the same).

    Returns:
        True when it exported them.
    """
    if launched() or int(os.environ.get("SLURM_NTASKS", "1")) <= 1 or "SLURM_PROCID" not in os.environ:
        return False
    try:
        from submitit.helpers import TorchDistributedEnvironment

        TorchDistributedEnvironment().export()
        return True
    except Exception:  # noqa: BLE001 - not installed, or not a submitit job: read SLURM's variables directly
        pass
    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "localhost")
    if any(c in nodes for c in "[,"):
        import subprocess

        shown = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, timeout=30)
        nodes = (shown.stdout.split() or ["localhost"])[0]
    os.environ.setdefault("MASTER_ADDR", nodes)
    os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))
    os.environ["RANK"], os.environ["WORLD_SIZE"] = os.environ["SLURM_PROCID"], os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    return True


def launch_rank() -> int:
    """This process's global rank under an existing launch (0 when not launched)."""
    return int(os.environ.get("RANK", "0")) if launched() else 0


def launch_problem(world_size: int) -> str:
    """Why ``distributed.world_size`` does not fit the existing launch, or ``""``.

    A torchrun/srun launch fixes the number of ranks; a config that asks for another number
    would either start ranks inside ranks or run independent copies that each write a report.
    """
    if not launched():
        return ""
    env = int(os.environ["WORLD_SIZE"])
    if env != world_size and (env > 1 or world_size > 1):
        return (
            f"this process was launched with WORLD_SIZE={env} (torchrun/srun) but distributed.world_size="
            f"{world_size}; set distributed.world_size={env}"
        )
    return ""


def device_problem(world_size: int, device: torch.device) -> str:
    """Why the ranks cannot each have their own GPU, or ``""``: on CUDA every local rank needs a
    device of its own (NCCL refuses two ranks on one GPU)."""
    if world_size <= 1 or device.type != "cuda":
        return ""
    needed = int(os.environ["LOCAL_RANK"]) + 1 if launched() else world_size
    have = torch.cuda.device_count()
    if needed <= have:
        return ""
    return (
        f"distributed.world_size={world_size} on CUDA needs {needed} GPUs on this node (one per rank) but torch "
        f"sees {have}; lower distributed.world_size, or run the ranks on CPU with device=cpu (gloo)"
    )


def resolve_backend(name: str, device: torch.device) -> str:
    """``auto`` → ``nccl`` on CUDA, ``gloo`` on CPU; ``gloo``/``nccl`` as given."""
    return ("nccl" if device.type == "cuda" else "gloo") if name == "auto" else name


def rank_device(device_name: str) -> str:
    """The device setting for this rank: ``cuda:<LOCAL_RANK>`` when CUDA is asked for (or ``auto``
    finds it), else the setting unchanged. Each rank of a node gets its own GPU."""
    wants_cuda = device_name.startswith("cuda") or (device_name == "auto" and torch.cuda.is_available())
    if not wants_cuda:
        return device_name
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if local < torch.cuda.device_count():  # else device_problem refuses the run (exit 2)
        torch.cuda.set_device(local)
    return f"cuda:{local}"


def rank_config(cfg: Any) -> Any:
    """A copy of the composed config with ``device`` set for this rank (:func:`rank_device`)."""
    from omegaconf import open_dict

    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.device = rank_device(str(cfg.device))
    return cfg


def join(backend: str, timeout_s: float, device: torch.device, layout: Layout | None = None) -> Group:
    """Join (or, inside a launched process, initialise) the default process group and a gloo
    control group. Reads ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` (``env://``).

    Args:
        backend: ``gloo`` or ``nccl`` (see :func:`resolve_backend`).
        timeout_s: every collective of the default group raises after this many seconds; the
            control group waits twice as long plus 30 s, so a rank that timed out can still report.
        device: this rank's device.
        layout: the run's mesh layout (:func:`reportgen.distributed.mesh.layout_of`); None: the 1-D mesh.
    """
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=2 * timeout_s + 30))
    return Group(dist.get_rank(), dist.get_world_size(), backend, control, device, layout)


def leave() -> None:
    """Destroy the process groups (best effort: a group broken by a timeout is simply dropped)."""
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def mesh_of(group: Group):
    """The run's device mesh (made once): ``init_device_mesh(device type, shape, mesh_dim_names=names)`` of the
    named layout (``distributed.mesh``, e.g. shape ``(2, 2)`` named ``("dp_shard", "tp")``), else the 1-D mesh over
    every rank, unnamed."""
    if group.mesh is None:
        from torch.distributed.device_mesh import init_device_mesh

        layout = group.layout
        if layout is None or not layout.names:
            group.mesh = init_device_mesh(group.device.type, (group.world_size,))
        else:
            group.mesh = init_device_mesh(group.device.type, layout.shape, mesh_dim_names=layout.names)
    return group.mesh


def shard_batch(batch: tuple, dp_rank: int, dp_size: int) -> tuple:
    """Data-parallel rank ``dp_rank``'s equal, contiguous share of a global batch ``(inputs, targets)``: examples
    ``[dp_rank * n / D, (dp_rank + 1) * n / D)`` of every tensor leaf whose leading size is ``n``, ``D = dp_size``
    (:attr:`Group.dp_rank`, :attr:`Group.dp_size`: tensor- and context-parallel peers take the same share).

    Raises:
        ValueError: ``n`` is not a multiple of ``dp_size``.
    """
    n = batch_size_of(batch[0])
    if n % dp_size:
        raise ValueError(f"a global batch of {n} examples cannot be split equally over {dp_size} data-parallel ranks")
    per = n // dp_size
    take = lambda t: t[dp_rank * per : (dp_rank + 1) * per] if t.dim() and t.shape[0] == n else t
    return tuple(map_tensors(take, part) for part in batch)


def all_gather_objects(obj: Any, group: Group) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank (control group)."""
    out: list[Any] = [None] * group.world_size
    dist.all_gather_object(out, obj, group=group.control)
    return out


def gather_objects(obj: Any, group: Group) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on rank 0 (None on the others; control group)."""
    out = [None] * group.world_size if group.rank == 0 else None
    dist.gather_object(obj, out, dst=0, group=group.control)
    return out


def max_over_ranks(values: list[float], group: Group) -> list[float]:
    """Element-wise maximum of ``values`` (same length on every rank) over the ranks."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group.control)
    return t.tolist()


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Stop this process (exit 1, every thread's stack printed to stderr) if the block runs
    longer than ``seconds``: a rank that hangs in its own code never keeps a run waiting
    forever; the launcher then reports the rank as failed. Uses :mod:`faulthandler`."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def signal_name(exitcode: int) -> str:
    """``"SIGKILL"`` for a process that ended with exit code ``-9`` (killed by that signal); ``""`` otherwise."""
    if exitcode >= 0:
        return ""
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _failure_message(failure: Any) -> str:
    """One line from a torch elastic ``ProcessFailure``: the exception, else how the rank ended."""
    if name := signal_name(int(failure.exitcode)):
        said = {
            "SIGKILL": " (the kernel's out-of-memory killer sends it, or someone ran kill -9)",
            "SIGSEGV": " (a crash inside native code)",
            "SIGBUS": " (a crash inside native code)",
        }.get(name, "")
        return f"the rank's process was killed by {name}{said}; the operating system ended it, not its code"
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    message = str(message or "").strip()
    if not message or message.startswith("To enable traceback"):
        message = (
            f"the rank's process ended with exit code {failure.exitcode} without an error record (it hung past "
            "distributed.timeout_s and its watchdog stopped it, or it crashed; its stderr has the stacks)"
        )
    return message.splitlines()[0]


def start_method(name: str) -> str:
    """How the elastic launcher starts local ranks. ``auto``: ``spawn``, a fresh interpreter per rank that builds
    its setup from the pickled config, on every device. ``fork`` is faster on CPU (a forked rank inherits the
    setup) but not safe: a process with live threads (torch's OpenMP pool, a watchdog) can leave a forked child
    holding a lock no thread will release, and CUDA cannot be initialised again in a forked child at all."""
    return "spawn" if name == "auto" else name


def launch(fn: Callable[..., Any], args: tuple, world_size: int, start_method: str) -> dict[int, Any]:
    """Run ``fn(*args)`` on ``world_size`` local ranks with torch's elastic launcher.

    The launcher sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` in each rank (a c10d rendezvous on a free local port) and, when one rank
    fails, stops the others (no restarts).

    Args:
        fn: a module-level function (it is pickled by reference under ``spawn``).
        args: its picklable arguments.
        world_size: ranks to start on this node.
        start_method: ``spawn``, ``forkserver`` or ``fork``.

    Returns:
        ``{global rank: fn's return value}``.

    Raises:
        RankFailure: a rank raised, crashed or was stopped; every failed rank with its message.
        reportgen.errors.Terminated: SIGTERM reached this process, or the first rank to fail was ended by
            SIGTERM (a preemption); KeyboardInterrupt: SIGINT (or SIGHUP, SIGQUIT) likewise. torch's
            elastic agent installs its own handlers while ranks run (and does not restore them): they are
            restored here, and its ``SignalException`` becomes the interruption it is.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world_size,
        run_id=f"reportgen-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method=start_method,
    )
    elastic = logging.getLogger("torch.distributed.elastic")
    level = elastic.level
    elastic.setLevel(logging.CRITICAL)  # a failed rank is reported as rows, not as the agent's log lines
    handlers = {name: signal.getsignal(getattr(signal, name)) for name in AGENT_SIGNALS if hasattr(signal, name)}
    try:
        return elastic_launch(config, fn)(*args)
    except SignalException as exc:
        raise (Terminated() if exc.sigval == signal.SIGTERM else KeyboardInterrupt()) from None
    except ChildFailedError as exc:
        first = exc.get_first_failure()[0]
        ended_by = signal_name(int(exc.failures[first].exitcode))
        if ended_by in ("SIGTERM", "SIGINT"):  # a preemption or Ctrl-C reached the ranks first
            raise (Terminated() if ended_by == "SIGTERM" else KeyboardInterrupt()) from None
        ordered = [first] + sorted(r for r in exc.failures if r != first)
        signals = {
            r: name
            for r in ordered
            if (name := signal_name(int(exc.failures[r].exitcode))) and name not in ("SIGTERM", "SIGINT")
        }
        raise RankFailure({r: _failure_message(exc.failures[r]) for r in ordered}, signals) from None
    finally:
        elastic.setLevel(level)
        for name, handler in handlers.items():
            if handler is not None:
                signal.signal(getattr(signal, name), handler)


def launch_commands(world_size: int) -> dict[str, str]:
    """The commands that reproduce this sharded run: reportgen starting its ranks itself, and the
    same under ``torchrun`` (arguments as given to this process)."""
    args = ["-m", "reportgen", *sys.argv[1:]]
    torchrun = ["torchrun", "--standalone", f"--nproc-per-node={world_size}", *args]
    return {"reportgen": shlex.join(["python", *args]), "torchrun": shlex.join(torchrun)}
