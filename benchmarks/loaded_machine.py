"""A loaded machine vs an idle one: wall time of a small mlp report, default ``threads`` vs all cores.

Runs ``python -m reportgen +model=mlp`` with small budgets (fixed work: no adaptive timing, one
seed), side by side in one run, an idle and a loaded run in turn (``--repeat`` pairs each):

- ``threads=auto`` (the default, reportgen/threads.py) on the machine as it is ("idle"), then
  while one busy-looping process per CPU this process may use keeps every core busy ("loaded");
- ``threads=<all CPUs>`` likewise.

It prints each wall time and CPU time (user + system of the run's process: CPU time that grows
under load is threads spinning or waiting at barriers, wall time that grows with the same CPU
time is only the share of the cores the run got), the loaded/idle ratio per setting (target
with the default: ≤ 2×, issue 19), the PDF's page count of each run (it must not depend on
load), and the load average before each run: on a shared machine "idle" means "without our busy loops", so
quote the figures with that load.

Usage (from the repository root; OMP_NUM_THREADS is removed from the runs' environment)::

    .venv/bin/python benchmarks/loaded_machine.py
    .venv/bin/python benchmarks/loaded_machine.py --timeout 900 budget.examples=1024   # more overrides
    .venv/bin/python benchmarks/loaded_machine.py --repeat 3 --threads auto            # medians of 3 pairs

A run that passes ``--timeout`` seconds stops and shows as ``inf``.

Measured on the 2-core machine it was written on, shared with other work (load average 3
from others before the first line, 5-7 before the others; 2026-11-30)::

    threads          idle s  loaded s  loaded/idle   CPU s idle/loaded
    default (auto=1)   10.7      21.9        2.05×   10.5 / 10.9
    all cores (2)      13.0     151.6       11.64×   14.6 / 61.1
    default, load 5-7  20.7      67.7        3.26×   (median of 3 pairs)
    all cores, 5-7     79.1     295.2        3.73×

With one thread the run needs the same CPU time loaded or not: it only waits for its share of
the cores (on a machine of its own, 2 busy loops on 2 cores leave it 2/3 of a core: 1.5×).
With a thread per core the busy loops stall every op's barrier: 4× the CPU time, 11.6× the
wall time. Every PDF had 8 pages.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Small, fixed work: the same steps however noisy the machine (no adaptive timing rounds).
SMALL_MLP = (
    "+model=mlp",
    "budget.examples=512",
    "budget.seeds=[0]",
    "budget.eval_every=256",
    "larger_batch.max_batch_size=256",
    "parity.steps=4",
    "timing.target_ci_half_width_pp=null",
    "timing.measured_steps=20",
    "timing.warmup_steps=2",
    "report.sign=false",
)


def _spin() -> None:
    while True:
        pass


def cpus() -> int:
    """CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pdf_pages(path: Path) -> int | None:
    """Pages of a PDF (pyhanko's reader, installed with reportgen), None when there is no PDF."""
    if not path.exists():
        return None
    from pyhanko.pdf_utils.reader import PdfFileReader

    with path.open("rb") as f:
        return int(PdfFileReader(f).root["/Pages"]["/Count"])


def one_run(threads: str, overrides: list[str], timeout: float) -> dict:
    """Wall time (s), exit code and page count of one report in a fresh folder."""
    out = Path(tempfile.mkdtemp(prefix="loaded-machine-"))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "reportgen", *SMALL_MLP, f"threads={threads}", *overrides, f"hydra.run.dir={out}"]
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        code, seconds = done.returncode, time.perf_counter() - start
    except subprocess.TimeoutExpired:
        code, seconds = None, float("inf")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "seconds": seconds,
        "cpu": cpu,
        "code": code,
        "pages": pdf_pages(out / "report.pdf"),
        "load_before": load,
        "dir": out,
    }


def main() -> None:
    """Parse the arguments, run the reports (idle and loaded alternating), print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is stopped")
    parser.add_argument("--repeat", type=int, default=1, help="idle/loaded pairs per setting; the table shows medians")
    parser.add_argument("--threads", default="auto,all", help="settings to compare, comma-separated (all = every CPU)")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    args = parser.parse_args()
    n = cpus()
    settings = [
        (str(n), f"all cores ({n})") if t == "all" else (t, "default (auto)" if t == "auto" else f"threads={t}")
        for t in args.threads.split(",")
    ]
    results: dict[tuple[str, str], list[dict]] = {}
    print(f"{n} CPUs; uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}", flush=True)
    for threads, label in settings:
        for _ in range(args.repeat):
            for state in ("idle", "loaded"):
                spinners = [mp.Process(target=_spin, daemon=True) for _ in range(n)] if state == "loaded" else []
                for p in spinners:
                    p.start()
                try:
                    time.sleep(2 if spinners else 0)
                    r = one_run(threads, args.overrides, args.timeout)
                    results.setdefault((threads, state), []).append(r)
                    print(
                        f"  {label:<16} {state:<7} {r['seconds']:8.1f} s wall  {r['cpu']:7.1f} s CPU  exit {r['code']}  "
                        f"pages {r['pages']}  load before {r['load_before']:.2f}",
                        flush=True,
                    )
                finally:
                    for p in spinners:
                        p.terminate()
                    for p in spinners:
                        p.join()
    print(
        f"\n{'threads':<16} {'idle s':>8} {'loaded s':>9} {'loaded/idle':>12} {'pages idle/loaded':>18}"
        + ("   (medians)" if args.repeat > 1 else "")
    )
    ratios = {}
    for threads, label in settings:
        idle = statistics.median(r["seconds"] for r in results[(threads, "idle")])
        loaded = statistics.median(r["seconds"] for r in results[(threads, "loaded")])
        ratios[threads] = loaded / idle if 0 < idle < float("inf") else float("nan")
        pages = "/".join(",".join(str(r["pages"]) for r in results[(threads, s)]) for s in ("idle", "loaded"))
        print(f"{label:<16} {idle:>8.1f} {loaded:>9.1f} {ratios[threads]:>11.2f}× {pages:>18}")
    if "auto" in ratios:
        print(
            f"\ntarget: loaded/idle ≤ 2× with the default threads: {'met' if ratios['auto'] <= 2 else 'MISSED'} "
            f"({ratios['auto']:.2f}×)"
        )


if __name__ == "__main__":
    main()
