"""Wall time and peak RSS of ``python -m reportgen.plan`` at the scale users train (issue 24, item 3).

Cases (targets on a quiet 2-core CPU, the child process's wall time including Python start-up and
the transformers import, as a user sees it; peak RSS from ``resource.getrusage(RUSAGE_CHILDREN)``):

* ``8b``: Llama-3-8B shape, seq 8192, batch 2, bf16, 8 ranks FSDP, selective op recompute, 96 GiB
  (the issue's done-when command): <= 5 s, <= 2 GiB;
* ``70b``: Llama-3.1-70B shape, seq 32768, batch 1, bf16, 64 ranks FSDP, full recompute: <= 10 s, <= 2 GiB;
* ``8b-all``: the 8B shape with every recompute policy and a budget (no target: the Pareto table).

Each case runs in its own child; the plan goes to a temporary folder, removed after.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plan_8b.py            # 8b and 70b
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plan_8b.py 8b-all
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "conf" / "plan"
#: name: (words, target seconds, target RSS GiB)
CASES = {
    "8b": (
        [
            str(PLAN / "llama3_8b"),
            "seq=8192",
            "batch=2",
            "dtype=bf16",
            "world_size=8",
            "strategy=fsdp",
            "recompute=selective_op",
            "memory_gib=96",
        ],
        5.0,
        2.0,
    ),
    "70b": (
        [
            str(PLAN / "llama3_70b"),
            "seq=32768",
            "batch=1",
            "dtype=bf16",
            "world_size=64",
            "strategy=fsdp",
            "recompute=full",
        ],
        10.0,
        2.0,
    ),
    "8b-all": (
        [
            str(PLAN / "llama3_8b"),
            "seq=8192",
            "batch=2",
            "dtype=bf16",
            "world_size=8",
            "strategy=fsdp",
            "memory_gib=80",
        ],
        None,
        2.0,
    ),
}


def run_case(name: str) -> bool:
    """Run one case in a child process; print its table, wall time, CPU time and peak RSS. True when within target."""
    words, seconds_target, rss_target = CASES[name]
    script = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "done = subprocess.run(sys.argv[1:]); "
        "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
        "print(f'@@ {time.perf_counter() - t:.2f} {u.ru_maxrss / 2**20:.3f} {u.ru_utime + u.ru_stime:.2f} "
        "{done.returncode}')"
    )
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-c",
            script,
            sys.executable,
            "-m",
            "reportgen.plan",
            *words,
            f"out={Path(tmp) / 'plan'}",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = done.stdout.splitlines()
    seconds, rss, cpu, code = lines[-1].split()[1:]
    print("\n".join(lines[:-1]))
    if code != "0":
        print(done.stderr[-2000:], file=sys.stderr)
        return False
    seconds, rss = float(seconds), float(rss)
    ok = (seconds_target is None or seconds <= seconds_target) and rss <= rss_target
    target = f"target <= {seconds_target:g} s" if seconds_target else "no time target"
    print(
        f"[{name}] wall {seconds:.1f} s ({target}; CPU time {cpu} s), peak RSS {rss:.2f} GiB (target <= "
        f"{rss_target:g} GiB), {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}: "
        f"{'within target' if ok else 'TARGET MISSED'}\n"
    )
    return ok


def main(argv: list[str]) -> int:
    """Run the named cases (default 8b and 70b); 1 if a target is missed."""
    results = [run_case(name) for name in (argv or ["8b", "70b"])]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
