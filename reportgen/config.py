"""Structured-config schemas, validated by Hydra at compose time.

The schemas follow Hydra's structured-config tutorial: each group is a dataclass stored in
the ConfigStore, so a typo such as ``parity.rtlo=1e-3`` or ``recompute.mode=reentrnt``
fails while composing, before any model is built. ``model`` and ``task`` stay free-form
(``Any``): they are ``_target_`` nodes that point at the user's own code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore

#: Names of the checks, as they appear in the ``check`` column and in ``verdict.required``
#: (each check's record in reportgen/checks/__init__.py says how it is shown and judged).
GRADIENT_PARITY = "gradient parity"
STEP_PARITY = "optimizer-step parity"
TRAJECTORY = "trajectory parity"
STATE_PARITY = "state parity"
MEMORY = "warm-step memory"
TIME = "warm-step time"
TASK_METRICS = "task metrics"
LARGER_BATCH = "larger-batch experiment"
SELECTIVE_POLICY = "selective policy"
#: Checks of a sharded run (``distributed.world_size > 1``); required only then.
DIST_GRADIENT_PARITY = "distributed gradient parity"
DIST_STEP_PARITY = "distributed optimizer-step parity"
DIST_TRAJECTORY = "distributed trajectory parity"
DIST_MEMORY = "distributed memory per rank"
DIST_TIME = "distributed step time"
DIST_TASK_METRICS = "distributed task metrics"
CONTROLS = "detector controls"  #: faults the checks above must catch (reportgen/checks/controls/), never required
#: The release claim's clauses (``claim=<name>``, reportgen/claim/): one judged row per clause;
#: required whenever a claim file states clauses.
RELEASE_CLAIM = "release claim"


class RecomputeMode(Enum):
    """How recomputation is applied (torch.utils.checkpoint implementations)."""

    non_reentrant = "non_reentrant"  #: ``use_reentrant=False`` (torch's recommended default)
    reentrant = "reentrant"  #: ``use_reentrant=True`` (legacy autograd.Function path)
    selective = "selective"  #: non-reentrant + ``create_selective_checkpoint_contexts``


class RecomputeMethod(Enum):
    """Who turns recomputation on in the recompute twin."""

    wrap = "wrap"  #: reportgen wraps ``recompute.targets`` with torch's checkpoint_wrapper
    model_switch = "model_switch"  #: the model's own switch: ``recompute.enable(model, recompute_cfg)``


@dataclass
class RecomputeConfig:
    """What is recomputed and how; every field is printed in the report."""

    #: null (``recompute=model_default``, the Hugging Face configs' default): not set, so
    #: ``method=model_switch`` calls the switch without ``use_reentrant`` and the model's own default applies.
    mode: RecomputeMode | None = RecomputeMode.non_reentrant
    #: ``wrap`` (reportgen wraps the targets) or ``model_switch`` (the model's own switch).
    method: RecomputeMethod = RecomputeMethod.wrap
    #: ``model_switch`` only: dotted path of ``fn(model, recompute_cfg)`` that turns recomputation
    #: on, e.g. ``reportgen.models.hf.enable`` (Hugging Face ``activation_checkpointing_enable``, 4.x
    #: ``gradient_checkpointing_enable``); it may return the ``use_reentrant`` it put in force.
    enable: str | None = None
    #: ``wrap`` only: class names (matching subclasses too) or module-path globs (``blocks.*``);
    #: each must match at least one module.
    targets: list[str] = field(default_factory=list)
    #: torch.utils.checkpoint ``preserve_rng_state``: replay the forward RNG in recompute.
    preserve_rng_state: bool = True
    #: torch.utils.checkpoint ``determinism_check`` ("default" compares shapes/dtypes, or "none").
    determinism_check: str = "default"
    #: Selective mode only: ops whose outputs are saved, e.g. ``aten.mm`` or ``aten.mm.default``.
    save_ops: list[str] = field(default_factory=list)
    #: Selective mode only: ``{op: n}``: of an op of ``save_ops``, only the 1st, (n+1)-th, (2n+1)-th ... call's output in a
    #: region's forward is saved (the rest recomputed); torchtitan's op policy ``{aten.mm: 2}``: every second mm recomputed.
    save_period: dict[str, int] = field(default_factory=dict)
    planned: dict[str, Any] = field(default_factory=dict)  #: set by reportgen.plan: page 1 states its peak


@dataclass
class ParityConfig:
    """Fixed-input and one-optimizer-step parity."""

    #: Relative tolerance; null = torch.testing.assert_close's default for the dtype.
    rtol: float | None = None
    #: Absolute tolerance; null = torch.testing.assert_close's default for the dtype.
    atol: float | None = None
    #: Examples in the fixed batch (and in each batch of the trajectory).
    batch_size: int = 16
    #: Optimizer steps of the trajectory check on the training stream (plain, A/A, recompute),
    #: compared after every step; faults that leave step 1 equal show from step 2 on.
    steps: int = 8
    #: Optimizer for the one-step parity, a ``_target_`` node called with ``params=``.
    optimizer: Any = field(default_factory=lambda: {"_target_": "torch.optim.AdamW", "lr": 1e-3})
    #: Judge step, trajectory and trained-parameter differences outside tolerance against a
    #: rounding envelope: how far a plain twin moves when its gradients are nudged by the
    #: gradient tolerance before each optimizer step (reportgen/results/rounding.py). Built only when
    #: some item is outside tolerance. false = tolerance alone decides, as a bitwise A/A floor.
    rounding_envelope: bool = True
    #: A difference outside tolerance passes when it is at most this many times the rounding
    #: envelope of its item (per tensor, max abs difference); >= 1.
    rounding_factor: float = 2.0


@dataclass
class MemoryConfig:
    """Warm-step memory: saved activations everywhere, allocator peaks on CUDA."""

    enabled: bool = True  #: false = the check is not run (one NOT_RUN row; it fails the claim if required)
    #: Steps run before the measured step (optimizer state initialised, caches warm).
    warm_steps: int = 3
    #: WARN when recompute saves less than this share of the plain run's saved bytes.
    negligible_saving_share: float = 0.05
    #: The memory verdict: recompute must lower the peak of live tensor bytes of a warm step
    #: (forward, backward, optimizer step) by at least this share of the plain twin's peak
    #: (a share in (0, 1]; 0.01 = 1 %). Saved bytes after the forward are evidence only.
    min_peak_saving_share: float = 0.01
    #: Status of a peak that recompute does not lower enough: "WARN" (the claim still holds,
    #: the report names the cause) or "FAIL" (the memory check fails the claim).
    peak_on_miss: str = "WARN"
    #: GPU-free estimate at a target scale: model/task keyword overrides (empty = off).
    estimate: dict[str, Any] = field(default_factory=dict)


@dataclass
class TimingConfig:
    """Warm-step time of plain vs recompute, interleaved."""

    enabled: bool = True  #: false = the check is not run (one NOT_RUN row; it fails the claim if required)
    warmup_steps: int = 3  #: excluded from timing
    measured_steps: int = 20  #: per variant, interleaved plain/recompute (the minimum when adaptive)
    bootstrap_samples: int = 2000  #: resamples for the 95% CI of the overhead ratio
    #: Keep measuring rounds past ``measured_steps`` until the 95% CI half-width of the
    #: overhead ratio is at most this many percentage points (null = exactly measured_steps).
    target_ci_half_width_pp: float | None = 2.0
    #: Time budget of the measured rounds, s; adaptive measuring stops when it is spent.
    max_measure_seconds: float = 10.0
    #: Deadline: maximum recompute/plain median step-time ratio (null = no deadline).
    max_overhead_ratio: float | None = None
    #: Deadline: maximum recompute median step time in ms (null = no deadline).
    max_step_time_ms: float | None = None


@dataclass
class BudgetConfig:
    """Equal accepted-example budget training and task metrics."""

    enabled: bool = True  #: false = the check is not run (one NOT_RUN row; it fails the claim if required)
    examples: int = 2048  #: accepted examples per run
    batch_size: int = 32  #: examples per step
    #: One training run per twin and seed (the seed fixes data order and dropout masks); a seed
    #: listed twice is refused (exit 2).
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    #: Largest allowed |plain - recompute| difference of the task metric, per seed (absolute).
    metric_tolerance: float = 1e-4
    #: Relative part of the metric tolerance: allowed |plain - recompute| is
    #: ``metric_tolerance + metric_rtol * |plain|`` (assert_close's form; 0 = absolute only).
    metric_rtol: float = 0.0
    eval_every: int = 256  #: accepted examples between learning-curve points
    #: Cap on drawn batches (applied + skipped) as a multiple of the steps the budget needs;
    #: a run that hits it (too many non-finite steps) is an ERROR, not a result.
    max_steps_factor: float = 4.0
    #: Optimizer for training, a ``_target_`` node called with ``params=``.
    optimizer: Any = field(default_factory=lambda: {"_target_": "torch.optim.AdamW", "lr": 1e-3})


@dataclass
class LargerBatchConfig:
    """The flagged larger-batch experiment (never part of the verdict)."""

    enabled: bool = True  #: false = the experiment is not run
    max_batch_size: int = 4096  #: search ceiling, examples
    #: Learning-rate scaling rule for the larger batch: "none", "linear" or "sqrt".
    lr_scaling: str = "none"
    #: Seeds trained at the larger batch; null = the same seeds as ``budget.seeds``.
    seeds: list[int] | None = None


@dataclass
class ControlsConfig:
    """Faults injected inside a recompute region while it recomputes, each a check must catch (docs/verdict.md)."""

    enabled: bool = True  #: false = no controls are run (one NOT_RUN row; the claim is judged without them)


@dataclass
class PrecisionConfig:
    """Mixed precision of both twins (``dtype`` casts the whole model instead)."""

    #: Run every forward under ``torch.autocast`` with this dtype: null (off), bf16 or fp16.
    #: Parity tolerances then default to torch.testing's for that dtype.
    autocast: str | None = None


@dataclass
class CompileConfig:
    """``torch.compile`` of both twins (the baseline is then the compiled plain twin)."""

    enabled: bool = False  #: true = ``torch.compile`` both twins before any check
    #: torch.compile backend: "inductor" (default), "aot_eager" (no code generation), ...
    backend: str = "inductor"


@dataclass
class StateConfig:
    """State parity settings."""

    #: Module attributes that are not compared (glob patterns on ``<module path>.<attr>``),
    #: e.g. the flags a model's own recompute switch sets; shown in the report as ignored.
    ignore_attributes: list[str] = field(default_factory=list)


class DistributedStrategy(Enum):
    """How the twins are spread over the ranks."""

    ddp = "ddp"  #: ``DistributedDataParallel``: full replica per rank, gradients all-reduced
    fsdp2 = "fsdp2"  #: ``fully_shard`` on each unit (``distributed.fsdp.units``), then on the root
    fsdp1 = "fsdp1"  #: ``FullyShardedDataParallel`` with an auto-wrap policy over ``distributed.fsdp.units``
    custom = "custom"  #: the user's own function (``distributed.wrap``) spreads each twin


@dataclass
class DDPConfig:
    """Arguments of ``torch.nn.parallel.DistributedDataParallel`` (``distributed.strategy=ddp``), passed as given."""

    #: Traverse the graph after each forward to find parameters that get no gradient (torch default false).
    find_unused_parameters: bool = False
    #: The graph is the same every iteration (a parameter used twice under reentrant recompute). torch default false.
    static_graph: bool = False
    #: Gradients are views into DDP's all-reduce buckets (saves one copy). torch default false.
    gradient_as_bucket_view: bool = False
    #: Broadcast rank 0's buffers (BatchNorm running stats) before every forward. torch default true.
    broadcast_buffers: bool = True
    #: Size of a gradient all-reduce bucket, MiB (null = torch's default, 25).
    bucket_cap_mb: float | None = None


@dataclass
class FSDPConfig:
    """Sharding units and precision of FSDP (``distributed.strategy=fsdp2`` or ``fsdp1``)."""

    #: Class names (``Block``) or plain path globs (``blocks.*``) that become FSDP units; null = the targets.
    units: list[str] | None = None
    #: FSDP2 only: free gathered parameters after forward (true, ZeRO-3) or keep them for backward (false).
    reshard_after_forward: bool = True
    param_dtype: str | None = None  #: mixed precision: gathered parameters' dtype (null = the model's)
    reduce_dtype: str | None = None  #: mixed precision: dtype gradients are reduced in (null = the parameters')


@dataclass
class FSDP1Config:
    """Arguments of ``torch.distributed.fsdp.FullyShardedDataParallel`` (``distributed.strategy=fsdp1``)."""

    #: Keep the original parameters visible; the checks compare them by name, so false is refused.
    use_orig_params: bool = True
    #: ``ShardingStrategy`` name: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD (HYBRID_* need a 2-D mesh).
    sharding_strategy: str = "FULL_SHARD"
    #: Broadcast rank 0's parameters and buffers at wrap time. torch default false.
    sync_module_states: bool = False


@dataclass
class MeshConfig:
    """Degrees of the named device mesh (``distributed.mesh``), named as torchtitan's ``ParallelDims`` names them and
    laid out in this order (pipeline outermost, tensor parallel innermost); null = the mesh has no such dimension.
    The batch is split over ``dp_replicate`` × ``dp_shard`` only (reportgen/distributed/mesh.py)."""

    pp: int | None = None  #: pipeline stages
    dp_replicate: int | None = None  #: data-parallel replicas (DDP, or HSDP's replicate dimension)
    dp_shard: int | None = None  #: data-parallel shards (FSDP's dimension)
    cp: int | None = None  #: context parallel: ranks that split each sequence
    tp: int | None = None  #: tensor parallel: ranks that split each layer's weights (same examples)


@dataclass
class PipelineConfig:
    """Pipeline stages (``distributed.mesh={pp:N}``), built with ``torch.distributed.pipelining``
    (reportgen/distributed/pipeline.py; docs/distributed_wrapping.md, "Pipeline stages")."""

    #: Module paths where stages 1.. begin, as torchtitan's split points (``SplitPoint.BEGINNING``), e.g. [blocks.1].
    split: list[str] = field(default_factory=list)
    #: ``GPipe`` or ``1F1B`` (torch's ``ScheduleGPipe``, ``Schedule1F1B``; one stage per rank).
    schedule: str = "GPipe"
    #: Micro-batches each global batch is split into; ``parity.batch_size`` must be a multiple.
    microbatches: int = 2


@dataclass
class DistributedConfig:
    """Sharded training: the twins run on ``world_size`` ranks (1 = one process, as without it)."""

    #: Ranks (processes). >1 starts them with torch's elastic launcher (the machinery of torchrun),
    #: or joins the group of an existing torchrun / srun launch (RANK, WORLD_SIZE, LOCAL_RANK set).
    world_size: int = 1
    #: ``ddp``, ``fsdp2``, ``fsdp1`` or ``custom`` (``distributed.wrap``); docs/distributed_wrapping.md.
    strategy: DistributedStrategy = DistributedStrategy.ddp
    #: ``auto`` (nccl on CUDA, gloo on CPU), ``gloo`` or ``nccl``.
    backend: str = "auto"
    #: Seconds any collective (and a rank's whole distributed check) may wait for the other ranks;
    #: a rank that raises or hangs becomes an ERROR / NOT_RUN row naming it after at most this long.
    timeout_s: float = 300.0
    #: How the elastic launcher starts local ranks: ``auto`` (= ``spawn``, a fresh interpreter per rank;
    #: ``fork`` is faster on CPU but not safe in a process with threads), ``spawn``, ``forkserver`` or ``fork``.
    start_method: str = "auto"
    #: Seeds of the distributed task-metrics check (sharded twins trained to the global budget);
    #: null = the first of ``budget.seeds`` only (each seed is two sharded training runs; the spread
    #: over seeds is the single-process task-metrics check's).
    budget_seeds: list[int] | None = None
    #: ``DistributedDataParallel`` arguments (strategy ddp).
    ddp: DDPConfig = field(default_factory=DDPConfig)
    #: FSDP units and mixed precision (strategy fsdp2 or fsdp1).
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    #: ``FullyShardedDataParallel`` arguments (strategy fsdp1).
    fsdp1: FSDP1Config = field(default_factory=FSDP1Config)
    #: ``pkg.module.fn`` (strategy custom): ``fn(model, mesh) -> module``, on each twin after recompute is applied.
    wrap: str | None = None
    #: Named mesh degrees, e.g. ``distributed.mesh={dp_shard:2,tp:2}``: their product is ``world_size``; every
    #: degree null = the 1-D mesh over all ranks (docs/distributed_wrapping.md, "Two dimensions").
    mesh: MeshConfig = field(default_factory=MeshConfig)
    #: Pipeline stages: split points, schedule and micro-batches (used when ``distributed.mesh`` sets ``pp`` > 1).
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)


@dataclass
class CacheConfig:
    """The plain-twin cache shared by a sweep's jobs (reportgen/training/cache.py;
    docs/sweeps.md, "The plain twin is trained once per sweep")."""

    #: false = train the plain twin in every run, never read or write the cache (the folder is
    #: ``$REPORTGEN_CACHE_DIR``, else ``<sweep dir>/.reportgen-cache`` in a multirun).
    enabled: bool = True


@dataclass
class ChecksConfig:
    """Limits on each check (reportgen/limits.py): past either, the check ends as one ERROR row
    naming the limit and the likely cause, and the run goes on with the next check."""

    #: Wall-clock seconds one check may take (null = no deadline). 1800 s is several times the
    #: slowest built-in check on a 2-core CPU (task metrics of ``gpt``).
    timeout_s: float | None = 1800.0
    #: Resident memory the process may reach during a check, GiB (null = 90 % of the machine's
    #: physical memory, ``reportgen.limits.default_max_rss_gib``).
    max_rss_gib: float | None = None


@dataclass
class ReportConfig:
    """Rendering and signing."""

    title: str = "Activation recomputation report"  #: heading of page 1
    pdf: bool = True  #: false = report.html only, no PDF
    sign: bool = True  #: false = an UNSIGNED report (page 1 says so), no signing key needed
    #: Private key (PEM). Null = $REPORTGEN_SIGNING_KEY, else ~/.config/reportgen/signing-key.pem.
    key_path: str | None = None


@dataclass
class RunConfig:
    """Limits of one run."""

    #: Refuse to start (exit 2) when the settings imply a run longer than this many minutes,
    #: estimated before any check from one timed training step of each twin
    #: (reportgen/training/duration.py); the message gives the estimate and the override. Null = no limit.
    max_estimated_minutes: float | None = 60.0


@dataclass
class VerdictConfig:
    """Which checks the claim needs; ERROR/NOT_RUN in a required check fails the claim."""

    #: Check names; null = every check the registry (reportgen/checks/__init__.py) marks
    #: required: all but the selective-policy check and the flagged larger-batch experiment.
    required: list[str] | None = None


@dataclass
class ClaimConfig:
    """The release note's claim (``claim=<name>``, conf/claim/*.yaml; reportgen/claim/clauses.py).

    Without ``text`` and ``clauses`` the generic claim stands: turning recomputation on keeps
    training behaviour identical within the stated tolerances.
    """

    #: The release-note sentence, printed on page 1 as written and signed; null = the generic claim.
    text: str | None = None
    #: One clause per entry, each a measured quantity, a comparator and a bound: ``training unchanged``
    #: (always added), ``peak_saving_share >= 0.40``, ``overhead_ratio <= 1.30`` (judged on the upper
    #: end of its 95% CI), ``step_time_ms <= 250`` (median), ``fits: batch 16 [at seq 1024] within 80 GiB``,
    #: ``task metric within tolerance``.
    clauses: list[str] = field(default_factory=list)
    #: Accept a sentence stating a quantity no clause judges (a saving, an overhead, a fits), stated as
    #: "not judged" in every output (page 1, summary.md, verdict.json, junit.xml, the sweep summary, a
    #: comparison; docs/ci.md); false (default) refuses such a claim before model work.
    unjudged_ok: bool = False
    #: The task's keyword that sets tokens per example, overridden by a ``fits: ... at seq S`` clause
    #: in the GPU-free estimate (``block_size`` for the built-in character task).
    seq_key: str = "block_size"


@dataclass
class Config:
    """The primary config. ``model`` and ``task`` come from ``+model=x``."""

    #: The model factory, a ``_target_`` node (set by ``+model=NAME``; see docs/own-model.md).
    model: Any = None
    #: The task (batches, loss, held-out metric), a ``_target_`` node (set by ``+model=NAME``).
    task: Any = None
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    seed: int = 0  #: seeds the weights of both twins
    #: ``torch.manual_seed`` before every forward of every run (null = do not reseed).
    forward_seed: int | None = 0
    dtype: str = "float32"  #: float32 | float64 | bfloat16 | float16
    device: str = "auto"  #: auto = cuda when available, else cpu
    #: torch intra- and inter-op CPU threads: ``auto`` = half the physical cores this process may
    #: use (``os.sched_getaffinity``), at least 1, at most 4, or ``OMP_NUM_THREADS`` when set;
    #: or a whole number (reportgen/threads.py). Stated on page 1 of the report.
    threads: str = "auto"
    parity: ParityConfig = field(default_factory=ParityConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    larger_batch: LargerBatchConfig = field(default_factory=LargerBatchConfig)
    controls: ControlsConfig = field(default_factory=ControlsConfig)
    state: StateConfig = field(default_factory=StateConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    run: RunConfig = field(default_factory=RunConfig)
    verdict: VerdictConfig = field(default_factory=VerdictConfig)
    claim: ClaimConfig = field(default_factory=ClaimConfig)


def register_configs() -> None:
    """Store the primary schema in Hydra's ConfigStore as ``reportgen_schema``."""
    cs = ConfigStore.instance()
    cs.store(name="reportgen_schema", node=Config)
