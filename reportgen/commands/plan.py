"""``python -m reportgen.plan CONFIG seq=8192 batch=2 dtype=bf16 world_size=8 strategy=fsdp memory_gib=80``
(docs/plan.md): per recompute policy the step of a Hugging Face ``config.json`` is traced on fake tensors and
scaled (:mod:`reportgen.plan.trace`), composed per rank (:mod:`reportgen.plan.rank`) and printed as a Pareto table;
with ``memory_gib=`` the cheapest policy that fits is written as ``OUT/recompute/planned.yaml`` for
``--config-dir OUT ... recompute=planned``, beside ``OUT/plan.csv``. Bad input: one line, exit 2, nothing written.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from reportgen.errors import ExitCode, UsageError
from reportgen.memory.step_peak import format_bytes
from reportgen.plan.args import PlanArgs, PlanError, check_positions, load_config, parse_args
from reportgen.plan.model import layer_count, layer_prefix
from reportgen.plan.page import html_text, pdf_bytes
from reportgen.plan.policies import POLICIES, Policy, by_name, recompute_file
from reportgen.plan.rank import RankPlan, compose, largest_batch
from reportgen.plan.trace import PHASES, scaled_figures

#: Columns of plan.csv: one row per policy, phase and component (bytes in B).
CSV_COLUMNS = ("policy", "phase", "component", "bytes", "gib")


def plan_policies(
    args: PlanArgs, log: Callable[[str], None] = lambda line: None, announce: Callable[[], None] = lambda: None
) -> tuple[Any, list[RankPlan], int]:
    """Trace and compose every policy asked for.

    Args:
        args: the plan's words.
        log: takes the progress lines (a warning about the config, then one line per policy traced).
        announce: called once the config is read and accepted, before ``log`` is first called (the header).

    Returns:
        ``(config, [RankPlan per policy], traced steps)``.

    Raises:
        UsageError: the config or a trace cannot be planned (PlanError, SetupError).
    """
    config = load_config(args.config)
    warning = check_positions(config, args)
    announce()
    if warning:
        log(f"reportgen.plan: {warning}")
    chosen = [by_name(args.recompute)] if args.recompute else list(POLICIES)
    plans, traces, start = [], 0, time.perf_counter()
    for policy in chosen:
        figures, n = scaled_figures(config, policy, args, args.batch)
        plans.append(compose(figures, args, policy.name))
        traces += n
        if args.largest_batch:
            following, n = scaled_figures(config, policy, args, args.batch + 1)
            plans[-1].largest_batch = largest_batch(plans[-1], compose(following, args, policy.name), args)
            traces += n
        log(
            f"  {policy.name}: {format_bytes(plans[-1].reserved_upper)} reserved upper bound per rank "
            f"({time.perf_counter() - start:.1f} s)"
        )
    return config, plans, traces


def what_is_planned(args: PlanArgs) -> str:
    """The first line of the console: what is planned (config, shape, precision, attention, ranks, strategy,
    optimizer, budget)."""
    budget = f", budget {args.memory_gib:g} GiB - {args.safety_margin:.0%} margin" if args.memory_gib else ""
    return (
        f"{args.config}: seq={args.seq} batch={args.batch} dtype={args.dtype_name} attn={args.attn} "
        f"world_size={args.world_size} strategy={args.strategy} optim={args.optim}{budget}"
    )


def choose(plans: list[RankPlan], args: PlanArgs) -> RankPlan | None:
    """The policy with the fewest FLOPs whose upper bound + margin fits (None: none fits, or no budget)."""
    fitting = [p for p in plans if p.fits(args)]
    return min(fitting, key=lambda p: (p.flops, p.reserved_upper)) if fitting else None


def aligned(rows: list[list[str]], right: set[int]) -> list[str]:
    """``rows`` (the first one the header) as lines of columns as wide as their widest cell, two spaces
    apart, so that no value runs into the next whatever its width; columns ``right`` right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
        for row in rows
    ]


def table(plans: list[RankPlan], args: PlanArgs, chosen: RankPlan | None) -> str:
    """The console table: per policy peak, bound, extra FLOPs vs no recompute (which count: its footnote), fits;
    Pareto-optimal marked."""
    largest = args.largest_batch
    header = ["recompute", "tensor peak", "reserved <=", "peak phase", "extra FLOPs*"] + ["largest batch"] * largest
    rows = [header + ["fits"]]
    for p in plans:
        extra = f"{p.recompute_flops / (p.flops - p.recompute_flops):+.1%}"
        dominated = any(q.flops <= p.flops and q.reserved_upper < p.reserved_upper for q in plans)
        fits = {True: "yes", False: "no", None: "-"}[p.fits(args)]
        mark = " <- chosen" if p is chosen else ("" if dominated else " (Pareto)")
        cells = [p.policy, format_bytes(p.tensor_peak), format_bytes(p.reserved_upper), p.peak_phase, extra]
        rows.append(cells + [str(p.largest_batch)] * largest + [fits + mark])
    note = (
        "* extra FLOPs of recompute: matmuls and attention only (torch's FlopCounterMode); recomputed element-wise "
        "ops (norms, activations, rotary) are not counted, so a policy that recomputes only those shows +0.0%"
    )
    return "\n".join([*aligned(rows, right={1, 2, 4, 5} if largest else {1, 2, 4}), note])


def timeline(plan: RankPlan) -> str:
    """The chosen (or only) policy's step by phase, per component."""
    rows = [
        [f"  {phase}", format_bytes(sum(plan.timeline[phase].values())), "="]
        + [" + ".join(f"{k} {format_bytes(v)}" for k, v in plan.timeline[phase].items())]
        for phase in PHASES
        if phase in plan.timeline
    ]
    return "\n".join([f"per-rank step of {plan.policy}, by phase:", *aligned(rows, right={1})])


def csv_text(plans: list[RankPlan]) -> str:
    """plan.csv: per policy, phase and component, then each policy's tensor peak and reserved bound."""
    import pandas as pd

    rows = [(p.policy, ph, c, b) for p in plans for ph, parts in p.timeline.items() for c, b in parts.items()]
    rows += [
        (p.policy, p.peak_phase, k, v)
        for p in plans
        for k, v in (("tensor peak", p.tensor_peak), ("reserved upper bound", p.reserved_upper), ("flops", p.flops))
    ]
    frame = pd.DataFrame([(a, b, c, int(round(d)), round(d / 2**30, 4)) for a, b, c, d in rows], columns=CSV_COLUMNS)
    return frame.to_csv(index=False)


def new_folder(out: Path | None, now: dt.datetime) -> Path:
    """``out`` (which must not exist) or ``outputs/plans/<date>/<time>/`` (suffix -1, -2 ... if taken).

    Raises:
        PlanError: ``out`` exists already (a plan is never overwritten).
    """
    if out is not None:
        if out.exists():
            raise PlanError(f"out={str(out)!r} exists; give a new folder (plans are never overwritten)")
        return out
    base = Path("outputs") / "plans" / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")
    folder, n = base, 0
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


def write_files(folder: Path, files: dict[str, str | bytes]) -> None:
    """Write ``{relative path: text}`` into the new ``folder``, all or nothing (a staging folder renamed).

    Raises:
        PlanError: the folder cannot be written.
    """
    staging = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        staging.chmod(0o755)
        for name, text in files.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(text.encode() if isinstance(text, str) else text)
        os.rename(staging, folder)
    except OSError as exc:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise PlanError(
            f"cannot write the plan to {str(folder)!r} ({exc.strerror or exc}); give a writable out="
        ) from exc


def planned_file(policy: Policy, plan: RankPlan, args: PlanArgs, config: Any, folder: Path) -> str:
    """The recompute config file's text for the chosen policy, its save list as the chosen ``attn`` runs it
    (:meth:`Policy.for_attn`); the command in its header runs the model with that ``attn``."""
    runs = policy.for_attn(args.attn)
    header = [
        f"python -m reportgen --config-dir {folder} +model=hf_causal_lm model.config={args.config} "
        f"model.attn_implementation={args.attn} recompute=planned",
        f"planned by python -m reportgen.plan: {policy.name} ({policy.label}); per-rank tensor peak "
        f"{format_bytes(plan.tensor_peak)}, reserved <= {format_bytes(plan.reserved_upper)} at seq={args.seq} "
        f"batch={args.batch} world_size={args.world_size} strategy={args.strategy}",
    ]
    if runs.save_ops != policy.save_ops:
        header.append(f"attn={args.attn} never calls sdpa's attention kernels: they are left out of save_ops")
    return recompute_file(runs, layer_count(config), layer_prefix(config, args.dtype, args.attn), header)


def main(argv: Sequence[str] | None = None) -> int:
    """Plan, print, write. Returns 0 (written), 2 (bad input: one line, nothing written), 70
    (reportgen's own bug, one line), 130 (Ctrl-C)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)
        folder = new_folder(args.out, dt.datetime.now())
        start = time.perf_counter()
        config, plans, traces = plan_policies(
            args,
            log=lambda line: print(line, file=sys.stderr, flush=True),
            announce=lambda: print(what_is_planned(args), flush=True),
        )
        chosen = choose(plans, args)
        created = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
        seconds = time.perf_counter() - start
        meta = {"config": str(args.config), "traces": traces, "seconds": seconds, "created": created}
        files: dict[str, str | bytes] = {"plan.csv": csv_text(plans), "plan.html": html_text(plans, args, chosen, meta)}
        if args.pdf:
            files["plan.pdf"] = pdf_bytes(str(files["plan.html"]), created, str(files["plan.csv"]))
        if chosen is not None and chosen.policy != "none":
            files["recompute/planned.yaml"] = planned_file(by_name(chosen.policy), chosen, args, config, folder)
        write_files(folder, files)
    except UsageError as exc:  # PlanError, or SetupError from the config or the model (models/hf)
        print(f"reportgen.plan: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print("reportgen.plan: interrupted; nothing written", file=sys.stderr)
        return ExitCode.SIGINT
    except Exception as exc:  # noqa: BLE001 - reportgen's own bug: one line, not a traceback
        reason = " ".join(str(exc).split())[:300]
        print(
            f"reportgen.plan: internal error ({type(exc).__name__}: {reason}); nothing written; please report it "
            "with the command line",
            file=sys.stderr,
        )
        return ExitCode.BUG
    print(f"planned in {time.perf_counter() - start:.1f} s ({traces} traced steps)")
    print(table(plans, args, chosen))
    print(timeline(chosen or plans[-1]))
    if args.memory_gib and chosen is None:
        print("no policy fits: give a smaller batch= or seq=, more ranks, or a larger memory_gib=")
    print(f"wrote {', '.join(str(folder / n) for n in files)}")
    return 0


def console_main() -> None:
    """``python -m reportgen.plan`` and ``reportgen-plan``: :func:`main`, then exit without the interpreter's
    teardown of torch and transformers (about 0.9 s of CPU, a sixth of a plan's run): every file is written
    and closed by then, and the console is flushed here."""
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
