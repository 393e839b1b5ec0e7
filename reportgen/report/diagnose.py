"""Likely cause and fix of every failing or inconclusive check, chosen from the evidence by ordered rules
(the first that matches wins; docs/architecture.md)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from reportgen.config import CONTROLS
from reportgen.errors import INSTRUMENT_REFUSED
from reportgen.report.diagnose_distributed import RULES as DIST_RULES
from reportgen.report.diagnose_distributed import matching, rank_failed_fix
from reportgen.report.diagnose_unexplained import BAD, generator, module_of, quote, unexplained
from reportgen.results import BASELINE, TWIN, Role, Row, Status
from reportgen.twins.forward import CACHE_WRITTEN_AGAIN
from reportgen.twins.recompute import RETURNED_LEAF

#: A sentence read from the evidence: ``(the check's rows, every row, settings) -> sentence``.
Said = Callable[[list[Row], list[Row], dict[str, Any]], str]
#: What torch says when an in-place op changes the output of a reentrant region (a view CheckpointFunction made).
INPLACE_OUTPUT = "of CheckpointFunction is a view"
#: Parameter names of a mixture-of-experts router (``router.weight``, ``moe.gate.weight``; not ``gate_proj``).
ROUTER = re.compile(r"\b(router|gating)|\bgate\b")
#: The tag of a row measured in the run whose input requires grad (``reportgen.results.raised.tagged_input_grad``).
TAGGED = re.compile(r" \[input requires grad\]$")
#: A setting a fix proposes, as the command line writes it (``recompute=non_reentrant``,
#: ``recompute.preserve_rng_state=true``, ``distributed.ddp.static_graph=true``): what :mod:`reportgen.report.tried`
#: tries. A value that is not one word (``recompute.targets=[...]``) is not a setting to try.
SETTING = re.compile(r"\b(?:recompute|distributed)(?:\.\w+)*=\w+")


#: What joins the settings of a trial that changed several at once (``a and b``), none of which cleared it alone.
TOGETHER = " and "


@dataclass(frozen=True, kw_only=True, slots=True)
class Trial:
    """A setting a fix proposes, tried: the failing fixed-batch checks re-run with it, the rest of the run's setup
    unchanged (:func:`reportgen.report.tried.try_setting`).

    Attributes:
        setting: as the command line writes it, e.g. ``recompute=non_reentrant``.
        checks: the checks re-run, in order (gradient parity, optimizer-step and state parity, their sharded twins).
        failing: ``{check: items}`` of the re-run checks that still fail (FAIL, ERROR, INCONCLUSIVE or NOT_RUN rows);
            empty when the setting clears every one.
        seconds: wall time of the trial, s.
        error: why the trial could not run ("" when it ran; then nothing is concluded from it).
    """

    setting: str
    checks: tuple[str, ...]
    failing: dict[str, list[str]]
    seconds: float
    error: str = ""

    def clears(self, check: str) -> bool | None:
        """Whether the setting clears ``check``: for a re-run check, whether it passes now; for any other (trajectory
        parity, task metrics, whose runs are not repeated), whether every re-run check passes; None when the trial
        could not run."""
        if self.error:
            return None
        return not self.failing.get(check) if check in self.checks else not any(self.failing.values())

    def said(self, check: str) -> str:
        """One clause for ``check``'s diagnosis: ``recompute=non_reentrant tried: clears it (...)``, ``... tried:
        still fails (...)`` or ``... could not be tried (...)``, with what was re-run and its wall time."""
        named = ", ".join(self.checks[:-1]) + (" and " if len(self.checks) > 1 else "") + self.checks[-1]
        cost = f"{named} re-run with it at the fixed batch; {self.seconds:.1f} s"
        if self.error:
            return f"{self.setting} could not be tried ({self.error})"
        still = "; ".join(
            f"{c}: {', '.join(items[:3])}{' …' if len(items) > 3 else ''}" for c, items in self.failing.items() if items
        )
        if not still:
            return f"{self.setting} tried: clears it (every row passes: {cost})"
        if self.clears(check):
            return f"{self.setting} tried: clears it in {check}, but still fails in {still} ({cost})"
        return f"{self.setting} tried: still fails ({still}; {cost})"


@dataclass(frozen=True)
class Rule:
    """One diagnosis: when ``applies(rows of the check, settings)`` holds, ``cause`` and ``fix`` (each a sentence,
    or a :data:`Said` that reads it from the evidence)."""

    name: str
    applies: Callable[[list[Row], dict[str, Any]], bool]
    cause: str | Said
    fix: str | Said
    #: Words of torch's message this rule reads: the matching ERROR row's message is quoted in the cause.
    words: tuple[str, ...] = ()

    def said(self, group: list[Row], rows: list[Row], settings: dict[str, Any]) -> tuple[str, str]:
        """``(cause, fix)`` for the check's rows ``group`` among every row."""
        cause, fix = (t(group, rows, settings) if callable(t) else t for t in (self.cause, self.fix))
        return cause, fix

    def proposes(self, group: list[Row], rows: list[Row], settings: dict[str, Any]) -> list[str]:
        """The settings its fix proposes for ``group`` (:data:`SETTING`), in the fix's order, once each."""
        return list(dict.fromkeys(SETTING.findall(self.said(group, rows, settings)[1])))

    def trials(self, check: str, group: list[Row], rows: list[Row], settings: dict[str, Any]) -> list[Trial]:
        """The trials (``settings["tried"]``, :mod:`reportgen.report.tried`) of the settings its fix proposes that
        ran, for ``check``."""
        tried = settings.get("tried") or {}
        mine = self.proposes(group, rows, settings)
        found = [tried.get(setting) for setting in mine]
        found += [t for key, t in tried.items() if TOGETHER in key and set(mine) & set(key.split(TOGETHER))]
        return [t for t in found if t is not None and t.clears(check) is not None]

    def refuted(self, check: str, group: list[Row], rows: list[Row], settings: dict[str, Any]) -> list[Trial]:
        """The trials that refute it for ``check``: every setting its fix proposes that was tried still fails there
        (then it is not the lead cause); empty when none was tried or one clears it."""
        trials = self.trials(check, group, rows, settings)
        return trials if trials and not any(t.clears(check) for t in trials) else []


def _bad(rows: list[Row], *roles: str) -> list[Row]:
    """The failing rows of any of ``roles``."""
    return [r for r in rows if r.role in roles and r.status in BAD]


def _raised(rows: list[Row], *words: str) -> bool:
    return any(any(w in r.detail for w in words) for r in _bad(rows, Role.EXCEPTION))


def _frozen(rows: list[Row], s: dict[str, Any]) -> bool:
    """Under reentrant recompute, a region seen fed by inputs that do not require grad (``s["frozen_regions"]``,
    :func:`reportgen.twins.before_backward.frozen_regions`) and gradients lost inside one of them (or the whole loss:
    torch raised that nothing requires grad)."""
    frozen = s.get("frozen_regions") or []
    if s.get("mode") != "reentrant" or not frozen:
        return False
    inside = lambda r: any((m := module_of(r) or "") == p or m.startswith(f"{p}.") for p in frozen)
    lost = [r for r in _bad(rows, Role.PARAM_GRAD) if r.extra.get("recompute_value") == "None"]
    return (
        any(inside(r) for r in lost) or bool(_bad(rows, Role.LOST_GRADIENTS)) or _raised(rows, "does not require grad")
    )


def _frozen_cause(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    frozen = s["frozen_regions"]
    named = f"{', '.join(frozen[:4])}{' …' if len(frozen) > 4 else ''}"
    return (
        f"no input of the recomputed region{'s' if len(frozen) > 1 else ''} {named} requires grad (seen at the fixed "
        "batch: a frozen embedding or a plain input feeds it), and reentrant recomputation (use_reentrant=True) then "
        "gives the region's parameters, and those of every region fed only by it, no gradient"
    )


def _attributes(rows: list[Row], s: dict[str, Any], before: bool) -> list[str]:
    """The attributes of the failing state-parity rows that already differ before any backward (``before``; the
    switch's flags, ``s["set_before_backward"]``) or that do not (written again by the recomputation)."""
    seen = s.get("set_before_backward") or {}
    keys = dict.fromkeys(TAGGED.sub("", r.item.removeprefix("attribute ")) for r in _bad(rows, Role.ATTRIBUTE))
    return [k for k in keys if (k in seen) == before]


def _switch_cause(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    seen = s.get("set_before_backward") or {}
    keys = _attributes(rows, s, before=True)
    said = lambda when: ", ".join(
        f"{k} (plain={seen[k][0]!r}, recompute={seen[k][1]!r})" for k in keys if seen[k][2] == when
    )
    built, forward = said("as built"), said("in the forward")
    if s.get("switch"):
        parts = [f"the model's own switch (recompute.enable) sets {built}" if built else ""]
        parts += [f"its forward sets {forward} because the switch is on" if forward else ""]
    else:
        parts = [f"the recompute twin is built with {built}" if built else ""]
        parts += [
            f"its forward writes {forward} (e.g. it reads torch.is_grad_enabled(), off in a reentrant region's first "
            "forward)"
            if forward
            else ""
        ]
    return (
        f"{'; '.join(p for p in parts if p)}: these differ before any backward, so before anything is recomputed; "
        "they say that recompute is on, and the recomputation did not write them"
    )


def _switch_fix(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    globs = sorted({f"*.{k.rpartition('.')[2]}" if "." in k else k for k in _attributes(rows, s, before=True)})
    return (
        f"if they are the switch's flags, leave them out of state parity: state.ignore_attributes=[{', '.join(globs)}] "
        "(or give them a private name, _flag, which is not compared); nothing in the recomputation needs changing"
    )


def _plain_nonfinite(rows: list[Row]) -> bool:
    """A failing tensor row whose plain value holds NaN/Inf (``nonfinite_plain``, results.rows)."""
    return any(r.status in BAD and (r.extra.get("nonfinite_plain") or 0) > 0 for r in rows)


def _router_lost(rows: list[Row], s: dict[str, Any]) -> list[str]:
    """Under reentrant recompute, the failing gradients that are None or all zero in the recompute twin (so not in the
    plain twin), when every one is a router's."""
    zero = lambda r: r.extra.get("recompute_value") == "None" or r.extra.get("recompute_norm") == 0
    lost = [r.item for r in _bad(rows, Role.PARAM_GRAD) if zero(r)]
    return lost if s.get("mode") == "reentrant" and lost and all(ROUTER.search(item) for item in lost) else []


def _held(rows: list[Row]) -> list[str]:
    """Generators a module (or the task) holds whose states differ between the twins (a global one is a call)."""
    return [g for r in _bad(rows, Role.RNG) if not (g := generator(r)).endswith(")")]


#: Recompute hazards with a cause of their own: each is matched by its own evidence, before
#: the rules that read the symptoms they cause (a differing forward, a lost gradient, a CheckpointError).
HAZARDS: tuple[Rule, ...] = (
    Rule(
        "stopped at a limit",
        lambda rows, s: any(r.status in BAD and r.extra.get("exception_type") == "CheckLimitExceeded" for r in rows),
        "the check ran past checks.timeout_s, or the process past checks.max_rss_gib (the row says which): a "
        "recompute region that never returns, backward recursing without end, or a check that is only slow or large "
        "at this size",
        "if the model is healthy and the check only slow or large here, raise checks.timeout_s (or "
        "checks.max_rss_gib); otherwise the log shows where the check was stopped: make that region return",
    ),
    Rule(
        "reportgen's instrument refused",
        lambda rows, s: _raised(rows, INSTRUMENT_REFUSED),
        "reportgen's own measuring instrument (a TorchDispatchMode: the memory tracker, the FLOP or op counter) "
        "could not run this model, because torch.compile refuses the model's compiled code under it; that figure "
        "is unmeasured, and nothing in it says recomputation is wrong",
        "nothing to change for recompute; to measure that figure, let the compiled function fall back to eager "
        "code (torch.compile without fullgraph=True) or run it uncompiled for the report (the row quotes torch)",
    ),
    Rule(
        "region returned a tensor it did not create",
        lambda rows, s: _raised(rows, RETURNED_LEAF),
        "a region recomputed with reentrant recompute (use_reentrant=True) returns a tensor it did not create (its own "
        "parameter or buffer, or a graph tensor kept on an object): torch.utils.checkpoint gives that tensor the "
        "region's grad_fn, so its backward would recompute the region again and again until memory runs out; "
        "reportgen stopped before backward",
        "return a new tensor from the region (t * 1 or t.clone() of the tensor t it returns now), leave that module "
        "out of recompute.targets, or use recompute=non_reentrant (use_reentrant=False)",
    ),
    Rule(
        "cache written again in recompute",
        lambda rows, s: (  # a key/value cache in the output grew while backward ran (a row, or an exception's note)
            any(r.extra.get("in_cache") for r in _bad(rows, Role.CHANGED_IN_BACKWARD))
            or _raised(rows, CACHE_WRITTEN_AGAIN)
        ),
        "the forward writes a key/value cache (use_cache=True) and the recomputation runs the forward again, "
        "appending to the cache a second time: the recomputed attention sees the keys twice, so gradients differ under "
        "reentrant recompute and non-reentrant recompute raises on the recomputed shapes. A generic wrapper (torch's "
        "checkpoint_wrapper, FSDP's apply_activation_checkpointing) does not turn the cache off",
        "train with use_cache=False (model.config.use_cache=False, or use_cache=False in the forward call), or "
        "recompute through the model's own switch (recompute.method=model_switch; Hugging Face's "
        "gradient_checkpointing_enable() turns the cache off in training)",
    ),
    Rule(
        "in-place change of a region's output",
        lambda rows, s: _raised(rows, INPLACE_OUTPUT),
        "an in-place op changes the output of a region recomputed with reentrant recompute (use_reentrant=True), e.g. "
        "x += ... or relu_(...) after the block: the region returns a view (or its input as-is), and autograd refuses "
        "to change in place a view made by the custom Function reentrant recompute runs (CheckpointFunction)",
        "make the op out-of-place (x = x + ..., torch.relu(x)), or use recompute=non_reentrant (use_reentrant=False)",
        words=(INPLACE_OUTPUT,),
    ),
    Rule(
        "saved tensors read twice",
        lambda rows, s: _raised(rows, "already unpacked once"),
        "a custom autograd.Function inside a recomputed region reads ctx.saved_tensors more than once in its backward; "
        "non-reentrant recompute (use_reentrant=False) unpacks each saved tensor once and raises on the second read",
        "read ctx.saved_tensors once in backward (x, w = ctx.saved_tensors) and reuse those names",
    ),
    Rule(
        "graph tensor shared by regions",
        lambda rows, s: _raised(rows, "backward through the graph a second time"),
        "a tensor of the autograd graph, computed outside the recomputed regions and kept on an object (a shared "
        "table, a cached embedding), is read by several reentrant regions instead of being passed to them: the first "
        "region's backward frees its graph and the next region's backward walks it again",
        "pass the tensor to each region as an argument (forward(x, table)), or use recompute=non_reentrant "
        "(use_reentrant=False), which follows tensors read from outside the region",
    ),
    Rule(
        "retain_grad or hook in region",
        lambda rows, s: bool(_bad(rows, Role.RETAINED_GRAD)) or _raised(rows, "retain_grad", "register a hook"),
        "a recomputed region calls retain_grad() (or registers a tensor hook) on an intermediate tensor: under "
        "non-reentrant recompute the recomputation rebinds the kept tensor to a recomputed one whose .grad stays "
        "None; under reentrant recompute the forward runs without grad and the call raises",
        "read the gradient outside the recomputed region (retain_grad() on the region's output, in the caller), or "
        "leave that module out of recompute.targets while inspecting gradients",
    ),
)


RULES: tuple[Rule, ...] = (
    *(Rule(*rule) for rule in DIST_RULES),  # sharded runs, from torch's own messages and the rank-sync rows
    Rule(
        "a rank failed",
        lambda rows, s: any("rank" in r.extra for r in _bad(rows, Role.EXCEPTION)),
        "a rank of the sharded run raised, crashed or hung (its ERROR row names it and has the message); the "
        "ranks waiting for it time out after distributed.timeout_s, and the sharded checks after it did not run",
        rank_failed_fix,
    ),
    Rule(
        "plain twin raised",
        lambda rows, s: any(r.extra.get(TWIN) == BASELINE and r.status in (Status.ERROR, Status.NOT_RUN) for r in rows),
        "the plain twin breaks without any recomputation (it raises, e.g. in training or in the evaluation under "
        "torch.no_grad, or cannot reach the budget), so this check has no baseline to compare with: it cannot be "
        "judged, and the recompute twin is not blamed",
        "fix the model, task or config until the plain twin trains and evaluates (the ERROR row has the message; a "
        "forward that calls register_hook or retain_grad must skip it when the tensor does not require grad)",
    ),
    Rule(
        "baseline recomputes",
        lambda rows, s: bool(_bad(rows, Role.BASELINE)),
        "the model factory (or its config) already turns recomputation on, so the plain twin is not plain",
        "build the model without recomputation (e.g. do not call gradient_checkpointing_enable in the factory); "
        "reportgen turns it on in the recompute twin only",
    ),
    Rule(
        "plain twin non-finite",
        lambda rows, s: bool(_bad(rows, Role.NONFINITE)) or _plain_nonfinite(rows),
        "the model produces NaN or Inf without any recomputation: the plain twin's own loss, gradients or weights are "
        "not finite, and NaN is never equal to anything, so every comparison after it differs. This is not a "
        "recompute non-determinism",
        "fix the training first, then rerun: a learning rate too high (parity.optimizer.lr, the task's own), an "
        "initialisation that overflows, a dtype too narrow for the values (float16 without loss scaling: use "
        "dtype=float32 or bfloat16), a log of 0 or a division by 0 in the loss",
    ),
    Rule(
        "plain twin not reproducible",
        lambda rows, s: any(r.variant == "aa" and r.status == Status.INCONCLUSIVE for r in rows),
        "the plain twin does not reproduce itself: the model or task uses randomness or state the run does not "
        "control (os.urandom, the clock, a global counter, a nondeterministic kernel, a cache built at import)",
        "make the model deterministic given the seeds (draw randomness from torch, random or numpy; on CUDA use "
        "torch.use_deterministic_algorithms(True)), then rerun",
    ),
    Rule(
        "a check is blind",
        lambda rows, s: all(r.check == CONTROLS for r in rows) and bool(_bad(rows, Role.CONTROL)),
        "a fault injected inside a recompute region while it recomputed was not caught by the check that exists for "
        "it, so that check's PASS could not have seen such a fault on this model (each INCONCLUSIVE control row names "
        "the check and why: a tolerance wider than the gradients, a region the loss does not depend on)",
        "do what the control rows say (lower parity.atol / parity.rtol, recompute a region the loss uses), then "
        "rerun; controls.enabled=false judges the claim without the controls",
    ),
    *HAZARDS,
    Rule(
        "different forward",
        lambda rows, s: bool(_bad(rows, Role.LOSS)) and not s.get("own_step"),  # one forward before any backward
        "the twins ran different forwards: the loss itself differs, before any backward or recomputation; the forward "
        "depends on something that differs between the twins (state set by an earlier call, randomness outside the "
        "seeded generators, data-dependent routing)",
        "make the forward a function of its inputs, parameters and the seeded generators only",
    ),
    Rule(
        "nothing recomputes",
        lambda rows, s: bool(_bad(rows, Role.OBSERVED)),
        "the configured recompute never ran: no region of the recompute twin runs its forward again in backward. "
        "Under reentrant recompute (use_reentrant=True, the default of gradient_checkpointing_enable() in "
        "transformers 4.x; 5.x defaults to use_reentrant=False and calls enable_input_require_grads() itself) a "
        "region whose inputs do not require grad (a frozen embedding, LoRA adapters on a frozen base) is never "
        "recomputed and its parameters get no gradient",
        "call model.enable_input_require_grads() before training (Hugging Face / PEFT), or use "
        "use_reentrant=False (recompute=non_reentrant)",
    ),
    Rule(
        "one rank only",
        lambda rows, s: 0 < len(_bad(rows, Role.RANK_LOCAL_GRADS)) < sum(r.role == Role.RANK_LOCAL_GRADS for r in rows),
        "recompute changes the gradients on some ranks only: the recomputed forward takes a rank-dependent path "
        "there (a branch on the rank, per-rank state or data read again in the recomputation)",
        "make the recomputed region a pure function of its inputs on every rank, or leave that module out of "
        "recompute.targets",
    ),
    Rule(
        "router gradient lost under reentrant",
        lambda rows, s: bool(_router_lost(rows, s)),
        lambda group, rows, s: (
            "under reentrant recompute (use_reentrant=True) the forward runs without grad, so a value recorded on the "
            "side by a hook or an attribute (router logits kept for a mixture-of-experts auxiliary loss) has no graph: "
            f"{', '.join(_router_lost(rows, s))} get no gradient from it in the recompute twin, as they do in the plain"
        ),
        "use recompute=non_reentrant (use_reentrant=False), or return the value from the region instead of recording "
        "it by a hook",
    ),
    Rule(
        "frozen input under reentrant",
        _frozen,
        _frozen_cause,
        "use recompute=non_reentrant (use_reentrant=False), or make the region's input require grad (Hugging Face / "
        "PEFT: model.enable_input_require_grads())",
    ),
    Rule(
        "state changed before recompute",
        lambda rows, s: _raised(rows, "metadata", "CheckpointError", "torch.utils.checkpoint:"),
        "the forward depends on state that changes between the forward and its recomputation (a cache, a counter, "
        "data-dependent routing), so the recomputed values do not match",
        "make the recomputed region a pure function of its inputs, or leave that module out of recompute.targets",
    ),
    Rule(
        "generator the module owns",
        lambda rows, s: bool(_held(rows)),
        lambda group, rows, s: (
            f"noise from a generator the module owns ({', '.join(_held(rows))}): torch.utils.checkpoint restores only "
            "the global CPU/CUDA generators (preserve_rng_state), so the recomputation draws from it again and gets "
            "other numbers"
        ),
        "draw from the global generator, or keep the noise outside the recomputed region",
    ),
    Rule(
        "RNG not replayed",
        lambda rows, s: (
            not s.get("preserve_rng_state", True) and bool(_bad(rows, Role.PARAM_GRAD, Role.PARAM, Role.OUTPUT))
        ),
        "random ops (dropout) inside a recomputed region draw new numbers in the recomputation, because "
        "preserve_rng_state=false does not replay the generator",
        "set recompute.preserve_rng_state=true (torch's default)",
    ),
    Rule(
        "generator drawn in region",
        lambda rows, s: any("random." in r.item or "numpy" in r.item for r in _bad(rows, Role.RNG)),
        "a recomputed region draws from Python random or NumPy, which torch.utils.checkpoint does not replay: the "
        "recomputation draws again and every later draw differs",
        "draw randomness inside recomputed regions from torch's generator, or move the draw outside the region",
    ),
    Rule(
        "running statistics",
        lambda rows, s: bool(_bad(rows, Role.BUFFER)),
        "a module with running buffers (BatchNorm statistics, num_batches_tracked) sits inside a recomputed region "
        "and updates them again in the recomputation",
        "leave those modules out of recompute.targets, or freeze their statistics (eval mode) while recomputing",
    ),
    Rule(
        "flag set before recompute",
        lambda rows, s: bool(_bad(rows, Role.ATTRIBUTE)) and not _attributes(rows, s, before=False),
        _switch_cause,
        _switch_fix,
    ),
    Rule(
        "python state in forward",
        lambda rows, s: bool(_attributes(rows, s, before=False)),
        lambda group, rows, s: (
            f"the forward writes Python state (a counter, a flag: {', '.join(_attributes(rows, s, before=False)[:4])}) "
            "that the recomputation writes again"
        ),
        "move the update out of forward (e.g. into a hook after the optimizer step), or leave the module out of "
        "recompute.targets",
    ),
    Rule(
        "visible after a step",
        lambda rows, s: any(r.role == Role.FIRST_DIVERGENCE and r.value > 1 for r in rows),
        "state read in the forward and updated after it (an observer, a running scale, a counter) is updated twice per "
        "step under recomputation: step 1 is equal, later steps diverge",
        "update such state outside the recomputed region (or once per step), or leave the module out of "
        "recompute.targets",
    ),
    Rule(
        "region recomputed whole",
        lambda rows, s: any("one region (" in r.detail for r in _bad(rows, Role.PEAK_SAVING)),
        "one recompute region holds most of the activations and backward recomputes it at once, so they are all "
        "alive together again and the step's peak does not move (the saved bytes after the forward drop all the same)",
        "split it: one region per layer (recompute.targets=[<the layer class>])",
    ),
    Rule(
        "recompute costs memory",
        lambda rows, s: any(r.value < 0 for r in _bad(rows, Role.PEAK_SAVING)),
        "recompute keeps more than it frees: each wrapped region keeps its input for the recompute while the layer "
        "after it still keeps its output (e.g. only activation functions are recomputed)",
        "recompute whole layers or blocks (recompute.targets), not single cheap ops",
    ),
    Rule(
        "peak in the optimizer step",
        lambda rows, s: any("in the optimizer step" in r.detail for r in _bad(rows, Role.PEAK_SAVING)),
        "the step's peak is in the optimizer step, where parameters, gradients and optimizer state are alive and no "
        "activation is, so recompute cannot lower it at this batch",
        "make the memory claim at the batch and sequence length where activations set the peak, or claim no memory "
        "saving",
    ),
    Rule(
        "deadline",
        lambda rows, s: bool(_bad(rows, Role.OVERHEAD, Role.MEDIAN)),
        "recomputation costs more step time than the configured deadline allows",
        "recompute fewer or cheaper modules (recompute.targets), or use recompute=selective to save the costly ops",
    ),
    Rule(
        "trained apart",
        lambda rows, s: bool(_bad(rows, Role.FINAL_PARAMS, Role.METRIC_DIFF, Role.WORST)),
        "the twins train apart over many steps although the checks on one batch agree: a per-step difference "
        "accumulates (nondeterministic kernels, state updated in forward), or one switches on only after some steps "
        "(a forward counter or schedule that recomputation advances twice per step, state kept outside module "
        "attributes, e.g. in a global table)",
        "if the trajectory check failed, start from its first diverging step and the state parity rows; if it passed, "
        "the difference starts after parity.steps steps: rerun with parity.steps set to the budget's step count to "
        "find the step, and look for state the forward counts or updates; on CUDA, try "
        "torch.use_deterministic_algorithms(True)",
    ),
)


#: Rules that name a symptom rather than a cause: a specific rule from another check wins.
GENERIC = ("trained apart",)
#: Rules that name a symptom a hazard also causes: a hazard seen in any check (e.g. a cache that
#: gradient parity saw written again) wins over them in a check whose own rows show only the symptom.
SYMPTOMS = (*GENERIC, "state changed before recompute")
#: Causes that can hide behind a frozen input under reentrant recompute: its fallback runs (the input
#: made to require grad, items tagged "[input requires grad]") still differ when one of these holds.
SECOND_CAUSES = ("RNG not replayed", "running statistics", "python state in forward")


def second_cause(rule: Rule | None, group: list[Row], rows: list[Row], settings: dict[str, Any]) -> Rule | None:
    """The rule that explains what a frozen input under reentrant recompute does not: gradients that
    still differ in the runs whose input requires grad (``tagged_input_grad`` rows with a value, not
    None), e.g. a forward counter the recomputation advances; the first of :data:`SECOND_CAUSES` seen
    in any check's ``rows``, else None."""
    if rule is None or rule.name != "frozen input under reentrant":
        return None
    if not any(
        r.status in BAD and r.item.endswith("[input requires grad]") and r.extra.get("recompute_value") != "None"
        for r in group
    ):
        return None
    return next((r for r in RULES if r.name in SECOND_CAUSES and r.applies(rows, settings)), None)


def likely(rows: list[Row], settings: dict[str, Any], check: str = "") -> Rule | None:
    """The first rule whose evidence is in ``rows`` (one check's rows, or every row) and whose fix was not tried and
    refuted for ``check`` (:meth:`Rule.refuted`), or None."""
    return next(
        (rule for rule in RULES if rule.applies(rows, settings) and not rule.refuted(check, rows, rows, settings)),
        None,
    )


def proposed(rows: Iterable[Row], settings: dict[str, Any], checks: Iterable[str]) -> list[str]:
    """The settings (:data:`SETTING`) that the fix of any rule matching a failing check of ``checks`` proposes, in rule
    order, once each: what :mod:`reportgen.report.tried` tries before the diagnosis is written. Every matching rule
    counts, not only the first: a rule whose setting is tried and fails gives way to the next."""
    groups = _by_check(rows)
    out: list[str] = []
    for check in checks:
        group = groups.get(check, [])
        if any(r.status in BAD for r in group):
            matched = [rule for rule in RULES if rule.applies(group, settings)]
            out += [setting for rule in matched for setting in rule.proposes(group, group, settings)]
    return list(dict.fromkeys(out))


def _by_check(rows: Iterable[Row]) -> dict[str, list[Row]]:
    """``{check: its rows}``, in the order checks first appear."""
    by_check: dict[str, list[Row]] = {}
    for row in rows:
        by_check.setdefault(row.check, []).append(row)
    return by_check


def _ruled_out(check: str, group: list[Row], rows: list[Row], settings: dict[str, Any]) -> list[str]:
    """For ``check``: one clause per rule that matches its rows but whose fix was tried and still fails there."""
    return [
        f"not {rule.name}, whose fix {' and '.join(t.said(check) for t in refuted)}"
        for rule in RULES
        if rule.applies(group, settings) and (refuted := rule.refuted(check, group, rows, settings))
    ]


def diagnose(rows: Iterable[Row], settings: dict[str, Any]) -> list[Row]:
    """One diagnosis row per check that has a FAIL, ERROR or INCONCLUSIVE row.

    Args:
        rows: every row the checks produced.
        settings: what the rules read besides the rows: the recompute settings (``mode``, ``preserve_rng_state``,
            ``strategy``, ``distributed``, ``own_step``; :func:`reportgen.report.metadata.recompute_settings`) and
            what the diagnosis stage saw and tried (:func:`reportgen.report.tried.look_and_try`): ``switch``,
            ``frozen_regions``, ``set_before_backward``, ``tried`` (``{setting: Trial}``).

    Returns:
        INFO rows (check = the failing check, role ``diagnosis``): detail ``"Likely cause: ... Fix: ..."``, columns
        ``cause``, ``fix``, ``rule`` and, where a setting the fix proposes was tried, ``tried`` (each trial's
        clause, also in the fix); a rule whose fix was tried and still fails is not the cause (the cause says so). A
        check no rule explains gets a row that says what its rows show.
    """
    rows = list(rows)
    out = []
    for check, group in _by_check(rows).items():
        if not any(r.status in BAD for r in group) or all(r.status == Status.NOT_RUN for r in group):
            continue
        rule = likely(group, settings, check)
        if rule is None or rule.name in GENERIC:  # a specific cause seen in another check explains this one
            rule = next((r for r in [likely(rows, settings, check)] if r is not None and r.name not in GENERIC), rule)
        if rule is not None and rule.name in SYMPTOMS:  # a hazard seen anywhere is the cause of the symptom
            rule = next((h for h in HAZARDS if h.applies(rows, settings)), rule)
        cause, fix = rule.said(group, rows, settings) if rule else unexplained(check, group, rows)
        if also := second_cause(rule, group, rows, settings):
            also_cause, also_fix = also.said(group, rows, settings)
            cause += f"; with the input requiring grad the gradients still differ: {also_cause}"
            fix = f"both are needed: (1) {fix}; (2) {also_fix}"
        if rule is not None and rule.words and (raised := matching(group, rule.words) or matching(rows, rule.words)):
            cause += f" ({quote(raised)})"  # torch's own words, as the rank's row has them
        if ruled_out := _ruled_out(check, group, rows, settings):
            cause += f" ({'; '.join(ruled_out)})"
        tried = [t.said(check) for t in rule.trials(check, group, rows, settings)] if rule else []
        fix += f" — {'; '.join(tried)}" if tried else ""
        extra = {"cause": cause, "fix": fix, "rule": rule.name if rule else ""}
        extra |= {"tried": "; ".join([*tried, *ruled_out])} if tried or ruled_out else {}
        out.append(Row.fact(check, "why it fails", Role.DIAGNOSIS, f"Likely cause: {cause}. Fix: {fix}.", extra=extra))
    return out
