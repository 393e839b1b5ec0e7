"""Wall time of a 2-rank report vs the single-process one, measured side by side.

Runs ``python -m reportgen +model=mlp`` (the CLI, each in a fresh process, as a user would)
with ``distributed.world_size=1`` and then ``=2`` (ranks started by torch's elastic launcher,
gloo on CPU), alternating, ``--repeats`` times each, into temporary folders; prints each wall
time, the medians and their ratio. Issue 18's target: the 2-rank report takes at most 2.5x the
single-process wall time. The 2-rank run does everything the single-process one does plus the
sharded checks (their ranks start, import torch, build the twins, measure and hand rows back).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/distributed_wall_time.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/distributed_wall_time.py --repeats 3 -- distributed.strategy=fsdp2

Extra arguments after ``--`` go to both runs. Defaults keep the report small (one seed, short
budget, no PDF, unsigned) so that the sharded checks are a visible share of the time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Both runs: the mlp with a short budget, unsigned, HTML only.
COMMON = [
    "+model=mlp",
    "budget.seeds=[0]",
    "budget.examples=512",
    "larger_batch.enabled=false",
    "report.sign=false",
    "report.pdf=false",
    "timing.max_measure_seconds=2",
]


def wall(world_size: int, extra: list[str], folder: Path) -> tuple[float, int]:
    """Seconds and exit code of one CLI run with ``distributed.world_size=world_size``."""
    args = [
        sys.executable,
        "-m",
        "reportgen",
        *COMMON,
        f"distributed.world_size={world_size}",
        f"hydra.run.dir={folder}",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        print(done.stdout[-2000:], done.stderr[-2000:], sep="\n")
    return seconds, done.returncode


def main() -> None:
    """Parse ``--repeats`` and extra overrides, run both variants alternately, print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("extra", nargs="*", help="overrides for both runs (after --)")
    opts = parser.parse_args()
    times: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(opts.repeats):
            for world in (1, 2):
                seconds, code = wall(world, opts.extra, Path(tmp) / f"w{world}-{repeat}")
                times[world].append(seconds)
                print(f"world_size={world} run {repeat}: {seconds:6.1f} s (exit {code})", flush=True)
    one, two = statistics.median(times[1]), statistics.median(times[2])
    print(f"median wall time: 1 process {one:.1f} s, 2 ranks {two:.1f} s; ratio {two / one:.2f}x (target <= 2.5x)")


if __name__ == "__main__":
    main()
