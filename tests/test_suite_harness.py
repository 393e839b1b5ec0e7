"""The suite's own harness: the forked command runner (tests/forked_cli.py) gives a command what a fresh
interpreter gives it, and the files named to start first exist."""

from __future__ import annotations

import subprocess
import sys

import forked_cli
from conftest import LONGEST_FIRST, REPO, cli_env

PROBE = """
import atexit, json, os, sys
atexit.register(lambda: print("atexit ran"))
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "probe": os.environ.get("PROBE"),
                  "name": __name__, "in_path": [p for p in sys.path if p.endswith("extra")]}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_command_sees_what_a_fresh_interpreter_sees(tmp_path):
    (tmp_path / "probe_cli.py").write_text(PROBE)
    env = {**cli_env(str(tmp_path / "extra")), "PROBE": "yes"}
    forked = forked_cli.run(tmp_path, "probe_cli", ["5", "--x"], env, timeout=60)
    fresh = subprocess.run(
        [sys.executable, "-m", "probe_cli", "5", "--x"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 5 and '"probe": "yes"' in forked.stdout and forked.stdout.endswith("atexit ran\n")


def test_an_uncaught_exception_exits_1_with_its_traceback(tmp_path):
    (tmp_path / "boom_cli.py").write_text("raise ValueError('boom')\n")
    done = forked_cli.run(tmp_path, "boom_cli", [], cli_env(), timeout=60)
    assert done.returncode == 1 and "ValueError: boom" in done.stderr and "Traceback" in done.stderr


def test_threading_exit_callbacks_run_before_child_processes_are_joined(tmp_path):
    """joblib's loky executor stops its worker processes from a ``threading._register_atexit``
    callback, which a fresh interpreter runs before multiprocessing joins its children; run the other
    way round, a forked sweep waited for the idle workers' 300 s timeout."""
    (tmp_path / "worker_cli.py").write_text(
        "import multiprocessing, threading\n"
        "ctx = multiprocessing.get_context('fork')\n"
        "done = ctx.Event()\n"
        "threading._register_atexit(done.set)\n"
        "ctx.Process(target=done.wait).start()  # ends when the exit callback runs\n"
    )
    done = forked_cli.run(tmp_path, "worker_cli", [], cli_env(), timeout=30)
    assert done.returncode == 0 and done.stderr == ""


def test_the_files_that_start_first_exist_once_each():
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert [name for name in LONGEST_FIRST if not (REPO / name).is_file()] == []
