"""Benchmark: wall time of a sweep over recompute implementations with and without the plain-twin cache.

Runs the same multirun twice (basic launcher, one job after another): once with
``REPORTGEN_CACHE_DIR=off`` (every job trains the plain twin) and once with the default cache
under the sweep folder (job 0 trains it, later jobs load it), and prints both wall times and
how many times the plain twin was trained.

    python benchmarks/sweep_cache.py                       # +model=mlp, 4 jobs
    python benchmarks/sweep_cache.py --model ffn --extra budget.examples=256
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def sweep(folder: Path, model: str, extra: list[str], cache: str) -> tuple[float, str]:
    """Run the 4-job sweep into ``folder``; returns (wall time in s, console output)."""
    args = [
        sys.executable,
        "-m",
        "reportgen",
        "-m",
        f"+model={model}",
        "recompute=non_reentrant,reentrant",
        "recompute.preserve_rng_state=true,false",
        "larger_batch.enabled=false",
        "timing.measured_steps=5",
        "timing.target_ci_half_width_pp=null",
        "report.sign=false",
        "report.pdf=false",
        *extra,
        f"hydra.sweep.dir={folder}",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPORTGEN_CACHE_DIR": cache}
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=folder.parent, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, proc.stdout + proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--extra", nargs="*", default=[], help="further overrides, e.g. budget.seeds=[0]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for label, cache in (("without cache", "off"), ("with cache", "")):
            seconds, out = sweep(Path(tmp) / label.replace(" ", "-"), args.model, args.extra, cache)
            print(
                f"{label}: 4 jobs in {seconds:.1f} s; plain twin trained {out.count('training plain twin')} times, "
                f"loaded from cache {out.count('from cache')} times"
            )


if __name__ == "__main__":
    main()
