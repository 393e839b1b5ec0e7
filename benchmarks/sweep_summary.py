"""Benchmark: how long the end-of-sweep summary takes for a 100-job sweep (issue 10: about 20 s).

Runs one tiny real job (``+model=ffn``, slow checks cut down) as a 1-job multirun, copies its
folder into ``--jobs`` job folders with perturbed costs (saved bytes and overhead ratio, so
the scatter and the Pareto front have something to sort) and a few failing jobs, then times
``reportgen.sweep.summarize`` (read every job, summary.csv/json/html/pdf) on them.

    python benchmarks/sweep_summary.py                 # 100 jobs, unsigned
    python benchmarks/sweep_summary.py --jobs 200 --sign-key ~/.config/reportgen/signing-key.pem
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reportgen.results import frame_from_json, frame_to_json
from reportgen.sweep import summarize

TINY = [
    "+model=ffn",
    "budget.examples=32",
    "budget.seeds=[0]",
    "larger_batch.enabled=false",
    "timing.measured_steps=3",
    "timing.target_ci_half_width_pp=null",
    "timing.max_measure_seconds=1",
    "report.sign=false",
    "report.pdf=false",
]


def make_sweep(root: Path, jobs: int, seed: int = 0) -> Path:
    """A sweep folder of ``jobs`` job folders made from one real job, costs perturbed."""
    seed_dir = root / "seed"
    proc = subprocess.run(
        [sys.executable, "-m", "reportgen", "-m", *TINY, f"hydra.sweep.dir={seed_dir}"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    if proc.returncode:
        raise SystemExit(f"the seed job failed:\n{proc.stdout}\n{proc.stderr}")
    template = seed_dir / "0"
    frame = frame_from_json((template / "results.json").read_text())
    record = json.loads((template / "job.json").read_text())
    rng = random.Random(seed)
    sweep = root / "sweep"
    sweep.mkdir()
    shutil.copy(seed_dir / "multirun.yaml", sweep / "multirun.yaml")
    for job in range(jobs):
        folder = sweep / str(job)
        shutil.copytree(template, folder)
        (folder / "job.json").unlink()
        varied = frame.copy()
        saved = (
            (varied.metric == "saved_activation_bytes")
            & (varied.variant == "recompute")
            & (varied["item"] == "saved activations (total)")
        )
        kept = rng.uniform(0.1, 0.9)  # recompute keeps this share of the plain twin's saved bytes
        plain_bytes = float(
            varied.loc[
                (varied.metric == "saved_activation_bytes")
                & (varied.variant == "plain")
                & (varied["item"] == "saved activations (total)"),
                "value",
            ].iloc[0]
        )
        varied.loc[saved, "value"] = plain_bytes * kept
        if "role" in varied.columns:  # the saving row that reportgen.report.render.headline_costs reads
            saving = varied.role == "saving"
            varied.loc[saving, ["value", "recompute_bytes", "saving_bytes"]] = [
                1 - kept,
                plain_bytes * kept,
                plain_bytes * (1 - kept),
            ]
        ratio = rng.uniform(1.0, 1.6)
        overhead = (varied.metric == "overhead_ratio") & (varied["item"] == "overhead")
        varied.loc[overhead, ["value", "ci_low", "ci_high"]] = [ratio, ratio - 0.05, ratio + 0.05]
        code = 1 if job % 10 == 3 else 0
        if code:
            varied.loc[varied.check == "gradient parity", "status"] = "FAIL"
        (folder / "results.json").unlink()
        (folder / "results.json").write_text(frame_to_json(varied))
        overrides = [f"recompute={rng.choice(['non_reentrant', 'reentrant', 'selective'])}", f"seed={job}"]
        (folder / "job.json").write_text(
            json.dumps(
                {**record, "job": job, "overrides": overrides, "exit_code": code, "verdict": "FAIL" if code else "PASS"}
            )
        )
    return sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--sign-key", help="private key: also time signing the summary")
    parser.add_argument("--keep", help="copy the sweep folder here afterwards, to look at the summary")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sweep = make_sweep(Path(tmp), args.jobs)
        start = time.perf_counter()
        frame, code = summarize(sweep, sign=bool(args.sign_key), key_path=args.sign_key, pdf=True)
        seconds = time.perf_counter() - start
        from pyhanko.pdf_utils.reader import PdfFileReader

        with open(sweep / "summary.pdf", "rb") as handle:
            pages = int(PdfFileReader(handle, strict=False).root["/Pages"]["/Count"])
        print(
            f"{args.jobs} jobs: summary (csv, json, html, pdf{', signed' if args.sign_key else ''}) in {seconds:.1f} s; "
            f"{len(frame)} summary rows; pdf {(sweep / 'summary.pdf').stat().st_size / 1024:.0f} KiB, {pages} pages; "
            f"exit code {code}"
        )
        if args.keep:
            shutil.copytree(sweep, args.keep)


if __name__ == "__main__":
    main()
