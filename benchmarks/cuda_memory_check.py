"""Device check (issues 15 and 19): the memory check end to end on CUDA, as a CUDA team runs it.

    python benchmarks/cuda_memory_check.py            # on a CUDA machine, from the repository root
    DEV=cpu python benchmarks/cuda_memory_check.py    # the same code on CPU

For the built-in ``mlp`` and ``gpt`` and the 6-layer stack of tests/user_models/peak.py (one region
around the stack, one region per layer) it composes the real config, runs ``twins.prepare.prepare`` and the
memory check, and prints every row: saved bytes, the tracker's step peak of both twins and, on
CUDA, ``max_memory_allocated`` / ``max_memory_reserved`` of the same step beside it. Exits 1 when
a row is ERROR or when an allocator peak is below the tracker's (it never holds less than the
live tensors).
"""

import os
import sys
import time

sys.path[:0] = [".", "tests"]
from hydra import compose, initialize_config_dir

from reportgen.checks.memory.check import CHECK
from reportgen.config import register_configs
from reportgen.paths import conf_dir
from reportgen.twins.prepare import prepare  # no signing stack: a device image may lack cryptography

DEV = os.environ.get("DEV", "cuda")
CASES = [
    ("mlp", ["+model=mlp"]),
    ("gpt", ["+model=gpt"]),
    ("stack, one region", ["+model=peak_stack", "recompute.targets=[Stack]"]),
    ("stack, per layer", ["+model=peak_stack", "recompute.targets=[Layer]"]),
]


def main() -> int:
    register_configs()
    bad = []
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for name, overrides in CASES:
            search = [f"hydra.searchpath=[file://{os.path.abspath('tests/user_conf')}]"]
            cfg = compose("config", overrides=[*search, *overrides, f"device={DEV}", "report.sign=false"])
            start = time.perf_counter()
            try:
                rows = CHECK.run(prepare(cfg))
            except Exception as exc:  # noqa: BLE001 - a device check reports, it does not stop
                print(f"{name}: raised {type(exc).__name__}: {exc}", flush=True)
                bad.append(name)
                continue
            print(f"== {name} ({time.perf_counter() - start:.1f} s)", flush=True)
            for row in rows:
                extra = {k: v for k, v in row.extra.items() if "bytes" in k or "ratio" in k or k in ("phase", "module")}
                print(
                    f"  {row.status:<5} {row.item:<40.40} {row.variant:<10} {row.metric:<28} {row.value!r:<14} "
                    f"{row.detail[:150]} {extra if extra else ''}",
                    flush=True,
                )
                if row.status == "ERROR":
                    bad.append(f"{name}: {row.item}")
                allocated, tracked = row.extra.get("peak_allocated_bytes"), row.extra.get("peak_bytes", row.value)
                if allocated is not None and row.metric == "peak_live_bytes" and allocated < tracked:
                    bad.append(f"{name}: allocator {allocated} B < tracker {tracked} B")
    print("BAD:" if bad else "OK: every row measured; allocator peaks >= tracker peaks", bad if bad else "")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
