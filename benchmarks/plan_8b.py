"""Wall time and peak RSS of ``python -m reportgen.plan`` on the shipped Llama-3-8B-shaped config at 8192 tokens.

Target (issue 15, item 4): at most 30 s and 2 GiB peak RSS on a CPU-only machine. The command
runs as a child process (the time includes Python start-up and the transformers import, as a
user sees it); its peak RSS is read with ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``
(KiB on Linux), and its CPU time (user + system) beside the wall time, since on a shared
machine the wall time depends on the load. The plan is written to a temporary folder and removed.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plan_8b.py                      # seq=8192 batch=1 bf16, 80 GiB
    .venv/bin/python benchmarks/plan_8b.py conf/plan/qwen2_7b seq=4096 pdf=false  # another shape / words
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_SECONDS, TARGET_RSS_GIB = 30.0, 2.0


def main(argv: list[str]) -> int:
    """Run the plan once, print its table, wall time and peak RSS against the targets; 1 if a target is missed."""
    config = argv[0] if argv and "=" not in argv[0] else str(ROOT / "conf" / "plan" / "llama3_8b")
    words = [w for w in argv if "=" in w]
    defaults = {"seq": "8192", "batch": "1", "dtype": "bf16", "memory_gib": "80"}
    given = {w.split("=", 1)[0] for w in words}
    words = [f"{k}={v}" for k, v in defaults.items() if k not in given] + words
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "reportgen.plan", config, *words, f"out={Path(tmp) / 'plan'}"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss_gib, cpu_seconds = usage.ru_maxrss / 2**20, usage.ru_utime + usage.ru_stime
    print(done.stdout, end="")
    if done.returncode != 0:
        print(done.stderr, end="", file=sys.stderr)
        return done.returncode
    ok = seconds <= TARGET_SECONDS and rss_gib <= TARGET_RSS_GIB
    print(f"wall {seconds:.1f} s (target <= {TARGET_SECONDS:g} s; CPU time {cpu_seconds:.1f} s), peak RSS {rss_gib:.2f} GiB (target <= "
          f"{TARGET_RSS_GIB:g} GiB), {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}: "
          f"{'within target' if ok else 'TARGET MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
