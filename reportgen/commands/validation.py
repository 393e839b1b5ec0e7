"""Values the schema's types cannot refuse: enums, finite ranges, known check names.

The dataclass schema (``reportgen.config``) refuses wrong types while Hydra composes; this
module, the one validator, refuses wrong *values* right after composing, before any folder is written or
model built (``rundir.RunFolderGuard.on_run_start``; ``cli.run_job`` again for each sweep job and each
torchrun/srun rank; a spawned rank builds from the config its launcher accepted): ``build_setup`` only builds.
NaN is refused everywhere: it compares false with every bound, so a NaN deadline would
otherwise pass "within the deadline of nan".
"""

from __future__ import annotations

import difflib
import importlib
import math
import re
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from reportgen.checks import flagged_names, sections
from reportgen.commands.overrides import (
    FREE_FORM,
    added_key_problem,
    schema_groups,
    top_level_settings,
    unknown_key_problem,
)
from reportgen.config import (
    DIST_GRADIENT_PARITY,
    DIST_STEP_PARITY,
    DIST_TRAJECTORY,
    GRADIENT_PARITY,
    LARGER_BATCH,
    STATE_PARITY,
    STEP_PARITY,
    RecomputeMethod,
)
from reportgen.distributed.mesh import dp_degree
from reportgen.distributed.pipeline import pipeline_problems
from reportgen.distributed.settings import DTYPES, distributed_setting_problems
from reportgen.threads import threads_problem

#: A claim must require at least one of these (DESIGN.md: no empty claims).
PARITY_CHECKS = (GRADIENT_PARITY, STEP_PARITY, STATE_PARITY, DIST_GRADIENT_PARITY, DIST_STEP_PARITY, DIST_TRAJECTORY)


def check_names() -> tuple[str, ...]:
    """Names ``verdict.required`` may use: every registered check's name except the flagged
    experiments (reportgen/checks/__init__.py)."""
    return tuple(s.name for s in sections() if s.name not in flagged_names())


DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
DEVICES = "auto, cpu, cuda, cuda:N"

#: ``(setting, lower bound, bound included, may be null)``: finite numbers with a lower bound.
BOUNDED = [
    ("parity.rtol", 0.0, True, True),
    ("parity.atol", 0.0, True, True),
    ("parity.rounding_factor", 1.0, True, False),
    ("budget.metric_tolerance", 0.0, True, False),
    ("timing.max_overhead_ratio", 0.0, False, True),
    ("timing.max_step_time_ms", 0.0, False, True),
    ("timing.target_ci_half_width_pp", 0.0, False, True),
    ("timing.max_measure_seconds", 0.0, False, False),
    ("budget.max_steps_factor", 1.0, True, False),
    ("budget.metric_rtol", 0.0, True, False),
    ("memory.negligible_saving_share", 0.0, True, False),
    ("memory.min_peak_saving_share", 0.0, False, False),
    ("parity.batch_size", 1, True, False),
    ("parity.steps", 1, True, False),
    ("budget.examples", 1, True, False),
    ("budget.batch_size", 1, True, False),
    ("timing.measured_steps", 1, True, False),
    ("timing.warmup_steps", 0, True, False),
    ("memory.warm_steps", 0, True, False),
    ("checks.timeout_s", 0.0, False, True),
    ("checks.max_rss_gib", 0.0, False, True),
    ("run.max_estimated_minutes", 0.0, False, True),
    ("distributed.world_size", 1, True, False),
    ("distributed.timeout_s", 0.0, False, False),
]
#: ``precision.autocast`` values (null = off).
AUTOCASTS = (None, "bf16", "fp16")


def _number_problem(name: str, value: Any, low: float, inclusive: bool, nullable: bool) -> str | None:
    """The problem with one bounded setting, or None when it is fine."""
    if value is None:
        return None if nullable else f"{name} must be set (a finite number)"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name}={value!r} must be a number"
    rule = f"{'>=' if inclusive else '>'} {low:g}"
    if not math.isfinite(value):
        return f"{name}={value} must be a finite number {rule}" + (" (or null for none)" if nullable else "")
    if value < low or (value == low and not inclusive):
        return f"{name}={value:g} must be {rule}"
    return None


#: Module names of earlier releases that configs may still name in a ``_target_`` or ``recompute.enable``,
#: and where that code lives now (docs/moves.md).
MOVED_MODULES = {
    "reportgen.hf_masked": "reportgen.models.hf.masked",
    "reportgen.hf_auto": "reportgen.models.hf.auto",
    "reportgen.hf": "reportgen.models.hf",
}


def moved_module_problems(cfg: DictConfig) -> list[str]:
    """One problem per setting that names a moved module (``model._target_=reportgen.hf_auto.causal_lm``),
    naming the new name (``reportgen.models.hf.auto.causal_lm``)."""
    found = []
    for name in ("model._target_", "task._target_", "recompute.enable"):
        value = OmegaConf.select(cfg, name, default=None, throw_on_resolution_failure=False)
        if not isinstance(value, str):
            continue
        for old, new in MOVED_MODULES.items():
            if value == old or value.startswith(old + "."):
                found.append(f"{name}={value} names a module that moved: use {name}={new}{value[len(old) :]}")
                break
    return found


def config_problems(cfg: DictConfig) -> str:
    """Every bad value in a composed config (the job's; ``hydra`` node optional), as one paragraph naming each
    setting and its rule: ``"setting=value must be ...; ..."``, or ``""`` when every value is allowed."""
    names = [name for name, *_ in BOUNDED] + ["dtype", "recompute.determinism_check", "larger_batch.lr_scaling"]
    names += ["device", "verdict.required", "budget.seeds", "larger_batch.seeds", "precision.autocast"]
    names += ["memory.peak_on_miss", "threads", "distributed.backend", "distributed.start_method", "compile.enabled"]
    names += ["recompute.mode", "recompute.method", "distributed.budget_seeds", "budget.enabled", "distributed.mesh"]
    names += ["forward_seed", *TASK_SIZES, "distributed.strategy", "distributed.fsdp1.sync_module_states"]
    names += ["distributed.world_size"]
    values, problems = {}, unknown_setting_problems(cfg)
    for name in names:
        try:
            values[name] = _select(cfg, name)
        except OmegaConfBaseException as exc:  # e.g. an interpolation ${...} to a key that does not exist
            problems.append(f"{name} cannot be resolved ({str(exc).splitlines()[0]})")
    problems += [
        p
        for name, low, inclusive, nullable in BOUNDED
        if name in values and (p := _number_problem(name, values[name], low, inclusive, nullable))
    ]
    enums = [
        ("dtype", DTYPES),
        ("recompute.determinism_check", ("default", "none")),  # torch.utils.checkpoint's determinism_check values
        ("larger_batch.lr_scaling", ("none", "linear", "sqrt")),
        ("memory.peak_on_miss", ("WARN", "FAIL")),  # statuses of a step peak that recompute does not lower enough
        ("distributed.backend", ("auto", "gloo", "nccl")),
        ("distributed.start_method", ("auto", "spawn", "forkserver", "fork")),
    ]
    problems += [
        f"{name}={values[name]!r} must be one of {', '.join(allowed)}"
        for name, allowed in enums
        if name in values and values[name] not in allowed
    ]
    problems += [
        p
        for name in ("budget.seeds", "larger_batch.seeds", "distributed.budget_seeds")
        if (p := _seeds_problem(name, values.get(name)))
    ]
    problems += [p for name in TASK_SIZES if (p := _task_size_problem(name, values.get(name)))]
    if (seed := values.get("forward_seed")) is not None and (not _is_int(seed) or seed < 0):
        problems.append(f"forward_seed={seed!r} must be an integer >= 0 (or null), e.g. forward_seed=0")
    if values.get("precision.autocast") not in AUTOCASTS:
        problems.append(f"precision.autocast={values['precision.autocast']!r} must be one of null, bf16, fp16")
    for name in ("memory.negligible_saving_share", "memory.min_peak_saving_share"):
        if (share := values.get(name)) is not None and isinstance(share, (int, float)) and share > 1:
            problems.append(f"{name}={share} must be between 0 and 1 (a share of the plain figure)")
    if values.get("threads") is not None and (problem := threads_problem(values["threads"])):
        problems.append(problem)
    problems += _distributed_problems(values) + _mode_problem(values) + moved_module_problems(cfg)
    problems += _sync_states_problem(values)
    problems += distributed_setting_problems(cfg.get("distributed"))
    problems += pipeline_problems(cfg) if cfg.get("distributed") is not None else []
    problems += _callable_problems(cfg)
    device = values.get("device", "auto")
    if not isinstance(device, str) or not DEVICE_PATTERN.fullmatch(device):
        problems.append(f"device={device!r} must be one of {DEVICES}")
    required = list(values.get("verdict.required") or [])
    known = check_names()
    unknown = [name for name in required if name not in known]
    named_badly = bool(unknown)  # one problem at a time for verdict.required: the names first
    if LARGER_BATCH in unknown:
        problems.append(
            f"verdict.required names {LARGER_BATCH!r}, which is FLAGGED and never counts toward the "
            "verdict (it changes the optimisation), so remove it"
        )
        unknown.remove(LARGER_BATCH)
    if unknown:
        problems.append(
            f"verdict.required names unknown check(s) {', '.join(map(repr, unknown))} (the checks: {', '.join(known)})"
        )
    if values.get("verdict.required") is not None and not named_badly and not set(required) & set(PARITY_CHECKS):
        problems.append(
            f"verdict.required={list(required)} names no parity check, so the claim would hold whatever "
            f"the gradients do (an empty claim); list at least one of {', '.join(PARITY_CHECKS)}, or "
            "leave verdict.required=null for the default"
        )
    fix = ". Fix these settings (python -m reportgen --cfg job lists them, each documented in docs/configuration.md)."
    return "; ".join(problems) + fix if problems else ""


#: The settings that name a Python object reportgen imports (an optimizer class, a user's wrap function): resolved
#: before any model work, so a typo is one line naming the setting and not a run that ends in an ERROR row.
CALLABLES = ("parity.optimizer._target_", "budget.optimizer._target_", "distributed.wrap")


def _callable_problems(cfg: DictConfig) -> list[str]:
    """``setting=path cannot be imported ...`` for each of :data:`CALLABLES` set to a dotted path that names no object
    (``distributed.wrap`` only with ``distributed.strategy=custom``), with a close name where the module has one."""
    problems = []
    for name in CALLABLES:
        path = OmegaConf.select(cfg, name, default=None)
        custom = str(OmegaConf.select(cfg, "distributed.strategy", default="")).endswith("custom")
        if not isinstance(path, str) or (name == "distributed.wrap" and not custom):
            continue
        if why := unresolved(path):
            problems.append(f"{name}={path} {why}")
    return problems


def unresolved(path: str) -> str:
    """Why the dotted ``path`` (``pkg.module.attr``, as Hydra's ``_target_``) names no object, with the closest name
    its module has (``torch.optim.Adamw`` → ``did you mean torch.optim.AdamW?``); ``""`` when it does. Imports the
    module, as the run would."""
    parts = path.replace(":", ".").split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for i, attr in enumerate(parts[cut:], cut):
            if not hasattr(found, attr):
                names = [n for n in dir(found) if not n.startswith("_")]
                close = [n for n in names if n.lower() == attr.lower()] or difflib.get_close_matches(attr, names, n=1)
                hint = f" (did you mean {'.'.join([*parts[:i], close[0]])}?)" if close else ""
                return f"cannot be imported: {'.'.join(parts[:i])} has no {attr!r}{hint}; give pkg.module.name"
            found = getattr(found, attr)
        return ""
    return (
        f"cannot be imported: no module {parts[0]!r} (is it installed, or on PYTHONPATH?); give pkg.module.name, "
        "e.g. torch.optim.AdamW or my_pkg.wrap.wrap"
    )


def _mode_problem(values: dict[str, Any]) -> list[str]:
    """``recompute.mode`` unset (``recompute=model_default``) is only meaningful with the model's own
    switch, which then applies its own default; reportgen's wrapper needs a mode (the one place this is refused)."""
    if values.get("recompute.mode", "") is None and values.get("recompute.method") is not RecomputeMethod.model_switch:
        return [
            "recompute.mode=null (recompute=model_default: the model's own default) needs "
            "recompute.method=model_switch; with recompute.method=wrap choose recompute=non_reentrant, "
            "reentrant or selective"
        ]
    return []


def _distributed_problems(values: dict[str, Any]) -> list[str]:
    """Settings a sharded run (``distributed.world_size > 1``) cannot use, each naming the fix."""
    world = values.get("distributed.world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world <= 1:
        return []
    problems = []
    # the batch is split over the data-parallel ranks only (distributed.mesh's dp_replicate × dp_shard)
    parts = dp_degree(values.get("distributed.mesh"), world)
    shares = f"distributed.world_size={world}" if parts == world else f"the data-parallel degree {parts}"
    batch = values.get("parity.batch_size")
    if isinstance(batch, int) and batch % parts:
        problems.append(
            f"parity.batch_size={batch} must be a multiple of {shares} (each data-parallel rank "
            f"takes an equal share of the global batch), e.g. parity.batch_size={batch + parts - batch % parts}"
        )
    for name in ("budget.batch_size", "budget.examples"):  # the sharded task metrics split every global batch
        value = values.get(name)
        if values.get("budget.enabled", True) and isinstance(value, int) and value % parts:
            problems.append(
                f"{name}={value} must be a multiple of {shares} (the sharded task "
                f"metrics give each data-parallel rank an equal share of every global batch), e.g. "
                f"{name}={value + parts - value % parts}"
            )
    if values.get("distributed.backend") == "nccl" and values.get("device") == "cpu":
        problems.append("distributed.backend=nccl needs CUDA but device=cpu; use distributed.backend=auto or gloo")
    if values.get("compile.enabled"):
        problems.append(
            "compile.enabled=true is not supported with distributed.world_size>1; set compile.enabled=false"
        )
    return problems


def _is_int(value: Any) -> bool:
    """True for an integer that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


#: Sizes a task may take (free-form group: checked only where set): ``block_size`` is tokens per example.
TASK_SIZES = ("task.block_size",)


def _task_size_problem(name: str, value: Any) -> str | None:
    """The problem with a task's size setting (an integer >= 1), or None when it is fine or not set."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return f"{name}={value!r} must be an integer >= 1 (tokens per example), e.g. {name}=32"


def _sync_states_problem(values: dict[str, Any]) -> list[str]:
    """FSDP1's ``sync_module_states=True`` broadcasts module states from GPU memory (torch's
    ``FullyShardedDataParallel`` refuses CPU parameters with it): refused where the ranks run on CPU (gloo)."""
    strategy = getattr(values.get("distributed.strategy"), "value", values.get("distributed.strategy"))
    world = values.get("distributed.world_size")
    if strategy != "fsdp1" or not values.get("distributed.fsdp1.sync_module_states"):
        return []
    if not isinstance(world, int) or world <= 1:
        return []  # refused with its group's other settings (one process)
    device, backend = values.get("device", "auto"), values.get("distributed.backend", "auto")
    cpu = device == "cpu" or backend == "gloo" or (device == "auto" and not torch.cuda.is_available())
    if not cpu:
        return []
    return [
        "distributed.fsdp1.sync_module_states=true needs CUDA (FSDP1 broadcasts module states from GPU memory and "
        "refuses CPU parameters), but this run's ranks use CPU (gloo); set distributed.fsdp1.sync_module_states=false "
        "(every rank already builds the same seeded state)"
    ]


def _seeds_problem(name: str, seeds: Any) -> str | None:
    """The problem with a list of seeds, or None: it must be non-empty (``budget.seeds``), hold integers >= 0
    (NumPy's ``SeedSequence``, which mixes every step's seed, refuses negatives) and no seed twice (a repeated
    seed is the same run again, reported as if it were another)."""
    if seeds is None:
        return None
    seeds = list(seeds)
    if not seeds and name == "budget.seeds":
        return f"{name}=[] must list at least one seed, e.g. {name}=[0]"
    bad = [s for s in seeds if not _is_int(s) or s < 0]
    if bad:
        return (
            f"{name}={seeds}: seed(s) {', '.join(map(repr, bad))} must be integers >= 0 (each seeds the data order "
            f"and is mixed by NumPy's SeedSequence, which refuses negatives), e.g. {name}=[0]"
        )
    repeated = sorted({s for s in seeds if seeds.count(s) > 1}, key=str)
    if repeated:
        unique = list(dict.fromkeys(seeds))
        return (
            f"{name}={seeds} repeats seed(s) {', '.join(map(str, repeated))}: each seed must appear once "
            f"(a repeated seed is the same training run again, not more evidence), e.g. "
            f"{name}=[{','.join(map(str, unique))}]"
        )
    return None


def _select(cfg: DictConfig, dotted: str) -> Any:
    """``cfg.a.b`` for ``"a.b"``; None when a level is missing.

    Raises:
        omegaconf.errors.OmegaConfBaseException: the value is an interpolation that cannot resolve.
    """
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if node is not None and hasattr(node, "get") else None
    return node


def unknown_setting_problems(cfg: DictConfig) -> list[str]:
    """One problem per key of a schema'd group (``parity``, ``timing``, ...) that its dataclass does not
    know: Hydra's ``+group.key=...`` adds it to the config, where nothing would read it, so a typo such
    as ``+parity.rtlo=1e-5`` would be recorded and ignored. ``distributed`` is checked with its own
    nested groups (:func:`reportgen.distributed.settings.unknown_problems`); ``model`` and ``task`` are free-form.
    """
    problems = top_level_problems(cfg)
    for name, known in schema_groups().items():
        node = cfg.get(name) if isinstance(cfg, DictConfig) else None
        if name == "distributed" or name in FREE_FORM or not isinstance(node, DictConfig):
            continue
        problems += [unknown_key_problem(name, str(key), known) for key in node.keys() if str(key) not in known]
    return problems


def top_level_problems(cfg: DictConfig) -> list[str]:
    """One problem per top-level key that is no field of :class:`reportgen.config.Config`, not ``hydra``
    and no config group chosen in this run (``hydra.runtime.choices``): ``+dtpye=float32``, ``++seeed=3``
    or ``+foo.bar=1`` add such a key, which nothing reads, so the typo would be recorded and ignored.
    Each problem names the setting meant when one is close (``difflib``).
    """
    if not isinstance(cfg, DictConfig):
        return []
    known = top_level_settings()
    allowed = {*known, "hydra", *_chosen_groups(cfg)}
    return [added_key_problem(str(key), known) for key in cfg.keys() if str(key) not in allowed]


def _chosen_groups(cfg: DictConfig) -> set[str]:
    """Top-level names of the config groups chosen in this run (a user's ``+mygroup=option`` too)."""
    choices: Any = OmegaConf.select(cfg, "hydra.runtime.choices", default=None)
    if choices is None and HydraConfig.initialized():
        choices = HydraConfig.get().runtime.choices
    return {str(group).split("/", 1)[0] for group in (choices or {})}
