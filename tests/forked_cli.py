"""Run ``python -m reportgen…`` commands in a process forked from a server that imported them once.

A fresh interpreter pays ~2.2 s CPU of imports (torch alone 1.7 s) before the command reads its first
argument; the suite starts ~70 such commands. :func:`run` forks each one instead from the test worker's
multiprocessing fork server (``multiprocessing.set_forkserver_preload``, the one the distributed tests'
ranks come from), which has imported torch, Hydra, reportgen's commands and the report's libraries but run
nothing. The child then sets up what a fresh ``python -m MODULE ARGS`` in ``cwd`` would see — the working
directory, the environment, ``sys.path`` (the script folder ``cwd`` first, then ``PYTHONPATH``, then the
interpreter's own), ``sys.argv`` and stdout/stderr on files — runs the module with :func:`runpy.run_module`
as ``__main__``, runs the ``atexit`` handlers (a forked child skips them) and exits with the command's code.
What differs from a fresh interpreter: modules are already imported (their import-time state only: the
server runs no product code), so an environment variable read at import (``OMP_NUM_THREADS`` by torch,
``MPLBACKEND`` by matplotlib) or a stand-in module put on ``PYTHONPATH`` for a preloaded one has the
server's value, not the command's; every command shares the server's string-hash seed
(``PYTHONHASHSEED``) and warning filters (``PYTHONWARNINGS``); stdin is ``/dev/null``. A test about any
of these starts a real process.

Tests that are about the process itself (signals, two commands at once, a prompt on stdin, console
scripts, the wheel) start real processes with :mod:`subprocess`; ``REPORTGEN_TESTS_FRESH_PROCESSES=1``
makes every command a fresh interpreter again.
"""

from __future__ import annotations

import atexit
import io
import json
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import traceback
from functools import cache
from pathlib import Path

#: Imported once by the fork server (each a no-op import if missing). Never a module that is run with
#: ``-m`` itself (runpy warns when the module it runs is already imported); packages whose
#: ``__main__`` is run are fine.
PRELOAD = [
    "torch",
    "reportgen.commands.cli",
    "reportgen.commands.run",
    "reportgen.checks",
    "reportgen.checks.distributed.check",
    "reportgen.memory.tracker",
    "reportgen.report.render",
    "reportgen.trust.signing",
    "reportgen.verify",
    "reportgen.commands.compare",
    "reportgen.sweep",
    "matplotlib.pyplot",
    "weasyprint",
    "pyhanko.sign.validation",
]

#: Set to 1 to run every command in a fresh interpreter (what a user's shell does).
FRESH_ENV = "REPORTGEN_TESTS_FRESH_PROCESSES"


def fresh_processes() -> bool:
    """True when ``REPORTGEN_TESTS_FRESH_PROCESSES=1``: :func:`run` starts real interpreters."""
    return os.environ.get(FRESH_ENV, "") == "1"


@cache
def interpreter_path(pythonpath: str) -> tuple[str, ...]:
    """``sys.path`` of a fresh ``python -c`` with ``PYTHONPATH=pythonpath``, minus its script entry
    (``''``): what ``python -m`` has after the folder it is run from. One tiny interpreter per value."""
    out = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
        env={**os.environ, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple(json.loads(out)[1:])


def _text_stream(fd: int) -> io.TextIOWrapper:
    """A text stream on ``fd`` as a fresh interpreter with ``PYTHONUNBUFFERED`` makes it (UTF-8)."""
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False), encoding="utf-8", line_buffering=True, write_through=True
    )


def _child(module: str, args: list[str], cwd: str, env: dict, path: list[str], out: str, err: str) -> None:
    """Inside the forked process: become ``python -m MODULE ARGS`` run in ``cwd``; exit with its code."""
    for fd, name in ((1, out), (2, err)):
        target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout, sys.stderr = _text_stream(1), _text_stream(2)
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = [cwd, *path]
    sys.argv = [module, *args]
    code: object = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code
    except BaseException:  # noqa: BLE001 - what the interpreter prints for an uncaught exception; exit 1
        traceback.print_exc()
        code = 1
    # What the interpreter's own exit runs, in its order, and a forked child skips: threading's shutdown
    # (callbacks such as joblib/loky's executor shutdown, then non-daemon threads joined), then atexit
    # (logging's flush). Without the first, loky's idle workers outlive the command by their 300 s timeout.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)


def run(cwd: Path, module: str, args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in ``cwd`` with environment ``env``, forked from the fork server; the
    :class:`subprocess.CompletedProcess` (text) a real one would give.

    Raises:
        subprocess.TimeoutExpired: the command ran past ``timeout`` seconds (it is killed first).
    """
    command = [sys.executable, "-m", module, *args]
    if fresh_processes():
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    path = list(interpreter_path(env.get("PYTHONPATH", "")))
    with tempfile.TemporaryDirectory(prefix="reportgen-cli-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        process = multiprocessing.get_context("forkserver").Process(
            target=_child, args=(module, list(args), str(Path(cwd).resolve()), dict(env), path, str(out), str(err))
        )
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(command, timeout)
        said = [f.read_text(errors="replace") if f.exists() else "" for f in (out, err)]
        if not err.exists():  # the child died before its output was redirected
            said[1] = f"forked_cli: the command's process ended with {process.exitcode} before it started\n"
        return subprocess.CompletedProcess(command, process.exitcode, *said)
