"""``python -m reportgen.plan CONFIG seq=8192 batch=1 dtype=bf16 memory_gib=80``: will it fit, offline.

CONFIG is a local Hugging Face ``config.json`` or a folder holding one. The causal LM it
describes is built with ``transformers.AutoConfig`` + ``AutoModelForCausalLM.from_config`` inside
``FakeTensorMode`` (shapes, dtypes and storage sizes, no data: no weights are read and nothing
is downloaded, ``HF_HUB_OFFLINE=1``), with its own attention implementation (sdpa unless
``attn=`` says otherwise), its full vocabulary, an all-ones attention mask in the batch and its
own recompute switch ``gradient_checkpointing_enable(gradient_checkpointing_kwargs=
{"use_reentrant": ...})`` (:func:`reportgen.models.hf.enable`'s call).

For each recompute setting (:data:`SETTINGS`: none, the model's switch reentrant, the model's
switch non-reentrant) it counts, with the same tracker as the measured figure
(:func:`reportgen.memory.peak.warm_step_peak`, torch's ``MemTracker``) and the same saved-bytes counter
(:func:`reportgen.memory.saved.saved_activation_bytes`):

* saved-activation bytes after the forward, total and per decoder layer;
* the peak of live tensor bytes of one warm training step (forward, loss, backward, AdamW
  step), with its phase, module and what is alive then (parameters, gradients, optimizer
  state, activations);
* the largest batch at this sequence length whose step peak fits in ``memory_gib``: for a fixed
  sequence the peak is affine in the batch, so it is counted at two batch sizes, the line is
  solved for ``memory_gib`` and the answer is confirmed by one more count at that batch.

What is not counted (:data:`ASSUMPTIONS`): anything that is not a tensor (allocator
fragmentation and caching, communication buffers, CUDA workspaces).

Output: ``plan.csv``, ``plan.html`` (``templates/plan.html.j2``) and ``plan.pdf``
(:func:`reportgen.report.render.write_pdf`) in a new folder ``outputs/plans/<date>/<time>/`` (or
``out=DIR``, which must not exist yet), and a console table. Bad input ends with one line
naming the fix and exit 2; nothing is written then.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from reportgen.errors import EXIT_BUG, EXIT_SIGINT, EXIT_USAGE, UsageError
from reportgen.memory.estimate import default_dtype
from reportgen.memory.peak import StepPeak, format_bytes, warm_step_peak

#: Recompute settings planned, in report order: ``(name, use_reentrant)``; None = no recompute.
SETTINGS: tuple[tuple[str, bool | None], ...] = (("none", None), ("reentrant", True), ("non-reentrant", False))

#: ``dtype=`` words and the parameter/activation dtype they mean.
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}

#: ``key=value`` words the command takes, with their defaults (None = required).
WORDS = {"seq": None, "batch": "1", "dtype": "bf16", "memory_gib": "80", "attn": "sdpa", "optim": "fused", "out": "",
         "pdf": "true"}

#: The optimizer of the planned step, per ``optim=`` word: AdamW with state in the parameters'
#: dtype (``exp_avg`` and ``exp_avg_sq`` per parameter, plus a scalar ``step``). ``fused`` (the
#: default) is transformers' ``Trainer`` default with torch >= 2.8 (``adamw_torch_fused``,
#: TrainingArguments.optim docs): one kernel, no parameter-sized temporaries. ``foreach`` is
#: torch's own default for CUDA parameters (torch.optim docs, "Algorithms"): its step holds
#: parameter-sized temporaries (e.g. ``sqrt(exp_avg_sq)`` for every parameter at once), which
#: the tracker counts.
OPTIMIZERS = {"fused": {"_target_": "torch.optim.AdamW", "lr": 1e-4, "fused": True},
              "foreach": {"_target_": "torch.optim.AdamW", "lr": 1e-4, "foreach": True}}
#: The default optimizer (``optim=fused``).
OPTIMIZER = OPTIMIZERS["fused"]

#: What the figures do not count; printed on every page.
ASSUMPTIONS = (
    "Live tensor bytes only, counted by torch's MemTracker on fake tensors: allocator fragmentation and the "
    "caching allocator's reserve, communication buffers (NCCL, FSDP/ZeRO shards) and CUDA workspaces (cuBLAS, "
    "cuDNN, attention kernels) are not counted; leave headroom for them.",
    "One device holds the whole model: no tensor, pipeline or data-parallel sharding, no CPU offload.",
    "Parameters, gradients and AdamW state (exp_avg, exp_avg_sq) are all in the chosen dtype (pure "
    "low-precision training, torch.optim.AdamW's defaults); float32 master weights would add 4 bytes per "
    "parameter, float32 optimizer state 4 more per state tensor. AdamW is fused (transformers' Trainer default "
    "with torch >= 2.8) unless optim=foreach (torch's default on CUDA), whose step adds parameter-sized temporaries.",
    "The batch is packed: an all-ones attention mask (bool), so transformers' sdpa path uses is_causal and "
    "materialises no sequence x sequence mask; padded batches with a mask that is not all ones can need more.",
    "The loss is the cross-entropy of the float32 logits over the full vocabulary (reportgen.models.hf.CausalLMTask's "
    "loss); a fused or chunked cross-entropy kernel needs less.",
    "The step peak is affine in the batch for a fixed sequence length: fitted from two batch sizes, "
    "the largest batch is confirmed by one more count at that batch.",
)


class PlanError(UsageError, ValueError):
    """Bad command-line input or a config that cannot be planned (exit 2, one line, the fix)."""


# ------------------------------------------------------------------------------------------ input
@dataclass
class PlanArgs:
    """The command line, checked.

    Attributes:
        config: the ``config.json`` file.
        seq: sequence length, tokens.
        batch: sequences per batch at which the figures are reported.
        dtype: parameter and activation dtype.
        dtype_name: the ``dtype=`` word as given (``bf16``).
        memory_gib: device memory the step must fit in, GiB (2**30 bytes).
        attn: ``attn_implementation`` passed to ``from_config`` (``sdpa``, ``eager``, ...).
        out: the output folder (None = ``outputs/plans/<date>/<time>/``).
        pdf: also write plan.pdf.
        optim: a key of :data:`OPTIMIZERS` (``fused`` or ``foreach`` AdamW).
    """

    config: Path
    seq: int
    batch: int
    dtype: torch.dtype
    dtype_name: str
    memory_gib: float
    attn: str
    out: Path | None
    pdf: bool = True
    optim: str = "fused"


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`PlanError` (one line, exit 2) instead of printing usage and exiting."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        raise PlanError(f"{message}; usage: python -m reportgen.plan CONFIG seq=8192 batch=1 dtype=bf16 memory_gib=80")


def _positive_int(key: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise PlanError(f"{key}={value!r} must be a positive whole number, e.g. {key}=8192" if key == "seq"
                        else f"{key}={value!r} must be a positive whole number, e.g. {key}=1")
    return number


def parse_args(argv: Sequence[str]) -> PlanArgs:
    """Read ``CONFIG key=value ...`` (and ``--out DIR``).

    Words: ``seq`` (required, tokens), ``batch`` (default 1), ``dtype`` (bf16, fp16, fp32;
    default bf16), ``memory_gib`` (default 80), ``attn`` (default sdpa), ``optim`` (fused or
    foreach AdamW, default fused), ``out`` (a new folder), ``pdf`` (true/false, default true).

    Raises:
        PlanError: a missing CONFIG, an unknown word, or a bad value (the message names the fix).
    """
    parser = _Parser(prog="python -m reportgen.plan", add_help=True,
                                     description="Will a Hugging Face causal LM's training step fit? Offline, on "
                                                 "fake tensors.")
    parser.add_argument("config", nargs="?", help="a local config.json, or a folder holding one")
    parser.add_argument("words", nargs="*", help="key=value: seq (tokens), batch, dtype, memory_gib, attn, out, pdf")
    parser.add_argument("--out", dest="out_flag", default=None, help="output folder (must not exist yet)")
    ns, unknown = parser.parse_known_args(list(argv))
    if unknown:
        raise PlanError(f"unknown option(s) {' '.join(unknown)}; use key=value words: {', '.join(WORDS)}")
    usage = "usage: python -m reportgen.plan CONFIG seq=8192 batch=1 dtype=bf16 memory_gib=80"
    if not ns.config:
        raise PlanError(f"give a Hugging Face config.json (or its folder); {usage}")
    words = dict(WORDS)
    for word in ns.words:
        key, eq, value = word.partition("=")
        if not eq or key not in WORDS:
            raise PlanError(f"{word!r} is not a known key=value word; use {', '.join(WORDS)} ({usage})")
        words[key] = value
    if words["seq"] is None:
        raise PlanError(f"give the sequence length in tokens, e.g. seq=8192 ({usage})")
    if words["dtype"] not in DTYPES:
        raise PlanError(f"dtype={words['dtype']!r} is not one of {', '.join(DTYPES)}; e.g. dtype=bf16")
    try:
        memory = float(words["memory_gib"])
    except ValueError:
        memory = float("nan")
    if not (math.isfinite(memory) and memory > 0):
        raise PlanError(f"memory_gib={words['memory_gib']!r} must be a positive number of GiB, e.g. memory_gib=80")
    if words["optim"] not in OPTIMIZERS:
        raise PlanError(f"optim={words['optim']!r} is not one of {', '.join(OPTIMIZERS)} (AdamW implementations)")
    if words["pdf"].lower() not in ("true", "false"):
        raise PlanError(f"pdf={words['pdf']!r} must be true or false")
    out = ns.out_flag or words["out"] or None
    return PlanArgs(config=config_file(ns.config), seq=_positive_int("seq", words["seq"]),
                    batch=_positive_int("batch", words["batch"]), dtype=DTYPES[words["dtype"]],
                    dtype_name=words["dtype"], memory_gib=memory, attn=words["attn"],
                    out=Path(out) if out else None, pdf=words["pdf"].lower() == "true", optim=words["optim"])


def config_file(path: str | Path) -> Path:
    """The ``config.json`` that ``path`` names: the file itself, or ``<folder>/config.json``.

    Raises:
        PlanError: nothing there, or a folder without ``config.json``.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise PlanError(f"no Hugging Face config at {str(path)!r}; give a local config.json or the folder that holds "
                        "one (e.g. conf/plan/llama3_8b/config.json)")
    return path


def load_config(path: Path) -> Any:
    """``transformers.AutoConfig`` of a local ``config.json``, offline (``HF_HUB_OFFLINE=1``), with
    ``use_cache=False`` (training does not use the key/value cache).

    Raises:
        PlanError: transformers is missing, or cannot read the file as a config (not JSON, no
            ``model_type``, an unknown model type).
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import transformers  # noqa: F401 - the hf extra
        from transformers import AutoConfig
    except ImportError as exc:
        raise PlanError(f"the plan needs Hugging Face transformers ({exc}); install the hf extra: "
                        'pip install -e ".[hf]"') from exc
    try:
        json.loads(path.read_text())
        config = AutoConfig.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - JSON, OSError, ValueError (unknown model_type), KeyError ...
        reason = " ".join(str(exc).split())[:300]
        raise PlanError(f"transformers cannot read {str(path)!r} as a model config ({type(exc).__name__}: {reason}); "
                        "give a Hugging Face config.json with a model_type transformers knows (e.g. \"llama\")") from exc
    config.use_cache = False
    return config


# ------------------------------------------------------------------------------------- fake model
def build_causal_lm(config: Any, dtype: torch.dtype, attn: str, use_reentrant: bool | None) -> nn.Module:
    """``AutoModelForCausalLM.from_config(config, attn_implementation=attn)`` in ``dtype`` on CPU, in
    train mode, with the model's own recompute switch on when ``use_reentrant`` is not None.

    Call it inside a ``FakeTensorMode`` for the plan (no memory, no data) or outside for a real
    model (the equality test). Parameters are created in ``dtype`` directly (default dtype and
    device contexts, as :func:`reportgen.memory.estimate.fake_model`): fake parameters cannot be
    converted by ``Module.to``.

    Raises:
        PlanError: transformers has no causal LM for this config, or the model has no recompute
            switch.
    """
    import transformers
    from transformers import AutoModelForCausalLM

    dtype_kw = "dtype" if _version(transformers.__version__) >= (4, 56) else "torch_dtype"
    try:
        with torch.device("cpu"), default_dtype(dtype):
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, **{dtype_kw: dtype})
    except ValueError as exc:
        reason = " ".join(str(exc).split())[:300]
        raise PlanError(f"transformers cannot build a causal LM from this config with attn={attn} ({reason}); "
                        "give a decoder-only config (e.g. model_type llama, mistral, qwen2) or another attn=") from exc
    if use_reentrant is not None:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise PlanError(f"{type(model).__name__} has no gradient-checkpointing switch, so the recompute settings "
                            "cannot be planned; give a model type that supports it (e.g. llama)")
        from reportgen.models.hf import switch  # activation_checkpointing_enable on transformers 5, the old name on 4.x

        switch(model)({"use_reentrant": use_reentrant})
    return model.train()


def _version(text: str) -> tuple[int, int]:
    major, minor, *_ = (text.split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def layer_paths(model: nn.Module) -> list[str]:
    """Paths of the decoder layers (the modules the model's switch recomputes), in order: the
    children of the model's ``layers`` / ``h`` ``ModuleList`` (``model.layers.0`` ...)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h") and len(module):
            return [f"{name}.{i}" for i in range(len(module))]
    return []


def causal_lm_loss(output: Any, target: Tensor) -> Tensor:
    """Mean cross-entropy of ``output.logits`` ``[b, s, vocab]`` in float32 against next-token ids
    ``[b, s]`` (the loss of :class:`reportgen.models.hf.CausalLMTask`)."""
    return F.cross_entropy(output.logits.flatten(0, 1).float(), target.flatten())


def real_batch(batch: int, seq: int) -> tuple[dict[str, Tensor], Tensor]:
    """A packed batch on real tensors: ``({"input_ids": [b, s] int64 zeros, "attention_mask": [b, s]
    bool ones}, targets [b, s] int64 zeros)``."""
    ids = torch.zeros(batch, seq, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones(batch, seq, dtype=torch.bool)}, torch.zeros_like(ids)


@contextlib.contextmanager
def mask_constants(numel: int):
    """Let fake tensors of up to ``numel`` elements carry their values while inside.

    ``FakeTensorMode`` keeps the values of a fake tensor (a *constant*) only up to
    ``torch._subclasses.fake_tensor.CONSTANT_NUMEL_LIMIT`` elements (1); an op whose inputs are
    all constants is run on the values. Only the attention mask is made a constant here
    (:func:`fake_batch`), so with the limit raised to the mask's size its copies (the saved-bytes
    counter clones the batch) stay constants and transformers' ``padding_mask.all()`` reads True
    as on real tensors; no other tensor of the step gets values.
    """
    from torch._subclasses import fake_tensor

    previous = fake_tensor.CONSTANT_NUMEL_LIMIT
    fake_tensor.CONSTANT_NUMEL_LIMIT = max(previous, numel)
    try:  # imported now: the model's module imports it only once the model is built, inside this context
        masking = importlib.import_module("transformers.masking_utils")
    except ImportError:  # no transformers, or one without masking_utils (before 4.53)
        masking = None
    is_tracing = getattr(masking, "is_tracing", None)  # transformers 5: a fake tensor counts as tracing
    if is_tracing is not None:  # so it would keep a mask the real run skips; judge it as the real run does
        masking.is_tracing = lambda tensor=None: is_tracing(None) or (
            tensor is not None and not fake_tensor.is_fake(tensor) and is_tracing(tensor))
    try:
        yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = previous
        if is_tracing is not None:
            masking.is_tracing = is_tracing


def fake_batch(mode: Any, batch: int, seq: int) -> tuple[dict[str, Tensor], Tensor]:
    """:func:`real_batch` on fake tensors of ``mode``. The mask carries its values (a fake
    *constant*, ``b*s`` bytes of real memory; use it inside :func:`mask_constants`), so
    transformers' ``padding_mask.all()`` reads True exactly as on real tensors, and sdpa runs
    with ``is_causal`` as it would on a device; a mask without values would stop the step (a
    data-dependent ``.all()``)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        inputs, target = real_batch(batch, seq)
    convert = lambda t, const: mode.fake_tensor_converter.from_real_tensor(mode, t, make_constant=const)  # noqa: E731
    return ({"input_ids": convert(inputs["input_ids"], False),
             "attention_mask": convert(inputs["attention_mask"], True)}, convert(target, False))


# ------------------------------------------------------------------------------------------ plan
@dataclass
class SettingPlan:
    """The plan of one recompute setting.

    Attributes:
        setting: a name from :data:`SETTINGS`.
        saved_bytes: activation bytes autograd keeps after the forward at the reported batch, B.
        saved_per_layer: ``{layer path: bytes}`` of those, per decoder layer (plus
            ``"(rest of model)"``: embeddings, final norm, logits, loss), B.
        peak: the warm step's peak at the reported batch (:class:`reportgen.memory.peak.StepPeak`).
        peaks: ``{batch: peak bytes}`` of every batch counted, B.
        slope_bytes, intercept_bytes: the affine fit ``peak(b) = intercept + slope*b``, B (None
            when only one batch was needed: it does not fit at batch 1).
        largest_batch: the largest batch whose counted peak fits (0: not even 1 fits).
        largest_peak_bytes: the counted peak at ``largest_batch`` (None when 0), B.
        predicted_peak_bytes: the fit's peak at ``largest_batch`` (None when 0), B.
        note: how the largest batch was established, for the page.
    """

    setting: str
    saved_bytes: int
    saved_per_layer: dict[str, int]
    peak: StepPeak
    peaks: dict[int, int] = field(default_factory=dict)
    slope_bytes: float | None = None
    intercept_bytes: float | None = None
    largest_batch: int = 0
    largest_peak_bytes: int | None = None
    predicted_peak_bytes: float | None = None
    note: str = ""


@dataclass
class Plan:
    """The whole plan: the shape asked for and one :class:`SettingPlan` per recompute setting.

    Attributes:
        config_path: the ``config.json`` read.
        model_type, architecture: from the config (``llama``, ``LlamaForCausalLM``).
        shape: ``{name: value}`` of the config's architecture numbers shown on the page.
        seq, batch: tokens per sequence, sequences per batch of the reported figures.
        dtype: the ``dtype=`` word; attn: the attention implementation in force.
        memory_gib: the memory the step must fit in, GiB.
        parameters: parameter count; parameter_bytes, gradient_bytes, optimizer_bytes: their
            bytes, from the tracker at the plain peak's step (B).
        settings: per recompute setting.
        created: ISO 8601 time of the plan; seconds: wall time of the counting.
        optim: the AdamW implementation (a key of :data:`OPTIMIZERS`).
        versions: torch and transformers versions.
    """

    config_path: str
    model_type: str
    architecture: str
    shape: dict[str, Any]
    seq: int
    batch: int
    dtype: str
    attn: str
    memory_gib: float
    parameters: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    settings: list[SettingPlan]
    created: str
    seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    optim: str = "fused"


#: Architecture numbers shown from the config, when it has them.
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "vocab_size", "max_position_embeddings", "rope_theta", "sliding_window",
              "tie_word_embeddings", "attention_bias")


#: Phases whose peak grows with the batch (activations); the optimizer step's does not.
ACTIVATION_PHASES = ("forward", "backward", "recompute")


def fit_largest_batch(peak_at: Callable[[int], tuple[int, int]], memory_bytes: float, first: int,
                      max_counts: int = 12) -> dict[str, Any]:
    """The largest batch whose step peak fits in ``memory_bytes``: an affine fit, solved, confirmed by counts.

    A step's peak is the larger of its activation phases' peak (forward, backward, recompute),
    which for a fixed sequence is affine in the batch (``intercept + slope*b``), and the
    optimizer step's, which does not depend on the batch. So:

    1. count at ``first`` and ``first + 1``: the line through their activation-phase peaks;
    2. solve ``line(b) <= memory_bytes`` for the largest ``b``;
    3. count at that batch: confirmed when its step peak fits and its activation-phase peak is
       exactly on the line (then every larger batch is over the budget by the same line), and
       when it is one of the two fitted batches, by a count one batch above that does not fit.

    If a confirmation fails (the peak is not exactly affine there) the largest batch is found
    between the largest counted batch that fits and the smallest that does not, by the line
    through those two counts, until they are one batch apart. A batch that does not fit at 1
    gives 0 (the peak never falls as the batch grows).

    Args:
        peak_at: ``fn(batch) -> (step peak bytes, activation-phase peak bytes)``; each call is a
            counted step, B.
        memory_bytes: the budget, B.
        first: the first batch counted (the reported batch).
        max_counts: at most this many counts; then the largest counted batch that fits.

    Returns:
        ``{"largest", "slope", "intercept", "largest_peak", "predicted", "note", "counted"}``
        (bytes in B; ``counted``: ``{batch: (step peak, activation-phase peak)}``).
    """
    counted: dict[int, tuple[int, int]] = {}

    def at(batch: int) -> int:
        if batch not in counted:
            total, act = peak_at(batch)
            counted[batch] = (int(total), int(act))
        return counted[batch][0]

    result: dict[str, Any] = {"largest": 0, "slope": None, "intercept": None, "largest_peak": None,
                              "predicted": None, "counted": counted}
    if at(first) > memory_bytes and first == 1:
        return {**result, "note": f"batch 1 needs {format_bytes(counted[1][0])}, more than the budget"}
    at(first + 1)
    slope = float(counted[first + 1][1] - counted[first][1])
    intercept = counted[first][1] - slope * first
    result.update(slope=slope, intercept=intercept)
    if slope > 0:
        best = int(math.floor((memory_bytes - intercept) / slope))
        if best >= 1:
            fitted = intercept + slope * best
            if at(best) <= memory_bytes and counted[best][1] == round(fitted) and (
                    best not in (first, first + 1) or at(best + 1) > memory_bytes):
                how = (f"batch {best} counted {format_bytes(counted[best][0])}, exactly on the line"
                       if best not in (first, first + 1) else
                       f"batch {best} counted {format_bytes(counted[best][0])}, batch {best + 1} "
                       f"{format_bytes(counted[best + 1][0])}")
                result.update(largest=best, largest_peak=counted[best][0], predicted=fitted)
                return {**result, "note": (f"activation peak line {format_bytes(intercept)} + {format_bytes(slope)} x b "
                                           f"through batches {first} and {first + 1}, solved for the budget; {how}")}
        elif at(1) > memory_bytes:
            return {**result, "note": f"batch 1 needs {format_bytes(counted[1][0])}, more than the budget"}
    while len(counted) < max_counts:  # the line was not exact: close the bracket on counted peaks
        fits = [b for b, (p, _) in counted.items() if p <= memory_bytes]
        over = [b for b, (p, _) in counted.items() if p > memory_bytes]
        floor_b = max(fits) if fits else 0
        ceil_b = min(over) if over else max(counted) * 2
        if ceil_b == floor_b + 1:
            break
        if ceil_b in counted and floor_b in counted and counted[ceil_b][0] > counted[floor_b][0]:
            step = (counted[ceil_b][0] - counted[floor_b][0]) / (ceil_b - floor_b)
            guess = floor_b + int((memory_bytes - counted[floor_b][0]) // step)
        else:
            guess = ceil_b
        at(min(max(guess, floor_b + 1), ceil_b - 1) if ceil_b in counted else ceil_b)
    fits = [b for b, (p, _) in counted.items() if p <= memory_bytes]
    best = max(fits) if fits else 0
    over = [b for b, (p, _) in counted.items() if p > memory_bytes]
    result.update(largest=best, largest_peak=counted[best][0] if best else None)
    closed = over and min(over) == best + 1
    return {**result, "note": (f"batch {best} counted {format_bytes(counted[best][0]) if best else '-'}, batch "
                               f"{min(over)} {format_bytes(counted[min(over)][0])} ({len(counted)} counts; the peak "
                               "is not exactly affine in the batch here)" if closed else
                               f"after {len(counted)} counts the largest counted batch that fits is {best}")}


def plan_setting(config: Any, args: PlanArgs, name: str, use_reentrant: bool | None) -> tuple[SettingPlan, int]:
    """Count one recompute setting on fake tensors: saved bytes and step peak at ``args.batch``, and
    the largest batch that fits. Returns the plan and the model's parameter count.

    Raises:
        PlanError: the shape cannot be built (a size that overflows).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from reportgen.memory.saved import saved_activation_bytes

    memory_bytes = args.memory_gib * 2**30
    # any size: only the mask is made a constant, and a mask that does not fit is never counted
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, mask_constants(sys.maxsize):
        model = build_causal_lm(config, args.dtype, args.attn, use_reentrant)
        n_params = sum(p.numel() for p in model.parameters())
        paths = layer_paths(model)
        peaks: dict[int, StepPeak] = {}

        def count(batch: int) -> int:
            peaks[batch] = warm_step_peak(model, fake_batch(mode, batch, args.seq), causal_lm_loss,
                                          OPTIMIZERS[args.optim], None, warm_steps=0)
            peak = peaks[batch]
            return peak.peak_bytes, max(peak.phase_peaks.get(p, 0) for p in ACTIVATION_PHASES)

        saved = saved_activation_bytes(model, fake_batch(mode, args.batch, args.seq), causal_lm_loss, None, paths)
        fit = fit_largest_batch(count, memory_bytes, args.batch)
    plan = SettingPlan(name, saved.total_bytes, dict(saved.per_module), peaks[args.batch],
                       {b: p.peak_bytes for b, p in sorted(peaks.items())}, fit["slope"], fit["intercept"],
                       fit["largest"], fit["largest_peak"], fit["predicted"], fit["note"])
    return plan, n_params


def make_plan(args: PlanArgs, log: Callable[[str], None] = lambda line: None) -> Plan:
    """Read the config and count every setting of :data:`SETTINGS` (see the module docstring).

    Raises:
        PlanError: an unreadable config, a model transformers cannot build, or a shape that
            overflows (tensor sizes beyond what torch can index).
    """
    import time

    import transformers

    start = time.perf_counter()
    config = load_config(args.config)
    settings, n_params = [], 0
    for name, use_reentrant in SETTINGS:
        try:
            plan, n_params = plan_setting(config, args, name, use_reentrant)
        except PlanError:
            raise
        except (RuntimeError, OverflowError, MemoryError) as exc:
            reason = " ".join(str(exc).split())[:200]
            raise PlanError(f"the shape seq={args.seq} batch={args.batch} overflows what torch can count "
                            f"({type(exc).__name__}: {reason}); give a smaller seq= or batch=") from exc
        log(f"  {name}: peak {format_bytes(plan.peak.peak_bytes)} at batch {args.batch}, largest batch "
            f"{plan.largest_batch} ({time.perf_counter() - start:.1f} s)")
        settings.append(plan)
    cats = settings[0].peak.categories
    # gradients are alive in full only after backward; count them as the parameters' size
    shape = {k: getattr(config, k) for k in SHAPE_KEYS if getattr(config, k, None) is not None}
    return Plan(config_path=str(args.config), model_type=str(getattr(config, "model_type", "")),
                architecture=", ".join(getattr(config, "architectures", None) or []) or "",
                shape=shape, seq=args.seq, batch=args.batch, dtype=args.dtype_name, attn=args.attn,
                memory_gib=args.memory_gib, parameters=n_params, parameter_bytes=cats["parameters"],
                gradient_bytes=n_params * args.dtype.itemsize, optimizer_bytes=cats["optimizer state"],
                settings=settings, created=dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
                seconds=time.perf_counter() - start,
                versions={"torch": torch.__version__, "transformers": transformers.__version__}, optim=args.optim)


# ---------------------------------------------------------------------------------------- output
#: Columns of plan.csv (one row per setting and quantity; ``scope`` is "total" or a layer path).
CSV_COLUMNS = ("setting", "quantity", "scope", "batch", "bytes", "gib", "detail")


def plan_rows(plan: Plan) -> list[dict[str, Any]]:
    """plan.csv as records: per setting the step peak and what is alive at it (by category),
    saved-activation bytes in total and per decoder layer, the counted peaks per batch and the
    largest batch; then parameters, gradients and optimizer state (bytes in B, GiB = B / 2**30)."""
    rows: list[dict[str, Any]] = []

    def add(setting: str, quantity: str, scope: str, batch: int | None, nbytes: float | None, detail: str = "") -> None:
        rows.append({"setting": setting, "quantity": quantity, "scope": scope, "batch": batch,
                     "bytes": None if nbytes is None else int(round(nbytes)),
                     "gib": None if nbytes is None else round(nbytes / 2**30, 4), "detail": detail})

    for s in plan.settings:
        add(s.setting, "step peak", "total", plan.batch, s.peak.peak_bytes, where_text(s.peak))
        for category, nbytes in s.peak.categories.items():
            add(s.setting, f"at peak: {category}", "total", plan.batch, nbytes)
        for region, nbytes in s.peak.recomputed_by_region.items():
            add(s.setting, "at peak: recomputed activations", region, plan.batch, nbytes)
        add(s.setting, "saved activations", "total", plan.batch, s.saved_bytes)
        for path, nbytes in s.saved_per_layer.items():
            add(s.setting, "saved activations", path, plan.batch, nbytes)
        for batch, nbytes in s.peaks.items():
            add(s.setting, "counted step peak", "total", batch, nbytes)
        add(s.setting, "largest batch that fits", "total", s.largest_batch, s.largest_peak_bytes, s.note)
    add("all", "parameters", "total", None, plan.parameter_bytes, f"{plan.parameters:,} parameters")
    add("all", "gradients", "total", None, plan.gradient_bytes, "one per parameter, same dtype")
    add("all", "optimizer state", "total", None, plan.optimizer_bytes, "AdamW exp_avg, exp_avg_sq, step")
    return rows


def where_text(peak: StepPeak) -> str:
    """Where a peak happened, for the table: ``"backward at model.layers.3"``."""
    from reportgen.memory.peak import where

    return where(peak)


def csv_text(plan: Plan) -> str:
    """plan.csv's text (:func:`plan_rows`, columns :data:`CSV_COLUMNS`)."""
    import pandas as pd

    frame = pd.DataFrame(plan_rows(plan), columns=list(CSV_COLUMNS))
    return frame.astype({"batch": "Int64", "bytes": "Int64"}).to_csv(index=False)


def console_table(plan: Plan) -> str:
    """The short table printed to the console: per setting saved bytes, step peak and the largest batch."""
    head = (f"{plan.architecture or plan.model_type}: {plan.parameters / 1e9:.2f} B parameters, seq={plan.seq} "
            f"batch={plan.batch} dtype={plan.dtype} attn={plan.attn} optim={plan.optim} AdamW, budget {plan.memory_gib:g} GiB "
            f"({plan.seconds:.1f} s)")
    lines = [head, f"{'recompute':<14}{'saved':>12}{'step peak':>12}  {'largest batch':>13}  peak at"]
    for s in plan.settings:
        lines.append(f"{s.setting:<14}{format_bytes(s.saved_bytes):>12}{format_bytes(s.peak.peak_bytes):>12}  "
                     f"{s.largest_batch:>13}  {where_text(s.peak)}")
    lines.append(f"parameters {format_bytes(plan.parameter_bytes)}, gradients {format_bytes(plan.gradient_bytes)}, "
                 f"AdamW state {format_bytes(plan.optimizer_bytes)}; not counted: allocator fragmentation and "
                 "caching, communication buffers, CUDA workspace")
    return "\n".join(lines)


def html_text(plan: Plan) -> str:
    """plan.html: the plan through ``templates/plan.html.j2`` (autoescape, StrictUndefined)."""
    from reportgen.report.render import environment

    return environment().get_template("plan.html.j2").render(plan=plan, assumptions=ASSUMPTIONS, where=where_text)


def new_folder(out: Path | None, now: dt.datetime) -> Path:
    """The folder the plan goes to: ``out``, or ``outputs/plans/<date>/<time>/`` (a suffix ``-1``,
    ``-2`` ... when that exists). Nothing is created here.

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


def write_plan(plan: Plan, folder: Path, pdf: bool = True) -> dict[str, Path]:
    """Write plan.csv, plan.html (and plan.pdf) into the new ``folder``, all or nothing: the files
    are rendered first, written into a temporary folder beside it, which is then renamed.

    Returns:
        ``{"csv", "html", "pdf"}`` paths written.

    Raises:
        PlanError: the folder cannot be written (the message names it).
    """
    from reportgen.report.render import write_pdf

    files = {"plan.csv": csv_text(plan).encode(), "plan.html": html_text(plan).encode()}
    if pdf:
        files["plan.pdf"] = write_pdf(files["plan.html"].decode(), plan.created,
                                      [("plan.csv", files["plan.csv"], "Data", "the plan's figures")])
    staging = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; a plan folder is an ordinary one
        for name, data in files.items():
            (staging / name).write_bytes(data)
        os.rename(staging, folder)
    except OSError as exc:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise PlanError(f"cannot write the plan to {str(folder)!r} ({exc.strerror or exc}); give a writable out=") from exc
    return {name.split(".")[1]: folder / name for name in files}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reportgen.plan CONFIG seq=... [batch= dtype= memory_gib= attn= out= pdf=]``.

    Returns:
        0 when the plan was written; 2 (one line on stderr naming the fix, nothing written) on
        bad input, an unreadable config or a shape that overflows; 70 (one line) on
        reportgen's own bug; 130 on Ctrl-C (nothing written either way).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)
        folder = new_folder(args.out, dt.datetime.now())
        plan = make_plan(args, log=lambda line: print(line, file=sys.stderr, flush=True))
        paths = write_plan(plan, folder, pdf=args.pdf)
    except PlanError as exc:
        print(f"reportgen.plan: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("reportgen.plan: interrupted; nothing written", file=sys.stderr)
        return EXIT_SIGINT
    except Exception as exc:  # noqa: BLE001 - reportgen's own bug: one line, not a traceback
        reason = " ".join(str(exc).split())[:300]
        print(f"reportgen.plan: internal error ({type(exc).__name__}: {reason}); nothing written; please report it "
              "with the command line", file=sys.stderr)
        return EXIT_BUG
    print(console_table(plan))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
