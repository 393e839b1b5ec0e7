#!/usr/bin/env bash
# The GPU lines of the scale issue, as one prepared script for a person with one GPU (issue 33).
#
#   bash benchmarks/device_check.sh [OUT]      # on a CUDA machine, from the repository root
#   DRY=1 bash benchmarks/device_check.sh      # the same steps on this machine's CPU, tiny shapes
#
# On a GPU machine without network whose Python lacks hydra-core, WeasyPrint, pyHanko and Pango:
# bundle them here with ../shared/device/fetch.sh (into .device-bundle/), copy the checkout there and
# run `. .device-bundle/setup.sh && bash benchmarks/device_check.sh`.
#
# Every step runs under `timeout` (stopped with SIGABRT under `python -X faulthandler`, so a step that
# hangs prints where); its output lands in OUT/<step>.log and, for the reports, OUT/<step>.json
# (benchmarks/harness_overhead.py: wall, model work, their ratio, factory calls, peak RSS, the run's
# CUDA peaks). The last lines print one summary line per step. Steps (all within about 12 minutes
# on one H200):
#   gpt        +model=gpt, device auto: wall
#   1b         Llama-3.2-1B shape (conf/examples/llama3_2_1b), seq 2048, batch 4, bf16, sdpa: the full
#              default checklist; wall <= 5 min and <= 1.5 x its model work; report pages
#   1b_planned the plan's recompute file for the 1B shape (reportgen.plan ... memory_gib=...) run through
#              the checks: page 1's planned vs measured peak
#   8b         Llama-3-8B shape (conf/plan/llama3_8b), seq 4096, batch 1, bf16: gradient, step and
#              memory checks; the run's device peak against the plan's single-twin reserved bound
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/device-check/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
PY=${PY:-python3}
command -v "$PY" >/dev/null || PY=python
if [ -x .venv/bin/python ] && [ -z "${PY_SET:-}" ]; then PY=.venv/bin/python; fi

if [ -n "${DRY:-}" ]; then  # the same steps, tiny, on the CPU: proves the script before device time is spent
  ONE_B=conf/examples/hf_causal_lm; EIGHT_B=conf/examples/hf_causal_lm; SEQ1=32; SEQ8=32; BATCH1=2
  DEV="device=cpu dtype=float32 model.attn_implementation=eager"; GIB=4; LIMIT=300; PLAN_DTYPE=fp32
else
  ONE_B=conf/examples/llama3_2_1b; EIGHT_B=conf/plan/llama3_8b; SEQ1=2048; SEQ8=4096; BATCH1=4
  DEV="device=cuda dtype=bfloat16 model.attn_implementation=sdpa"; GIB=139; LIMIT=330; PLAN_DTYPE=bf16
fi
LM="+model=hf_causal_lm report.sign=false"
SHORT="timing.enabled=false budget.enabled=false larger_batch.enabled=false parity.steps=1"

step() {  # step NAME SECONDS CMD...: run CMD under a time limit, log in OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout -s ABRT "$limit" "$@" >"$OUT/$name.log" 2>&1
  local code=$?
  echo "$name exit=$code wall=$((SECONDS - start))s (limit ${limit}s)" | tee -a "$OUT/summary.txt"
}

bench() {  # bench NAME SECONDS OVERRIDES...: one report through benchmarks/harness_overhead.py
  local name=$1 limit=$2; shift 2
  step "$name" "$limit" "$PY" -X faulthandler benchmarks/harness_overhead.py --json "$OUT/$name.json" "$@"
}

"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')" | tee "$OUT/summary.txt"

if [ -n "${DRY:-}" ]; then
  bench gpt 300 +model=ffn report.sign=false device=cpu
else
  bench gpt 240 +model=gpt report.sign=false
fi
bench 1b "$LIMIT" $LM model.config=$ONE_B task.block_size=$SEQ1 parity.batch_size=$BATCH1 $DEV
# The plan's policies at the 1B shape, then a budget 10 % under the no-recompute bound, so a recompute
# policy is chosen and written as OUT/plan_1b/recompute/planned.yaml.
step 1b_plan_all 120 "$PY" -m reportgen.plan $ONE_B seq=$SEQ1 batch=$BATCH1 dtype=$PLAN_DTYPE pdf=false \
  out="$OUT/plan_1b_all"
GIB=$("$PY" - "$OUT/plan_1b_all/plan.csv" <<'PICK' 2>/dev/null || echo "$GIB"
import csv, sys  # halfway between the smallest recompute bound and the no-recompute bound, before the 5 % margin
bounds = {r["policy"]: float(r["bytes"]) for r in csv.DictReader(open(sys.argv[1])) if r["component"] == "reserved upper bound"}
low = min(v for k, v in bounds.items() if k != "none")
print(f"{(low + bounds['none']) / 2 / 0.95 / 2**30:.6f}")
PICK
)
step 1b_plan 120 "$PY" -m reportgen.plan $ONE_B seq=$SEQ1 batch=$BATCH1 dtype=$PLAN_DTYPE memory_gib=$GIB \
  pdf=false out="$OUT/plan_1b"
bench 1b_planned 180 --config-dir "$OUT/plan_1b" $LM model.config=$ONE_B task.block_size=$SEQ1 \
  parity.batch_size=$BATCH1 $DEV recompute=planned $SHORT
step 8b_plan 120 "$PY" -m reportgen.plan $EIGHT_B seq=$SEQ8 batch=1 dtype=$PLAN_DTYPE pdf=false out="$OUT/plan_8b"
bench 8b 300 $LM model.config=$EIGHT_B task.block_size=$SEQ8 parity.batch_size=1 $DEV $SHORT report.pdf=false

"$PY" - "$OUT" <<'EOF' | tee -a "$OUT/summary.txt"
"""One line per report: wall, model work, ratio, factory calls, peaks, pages; the 8B peak against its plan."""
import csv, json, sys
from pathlib import Path

from pyhanko.pdf_utils.reader import PdfFileReader

out = Path(sys.argv[1])
for name in ("gpt", "1b", "1b_planned", "8b"):
    path = out / f"{name}.json"
    if not path.exists():
        print(f"{name}: no result (see {name}.log)")
        continue
    r = json.loads(path.read_text())
    pdf = Path(r["out_dir"]) / "report.pdf"
    pages = int(PdfFileReader(pdf.open("rb")).root["/Pages"]["/Count"]) if pdf.exists() else None
    print(f"{name}: exit {r['exit_code']}, wall {r['wall_s']} s, model work {r['model_work_s']} s "
          f"(x{r['wall_over_model_work']}), factory calls {r['factory_calls']}, peak RSS {r['peak_rss_gib']} GiB, "
          f"CUDA run peak allocated/reserved {r.get('cuda_run_peak_gib')}, pages {pages}")
    results = Path(r["out_dir"]) / "results.json"
    rows = json.loads(results.read_text()) if results.exists() else []
    for row in rows:
        if row.get("metric") == "planned_peak_difference_share":
            print(f"  planned vs measured ({row.get('status')}): {row.get('detail')}")
        if row.get("item") == "CUDA step peak":
            print(f"  CUDA step peak {row.get('variant')} {row.get('metric')}: {row.get('value') / 2**30:.2f} GiB")
plan, run = out / "plan_8b" / "plan.csv", out / "8b.json"
if plan.exists() and run.exists():
    bounds = {row["policy"]: float(row["bytes"]) / 2**30 for row in csv.DictReader(plan.open())
              if row["component"] == "reserved upper bound"}
    peak = json.loads(run.read_text()).get("cuda_run_peak_gib") or [None, None]
    if "none" in bounds and peak[1] is not None:  # the plain twin, the larger of the two single-twin bounds
        print(f"8b: the run's reserved peak {peak[1]} GiB vs the plan's single-twin reserved bound "
              f"{bounds['none']:.2f} GiB (plain twin; full recompute {bounds.get('full', float('nan')):.2f} GiB): "
              f"x{peak[1] / bounds['none']:.2f} (target <= 1.3)")
EOF
echo "device check: $OUT"
