"""The run folder: refuse one that holds a run, lock it, probe that it is writable, and clean up after a refusal.

Hydra writes ``.hydra/*.yaml`` into the output folder before reportgen's job function (and
``Callback.on_job_start``) runs; the earliest hook that knows the resolved folder is ``Callback.on_run_start``
(``on_multirun_start`` for a sweep), right after composing (``${now:...}`` caches its value, so ``run_job`` uses
the same folder). There :class:`RunFolderGuard` (``hydra.callbacks.run_folder`` in ``conf/config.yaml``) refuses,
exit 2, a folder that holds a run or any other file (a run signs only the files it writes), and takes
:class:`FolderLock`, so a second run started into the same folder at the same moment is refused too. A run killed
hard leaves the lock file, and the folder stays refused (it holds a partial run).
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import logging
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from reportgen.commands.validation import config_problems, unknown_setting_problems
from reportgen.errors import ExitCode, usage
from reportgen.files import write_failure
from reportgen.trust.documents import ENVELOPE_NAME
from reportgen.trust.manifest import PENDING_NAME, SIGN_COMMAND

#: Lock file a running reportgen job holds in its folder (a dotfile: never a statement subject).
LOCK_NAME = ".reportgen.lock"
#: Names whose presence means a folder holds a run (or a sweep) already.
RUN_MARKERS: tuple[str, ...] = (".hydra", "results.csv", "results.json", "results.partial.json", "report.html")
RUN_MARKERS += ("report.pdf", "report.unsigned.pdf", "statement.dsse.json", "multirun.yaml", LOCK_NAME)


class StartRefused(SystemExit):
    """The run must not start: prints ``reportgen: cannot start: MESSAGE`` when made, exits 2.

    A ``SystemExit`` subclass because Hydra's ``run_and_report`` catches every ``Exception``
    and turns it into exit 1 with a traceback-like print; this one passes through Hydra
    untouched to ``cli.exit_code``.

    Args:
        message: one paragraph naming the problem and the fix.
        headline: prefix ``reportgen: cannot start:`` (off for a message that has its own).
    """

    def __init__(self, message: str, headline: bool = True):
        print(f"reportgen: cannot start: {message}" if headline else message, flush=True)
        super().__init__(ExitCode.USAGE)


def run_markers(folder: Path, depth: int = 0) -> list[str]:
    """What in the candidate output ``folder`` shows it holds a run, as relative POSIX paths (empty: none), looking
    ``depth`` levels of subfolders down too (1 for a sweep folder, whose jobs live in ``0/``, ``1/``, ...)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [name for name in RUN_MARKERS if (folder / name).exists() or (folder / name).is_symlink()]
    if depth > 0:
        for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
            found += [f"{child.name}/{m}" for m in run_markers(child, depth - 1)]
    return found


class FolderLock:
    """An exclusive lock on a run folder: ``.reportgen.lock`` made with ``O_EXCL``, held with ``flock``.

    Args:
        folder: the run (or sweep) folder; created when missing.

    Raises:
        StartRefused: the folder holds a run already, or another run took the lock first.
    """

    def __init__(self, folder: Path, depth: int = 0):
        self.folder = Path(folder).absolute()
        self.path = self.folder / LOCK_NAME
        self.fd: int | None = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartRefused(
                f"cannot create the output folder {self.folder}: {exc.strerror}. Choose another with hydra.run.dir=..."
            ) from None
        found = run_markers(self.folder, depth)
        if found == [LOCK_NAME] and lock_is_held(self.path):
            raise StartRefused(another_run_is_writing(self.folder))
        listed = found or sorted(p.name + ("/" if p.is_dir() else "") for p in self.folder.iterdir())
        if listed:
            raise StartRefused(occupied(self.folder, listed, holds_a_run=bool(found)))
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
            if exc.errno != errno.EEXIST and not isinstance(exc, BlockingIOError):  # not another run: the folder
                raise StartRefused(f"{write_failure(self.path, exc)}. Nothing was written.") from None
            raise StartRefused(another_run_is_writing(self.folder)) from None
        os.write(self.fd, f"{os.getpid()}\n".encode())
        atexit.register(self.release)

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent; also runs at interpreter exit)."""
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self.fd)  # closing the descriptor releases the flock
        self.fd = None


def lock_is_held(path: Path) -> bool:
    """Whether a live process holds the ``flock`` on a lock file (False for a stale one)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also drops the probe's own lock
    return False


def another_run_is_writing(folder: Path) -> str:
    """The refusal for a folder whose lock another live run holds."""
    return (
        f"another reportgen run is writing into {folder} right now ({LOCK_NAME}); two runs never share a "
        "folder. Leave hydra.run.dir at its default (a new timestamped folder per run) or choose an empty folder."
    )


def occupied(folder: Path, found: list[str], holds_a_run: bool) -> str:
    """The one-paragraph refusal for a folder that holds a run (``found``: what marks it) or files no run wrote
    (a run signs only what it writes): the folder, what is in it, the fix."""
    shown = ", ".join(found[:6]) + (", ..." if len(found) > 6 else "")
    if holds_a_run:
        return (
            f"the output folder {folder} already holds a run ({shown}); reportgen never writes into it, so that "
            f"run {what_the_run_is(folder, found)} Leave hydra.run.dir (hydra.sweep.dir for -m) at its default, which "
            "makes a new timestamped folder per run, or point it at a new or empty folder."
        )
    return (
        f"the output folder {folder} holds files that are not a run's ({shown}); a run starts only in a new "
        "or empty folder, so that its signed statement covers exactly what it wrote. Move them, or leave "
        "hydra.run.dir (hydra.sweep.dir for -m) at its default, a new timestamped folder per run."
    )


def what_the_run_is(folder: Path, found: list[str]) -> str:
    """The end of the refusal's sentence "so that run ...", from what marks the folder (``found``, relative POSIX
    paths): signed (a statement); finished but not signed yet (the pending mark: the command that signs it); stopped
    before it was signed (a killed run: partial results, a lock no process holds; the command that runs it again)."""
    names = {Path(name).name for name in found}
    locks = [Path(folder) / name for name in found if Path(name).name == LOCK_NAME]
    if ENVELOPE_NAME in names:
        return "stays as it was signed."
    if (Path(folder) / PENDING_NAME).is_file():
        return f"stays as it is: its checks finished but it is not signed yet; sign it with `{SIGN_COMMAND} {folder}`."
    if "results.partial.json" in names or any(not lock_is_held(lock) for lock in locks):
        return (
            "stays as it is: it was stopped before it finished (killed: partial results or a lock no process "
            f"holds) and nothing in it is signed; run it again into a new folder with `{rerun_command(folder)}`."
        )
    return "stays as it is (it is not signed)."


def rerun_command(folder: Path) -> str:
    """``python -m reportgen OVERRIDES``, the overrides from the folder's ``.hydra/overrides.yaml`` (shell-quoted;
    ``python -m reportgen ...`` when it cannot be read)."""
    try:
        overrides = OmegaConf.to_container(OmegaConf.load(Path(folder) / ".hydra" / "overrides.yaml"))
    except Exception:  # noqa: BLE001 - unreadable or not YAML: the command is named without its overrides
        overrides = None
    if not isinstance(overrides, list):
        return "python -m reportgen ..."
    return " ".join(["python -m reportgen", *(shlex.quote(str(o)) for o in overrides)])


class RunFolderGuard(Callback):
    """Hydra callback: validate the config and claim the output folder before Hydra writes into it."""

    def __init__(self) -> None:
        self.lock: FolderLock | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Single run: refuse bad settings, then a folder that holds a run; lock ``hydra.run.dir``."""
        if config.get("model") is None or config.get("task") is None:
            raise StartRefused(usage(), headline=False)  # no model chosen: write no folder at all
        problems = config_problems(config)
        if problems:
            raise StartRefused(problems)
        self.lock = FolderLock(Path(str(config.hydra.run.dir)))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Sweep: refuse settings no job could start with (unknown keys, added with ``+``: the sweep's
        values are judged per job), then a sweep folder that holds runs (its own or its jobs'); lock it."""
        problems = unknown_setting_problems(config)
        if problems:
            raise StartRefused("; ".join(problems) + ".")
        self.lock = FolderLock(Path(str(config.hydra.sweep.dir)), depth=1)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Drop the lock; the folder now holds a run (or a sweep) and stays refused."""
        if self.lock is not None:
            self.lock.release()

    on_multirun_end = on_run_end


def job_log_path(run_dir: Path | None = None) -> Path | None:
    """The file Hydra's job logging writes to (``<run dir>/<job name>.log``), or None; one inside ``run_dir``
    (the run's own log) first."""
    files = [Path(h.baseFilename) for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    files = [f for f in files if str(f) != os.devnull]
    inside = [f for f in files if run_dir is not None and f.is_relative_to(Path(run_dir).absolute())]
    found = inside or files
    return found[0] if found else None


def unwritable(folder: Path) -> str:
    """Why the run folder cannot take the report's files ("" when it can): a probe file is created and
    removed before any model work, so a long run never ends unable to write what it measured."""
    probe = folder / ".reportgen-write-probe"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return (
            f"the run folder {folder} is not writable ({exc.strerror or exc}); choose another with "
            "hydra.run.dir=PATH, or free the disk"
        )
    return ""


def forget_unstarted_run(folder: Path) -> None:
    """After a run that could not start (exit 2 before anything was measured), remove the
    ``.hydra/`` Hydra wrote into its folder, so the corrected command can use the same folder.

    Only when nothing else marks a run there (no results, report or statement): a folder that
    holds a measured or signed run is never touched.
    """
    folder = Path(folder)
    others = [m for m in run_markers(folder) if m not in (".hydra", LOCK_NAME)]
    if not others and (folder / ".hydra").is_dir():
        shutil.rmtree(folder / ".hydra", ignore_errors=True)
