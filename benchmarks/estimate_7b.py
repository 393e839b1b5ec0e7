"""Speed and peak memory of the GPU-free estimate for a 7B-shaped layer stack at sequence 4096.

Shape (LLaMA-7B-like widths on reportgen's gpt): width h = 4096, 32 layers, a = 32 heads,
sequence s = 4096, batch b = 1, bfloat16 (the paper's 16-bit setting). Everything is built
under ``FakeTensorMode``: about 6.5e9 parameters and tens of GiB of activations are described,
none allocated. Prints the wall time of the estimate, the process's peak RSS before and after,
the plain/recompute totals and the per-layer figure beside Korthikanti et al. 2022.

Usage (from the repository root)::

    .venv/bin/python benchmarks/estimate_7b.py                       # defaults above
    .venv/bin/python benchmarks/estimate_7b.py dtype=float32 seq=2048
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import compose_config

from reportgen.commands.run import prepare
from reportgen.memory.estimate import (
    dropout_mask_bytes,
    estimate_saved_activations,
)


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str]) -> dict:
    """Estimate once at the 7B shape (``key=value`` arguments override width/depth/heads/seq/batch/dtype)."""
    shape = {"width": 4096, "depth": 32, "heads": 32, "seq": 4096, "batch": 1, "dtype": "bfloat16"}
    for arg in argv:
        key, _, value = arg.partition("=")
        shape[key] = value if key == "dtype" else int(value)
    setup = prepare(compose_config("+model=gpt", "device=cpu"))
    overrides = {
        "model": {"width": shape["width"], "depth": shape["depth"], "heads": shape["heads"]},
        "task": {"block_size": shape["seq"]},
        "batch_size": shape["batch"],
        "dtype": shape["dtype"],
    }
    rss_before = peak_rss_mib()
    start = time.perf_counter()
    est = estimate_saved_activations(setup, overrides)
    seconds = time.perf_counter() - start
    t = est.transformer
    e = t.element_bytes
    m = dropout_mask_bytes(setup.device, e)
    sbh, as2b = t.s * t.b * t.h, t.a * t.s * t.s * t.b
    result = {
        "shape": shape,
        "estimate_s": round(seconds, 2),
        "peak_rss_mib_before": round(rss_before, 1),
        "peak_rss_mib_after": round(peak_rss_mib(), 1),
        "plain_total_gib": round(est.plain.total_bytes / 2**30, 2),
        "recompute_total_gib": round(est.recompute.total_bytes / 2**30, 2),
        "per_layer_plain_bytes": est.per_layer("plain"),
        "per_layer_recompute_bytes": est.per_layer("recompute"),
        "korthikanti_16bit_bytes": t.formula_bytes(2, 1),
        "formula_at_e_m_bytes": t.formula_bytes(e, m),
        "e": e,
        "m": m,
        "per_layer_plain_in_sbh_units_after_as2b": (est.per_layer("plain") - (2 * e + m) * as2b) / sbh,
        "full_recompute_2sbh_bytes": t.full_recompute_bytes(e),
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
