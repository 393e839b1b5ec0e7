"""Row roles: what each row is (:class:`Role`, the ``role`` column of results.csv/json) and what its
rows mean to the claim (:class:`Kind`). A check lists the roles its rows use in its section record
(``reportgen.checks.Section.roles``); code that needs "the parity rows" or "the costs" asks the kind
or the registry (``reportgen.checks.roles_of``), never a list of its own.
"""

from __future__ import annotations

import enum


class Kind(enum.Enum):
    """What the rows of a :class:`Role` mean to the claim (every role has one kind)."""

    #: One tensor or value of the recompute twin compared with the plain twin's, item by item (the loss,
    #: an output, a gradient, a parameter, an optimizer-state tensor, a buffer, an attribute, a generator
    #: state): a miss is always FAIL (``reportgen.verify`` re-judges it so, whatever ``on_miss`` a row
    #: says), and the first failing one is what an unexplained failure names.
    PARITY = "parity"
    #: What the claim costs, the figures the signed statement repeats: saved-activation bytes and their
    #: saving, the step peak and its saving, the CUDA peak, the median step time, its overhead, FLOPs.
    COST = "cost"
    #: Everything else: notes and facts, controls (A/A, non-finite baselines, references), summaries of
    #: parity rows (a trajectory step, trained parameters), cost detail (per module, per rank, estimates),
    #: diagnoses, parts that were disabled or raised.
    EVIDENCE = "evidence"


class Role(enum.StrEnum):
    """What a row is, for templates, plots, the verifier and the statement (never look rows up by their
    prose ``item``). A member is its string value (``Role.PARAM_GRAD == "param_grad"``; results.csv/json
    hold the value), and has a :class:`Kind` (``Role.PARAM_GRAD.kind is Kind.PARITY``)."""

    kind: Kind

    def __new__(cls, value: str, kind: Kind = Kind.EVIDENCE) -> Role:
        member = str.__new__(cls, value)
        member._value_ = value
        member.kind = kind
        return member

    # Parity: one item compared between the twins.
    LOSS = "loss", Kind.PARITY
    OUTPUT = "output", Kind.PARITY
    PARAM_GRAD = "param_grad", Kind.PARITY
    INPUT_GRAD = "input_grad", Kind.PARITY
    PARAM = "param", Kind.PARITY
    OPTIMIZER_STATE = "optimizer_state", Kind.PARITY
    BUFFER = "buffer", Kind.PARITY
    ATTRIBUTE = "attribute", Kind.PARITY
    RNG = "rng", Kind.PARITY
    #: The ``.grad`` of a tensor kept as a module attribute that called ``retain_grad()``.
    RETAINED_GRAD = "retained_grad", Kind.PARITY
    #: An output leaf that is not a tensor (None, a number, a cache object), or a cache tensor only one twin returned.
    OUTPUT_OTHER = "output_other", Kind.PARITY

    # Cost: the claim's memory and time.
    SAVED_TOTAL = "saved_total", Kind.COST
    SAVING = "saving", Kind.COST
    STEP_PEAK = "step_peak", Kind.COST
    PEAK_SAVING = "peak_saving", Kind.COST
    CUDA_PEAK = "cuda_peak", Kind.COST
    MEDIAN = "median", Kind.COST
    OVERHEAD = "overhead", Kind.COST
    FLOPS = "flops", Kind.COST

    # Evidence: everything else.
    WARNING = "warning"
    EXCEPTION = "exception"
    DISABLED = "disabled"
    NOTE = "note"
    SAVE_OP = "save_op"
    SAVED_MODULE = "saved_module"
    LOST_GRADIENTS = "lost_gradients"
    ESTIMATE_PEAK = "estimate_peak"
    ESTIMATE_MEASURED = "estimate_measured"
    ESTIMATE_TARGET = "estimate_target"
    PER_LAYER = "per_layer"
    STEP = "step"
    OVERHEAD_CI = "overhead_ci"
    LOAD = "load"
    BUDGET = "budget"
    RUN = "run"
    HELD_OUT = "held_out"
    ACCEPTED = "accepted"
    SKIPPED = "skipped"
    CURVE = "curve"
    METRIC_DIFF = "metric_diff"
    SKIPPED_DIFF = "skipped_diff"
    MEAN = "mean"
    WORST = "worst"
    REFERENCE = "reference"
    PROBE = "probe"
    BATCH_FOUND = "batch_found"
    AA = "aa"
    NONFINITE = "nonfinite"
    #: The plain twin's gradients are all zero: every comparison of them is equal and shows nothing.
    ZERO_GRADIENTS = "zero_gradients"
    TRAJECTORY = "trajectory"
    FIRST_DIVERGENCE = "first_divergence"
    FINAL_PARAMS = "final_params"
    DIAGNOSIS = "diagnosis"
    BASELINE = "baseline"
    IGNORED = "ignored"
    #: How many regions the recompute twin was seen recomputing (0: the configured recompute never ran).
    OBSERVED = "observed"
    CACHE = "cache"  #: a plain-twin cache entry that was not trusted (reportgen.training.cache)
    RANK_LOCAL_GRADS = "rank_local_grads"  #: one rank's own gradients before reduction (sharded checks)
    #: One twin's replicated state (parameters, buffers) compared across ranks after every step (sharded checks).
    RANK_SYNC = "rank_sync"
    #: Output leaves that changed while backward ran (a recomputation wrote the forward's outputs again).
    CHANGED_IN_BACKWARD = "changed_in_backward"
    #: A detector control: a fault injected inside a recompute region while it recomputes, caught (1) or not (0)
    #: by the check that must see it (reportgen/checks/controls/); not caught is INCONCLUSIVE.
    CONTROL = "control"
    #: The report's detection limit: the smallest relative error in a recomputed activation gradient parity
    #: catches (reportgen/checks/controls/limit.py); above bf16's unit roundoff 2^-8 it is a WARN.
    DETECTION_LIMIT = "detection_limit"
    #: One probe of the detection limit's search: a relative error injected while a region recomputes, caught (1)
    #: or not (0) by gradient parity; the limit is re-derived from these rows.
    LIMIT_PROBE = "limit_probe"
    #: One clause of the release claim (``claim=<name>``), judged from the rows it reads (reportgen/claim/).
    CLAUSE = "claim_clause"
    #: The claim sentence's quantities no clause judges (``claim.unjudged_ok=true``): the sentence is not judged.
    SENTENCE = "claim_sentence"
    #: A distributed twin vs the single-process plain reference: sharding's own effect, advisory (WARN on a
    #: miss), so not PARITY.
    SHARDING_REFERENCE = "sharding_reference"
    RANK_SAVED_TOTAL = "rank_saved_total"  #: saved activation bytes of one rank
    RANK_STEP = "rank_step"  #: one rank's median warm step time
    MAX_RANK_SAVED_TOTAL = "max_rank_saved_total"  #: saved bytes of the worst rank (plain, recompute)
    RANK_STEP_PEAK = "rank_step_peak"  #: live tensor bytes at the peak of one rank's warm step
    MAX_RANK_STEP_PEAK = "max_rank_step_peak"  #: the step peak of the worst rank (plain, recompute)
    MAX_RANK_STEP = "max_rank_step"  #: median over steps of the slowest rank's step time
    MAX_RANK_OVERHEAD = "max_rank_overhead"  #: paired recompute/plain ratio of the slowest rank's step times


def every_role(kind: Kind) -> list[Role]:
    """Every :class:`Role` of ``kind``, whether or not a registered check declares it (the statement's parity rows
    and costs; ``reportgen.checks.roles_of`` gives those the registered checks declare)."""
    return [r for r in Role if r.kind is kind]
