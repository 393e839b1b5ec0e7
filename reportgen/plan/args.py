"""The command line of ``python -m reportgen.plan`` and the config it reads, checked: one line naming
the fix on bad input (exit 2, nothing written): a :class:`PlanError` for unknown words and bad values, a
:class:`reportgen.errors.SetupError` from :func:`reportgen.models.hf.auto.load_config` for the config.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reportgen.errors import UsageError
from reportgen.results.row import to_float


class PlanError(UsageError, ValueError):
    """Bad command-line input or a config that cannot be planned (exit 2, one line, the fix)."""


#: ``dtype=`` words and the dtype they mean.
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
DTYPES |= {"fp32": torch.float32, "float32": torch.float32}

#: Sharding strategies: ``none`` (one process holds everything), ``ddp`` (replicated state, gradient
#: buckets), ``fsdp`` (FSDP2 ``fully_shard`` over all ranks), ``hsdp`` (``replicate`` groups, each
#: sharding over ``world_size / replicate`` ranks).
STRATEGIES = ("none", "ddp", "fsdp", "hsdp")

#: Optimizers: AdamW fused (one kernel, no temporaries; transformers' Trainer default with torch >=
#: 2.8) or foreach (torch's CUDA default: one parameter-sized temporary, ``_multi_tensor_adamw``'s
#: ``exp_avg_sq_sqrt``), SGD with momentum (one state), Adafactor-like factored second moment (a row
#: and a column vector per matrix, full size for vectors; torch.optim.Adafactor).
OPTIMS = ("fused", "foreach", "sgd", "adafactor")

#: More tokens per micro-batch (``seq x batch``) than this is refused: the traced batch's attention mask is
#: real, one byte per token (256 MiB here), and no published training run comes near (131072 x 2048).
MAX_TOKENS = 2**28

#: ``key=value`` words the command takes, with their defaults (None = required; "" = not given).
WORDS = {"seq": "", "batch": "1", "dtype": "bf16", "memory_gib": "", "attn": "sdpa", "optim": "fused"}
WORDS |= {"world_size": "1", "strategy": "none", "replicate": "1", "master_dtype": "", "reduce_dtype": ""}
WORDS |= {"optim_dtype": "", "grad_accum": "1", "recompute": "", "safety_margin": "0.05", "fragmentation": "0.10"}
WORDS |= {"largest_batch": "false", "allow_long_seq": "false", "out": "", "pdf": "false"}

USAGE = "usage: python -m reportgen.plan CONFIG seq=8192 batch=2 dtype=bf16 world_size=8 strategy=fsdp memory_gib=80"


@dataclass(kw_only=True)
class PlanArgs:
    """The command line, checked: the words of :data:`WORDS` (docs/planning.md, "Words", says what each means)
    as values. ``config`` is the ``config.json`` file; dtype words are torch dtypes (``dtype_name`` keeps
    ``dtype=``'s word); ``memory_gib`` None: no budget, nothing is chosen; ``recompute`` None: every policy of
    :data:`reportgen.plan.policies.POLICIES`; ``out`` None: ``outputs/plans/<date>/<time>/``.
    """

    config: Path
    seq: int
    batch: int
    dtype: torch.dtype
    dtype_name: str
    memory_gib: float | None
    attn: str = "sdpa"
    optim: str = "fused"
    world_size: int = 1
    strategy: str = "none"
    replicate: int = 1
    master_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32
    optim_dtype: torch.dtype = torch.float32
    grad_accum: int = 1
    recompute: str | None = None
    safety_margin: float = 0.05
    fragmentation: float = 0.10
    largest_batch: bool = False
    allow_long_seq: bool = False
    out: Path | None = None
    pdf: bool = False

    @property
    def shard(self) -> int:
        """Ranks one copy of the state is sharded over (1 for ``none`` and ``ddp``)."""
        if self.strategy == "fsdp":
            return self.world_size
        return self.world_size // self.replicate if self.strategy == "hsdp" else 1


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`PlanError` (one line, exit 2) instead of printing usage and exiting."""

    def error(self, message: str):  # argparse's hook
        raise PlanError(f"{message}; {USAGE}")


def _whole(key: str, value: str, example: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise PlanError(f"{key}={value!r} must be a positive whole number, e.g. {key}={example}")
    return number


def _share(key: str, value: str) -> float:
    number = to_float(value)
    if not (0 <= number < 1):
        raise PlanError(f"{key}={value!r} must be a share between 0 and 1, e.g. {key}=0.05")
    return number


def _dtype(key: str, value: str, default: torch.dtype | None = None) -> torch.dtype:
    if default is not None and not value:
        return default
    if value not in DTYPES:
        raise PlanError(f"{key}={value!r} is not one of {', '.join(DTYPES)}; e.g. {key}=bf16")
    return DTYPES[value]


def _choice(key: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise PlanError(f"{key}={value!r} is not one of {', '.join(choices)}")
    return value


def read_words(argv: Sequence[str]) -> tuple[str, dict[str, str], str | None]:
    """``(CONFIG, {word: value}, --out)`` from the command line, defaults filled in.

    Raises:
        PlanError: no CONFIG, an unknown option or word.
    """
    parser = _Parser(
        prog="python -m reportgen.plan",
        add_help=True,
        description="Will a Hugging Face causal LM's training step fit per rank? Offline, on fake tensors.",
    )
    parser.add_argument("config", nargs="?", help="a local config.json, or a folder holding one")
    parser.add_argument("words", nargs="*", help=f"key=value: {', '.join(WORDS)}")
    parser.add_argument("--out", dest="out_flag", default=None, help="output folder (must not exist yet)")
    ns, unknown = parser.parse_known_args(list(argv))
    if unknown:
        raise PlanError(f"unknown option(s) {' '.join(unknown)}; use key=value words: {', '.join(WORDS)}")
    if not ns.config:
        raise PlanError(f"give a Hugging Face config.json (or its folder); {USAGE}")
    words = dict(WORDS)
    for word in ns.words:
        key, eq, value = word.partition("=")
        if not eq or key not in WORDS:
            raise PlanError(f"{word!r} is not a known key=value word; use {', '.join(WORDS)} ({USAGE})")
        words[key] = value
    if not words["seq"]:
        raise PlanError(f"give the sequence length in tokens, e.g. seq=8192 ({USAGE})")
    return ns.config, words, ns.out_flag


def parse_args(argv: Sequence[str]) -> PlanArgs:
    """Read ``CONFIG key=value ...`` (and ``--out DIR``); the words and defaults are :data:`WORDS`.

    Mixed precision defaults (FSDP2's ``MixedPrecisionPolicy`` as torchtitan sets it): with
    ``strategy=fsdp``/``hsdp`` and a 16-bit ``dtype``, parameters are stored in float32 and
    gradients reduced in float32; otherwise everything is in ``dtype`` (pure low-precision
    training). The optimizer state follows the stored parameters unless ``optim_dtype`` says.

    Raises:
        PlanError: no CONFIG, an unknown word, or a bad value (the message names the fix).
        reportgen.errors.SetupError: no config.json at CONFIG.
    """
    config, words, out_flag = read_words(argv)
    from reportgen.plan.policies import names as policy_names

    dtype = _dtype("dtype", words["dtype"])
    strategy = _choice("strategy", words["strategy"], STRATEGIES)
    world, replicate = _whole("world_size", words["world_size"], "8"), _whole("replicate", words["replicate"], "2")
    if strategy == "none" and world > 1:
        raise PlanError(f"world_size={world} needs a strategy: strategy=fsdp, hsdp or ddp")
    if strategy == "hsdp" and (world % replicate or replicate == world):
        raise PlanError(
            f"strategy=hsdp needs replicate= dividing world_size={world} into groups of 2 or more ranks, "
            f"e.g. replicate={max(1, world // 8)}"
        )
    sharded_mp = strategy in ("fsdp", "hsdp") and dtype.itemsize == 2
    master = _dtype("master_dtype", words["master_dtype"], torch.float32 if sharded_mp else dtype)
    reduce, optim_dtype = (_dtype(key, words[key], master) for key in ("reduce_dtype", "optim_dtype"))
    memory = None
    if words["memory_gib"]:
        memory = to_float(words["memory_gib"])
        if not (math.isfinite(memory) and memory > 0):
            raise PlanError(f"memory_gib={words['memory_gib']!r} must be a positive number of GiB, e.g. memory_gib=80")
    recompute = words["recompute"] or None
    if recompute is not None and recompute not in policy_names():
        raise PlanError(
            f"recompute={recompute!r} is not one of {', '.join(policy_names())} (or leave it out: "
            "every policy is planned)"
        )
    for key in ("pdf", "largest_batch", "allow_long_seq"):
        if words[key].lower() not in ("true", "false"):
            raise PlanError(f"{key}={words[key]!r} must be true or false")
    if words["largest_batch"].lower() == "true" and memory is None:
        raise PlanError("largest_batch=true needs the device memory: give memory_gib=, e.g. memory_gib=80")
    out = out_flag or words["out"] or None
    seq, batch = _whole("seq", words["seq"], "8192"), _whole("batch", words["batch"], "1")
    if seq * batch > MAX_TOKENS:
        raise PlanError(
            f"seq={seq} batch={batch} is {seq * batch} tokens per micro-batch, more than the plan traces "
            f"({MAX_TOKENS}: its attention mask is one byte per token of host memory); give a smaller seq= or batch="
        )
    from reportgen.models.hf.auto import config_file

    return PlanArgs(
        config=config_file(config, name=None),
        seq=seq,
        batch=batch,
        dtype=dtype,
        dtype_name=words["dtype"],
        memory_gib=memory,
        attn=words["attn"],
        optim=_choice("optim", words["optim"], OPTIMS),
        world_size=world,
        strategy=strategy,
        replicate=replicate if strategy == "hsdp" else 1,
        master_dtype=master,
        reduce_dtype=reduce,
        optim_dtype=optim_dtype,
        grad_accum=_whole("grad_accum", words["grad_accum"], "1"),
        recompute=recompute,
        safety_margin=_share("safety_margin", words["safety_margin"]),
        fragmentation=_share("fragmentation", words["fragmentation"]),
        out=Path(out) if out else None,
        pdf=words["pdf"].lower() == "true",
        largest_batch=words["largest_batch"].lower() == "true",
        allow_long_seq=words["allow_long_seq"].lower() == "true",
    )


def load_config(path: Path) -> Any:
    """The planner's config: :func:`reportgen.models.hf.auto.load_config` offline (``HF_HUB_OFFLINE=1``), with
    the planner's bounds and ``use_cache=False`` (training does not use the key/value cache)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from reportgen.models.hf.auto import load_config as load

    return load(path, name=None, bounded=True, use_cache=False)


def check_positions(config: Any, args: PlanArgs) -> str | None:
    """Refuse a ``seq`` beyond the config's ``max_position_embeddings`` unless ``allow_long_seq=true``.

    The model was built for at most that many positions: learned position embeddings have no row
    beyond it, and rotary scaling is defined up to it; a plan there describes no model anyone trains.

    Returns:
        None when ``seq`` is within the limit (or the config states none), else (``allow_long_seq=true``)
        the warning line to print.

    Raises:
        PlanError: ``seq`` is beyond the limit and ``allow_long_seq`` is not set.
    """
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int) or args.seq <= limit:
        return None
    said = f"seq={args.seq} is beyond this config's max_position_embeddings={limit}"
    if not args.allow_long_seq:
        raise PlanError(f"{said}; give seq={limit} or less (or allow_long_seq=true to plan it anyway)")
    return f"warning: {said}; planned as asked (allow_long_seq=true), for a model that was not built for it"
