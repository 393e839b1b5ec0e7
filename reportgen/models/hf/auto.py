"""Any Hugging Face causal LM from a local ``config.json`` (or local weights), and a text task for it.

``python -m reportgen +model=hf_causal_lm model.config=PATH`` tests a user's own architecture with one
command: no factory, batch function or loss to write. Nothing is downloaded; every bad input is a
:class:`reportgen.errors.SetupError` naming the fix (exit 2). :func:`load_config` and :func:`auto_model`
are the planner's too (:mod:`reportgen.plan`).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reportgen.errors import SetupError
from reportgen.models.hf import CausalLMTask, require_transformers

#: The tiny example config shipped with reportgen (``conf/examples/...``), named in messages.
EXAMPLE = "conf/examples/hf_causal_lm/config.json"
#: Upper bounds of the sizes a planned config may state (``load_config(bounded=True)``), far above every
#: published model (Llama 3.1 405B: hidden 16384, intermediate 53248, 128 heads, vocabulary 128256).
BOUNDS = {
    "hidden_size": 65536,
    "intermediate_size": 262144,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "vocab_size": 4_194_304,
    "max_position_embeddings": 4_194_304,
    "head_dim": 4096,
}
#: More decoder layers than this is refused with ``bounded``: the largest published decoder stacks have ~128.
MAX_LAYERS = 1024
#: Config fields that bound the sequence length, in the order transformers' families use them.
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")


def config_file(path: str | Path, name: str | None = "model.config") -> Path:
    """The ``config.json`` that ``path`` names: the file itself, or ``path/config.json`` for a folder.

    Args:
        path: file or folder.
        name: the setting that gave ``path``, for the message (None: the planner's CONFIG argument).

    Raises:
        SetupError: nothing is there (the message says what to pass).
    """
    given = Path(str(path)).expanduser()
    found = given / "config.json" if given.is_dir() else given
    if not found.is_file() and (shipped := _shipped(given)) is not None:
        return shipped
    if not found.is_file():
        setting = f"{name}=" if name else ""
        raise SetupError(
            f"{setting}{path}: no such {'file' if not given.is_dir() else 'config.json in that folder'}"
            f". Give a local config.json or a folder holding one (nothing is downloaded), e.g. {setting}{EXAMPLE}"
        )
    return found


def _shipped(given: Path) -> Path | None:
    """The config.json a relative ``given`` names among the configs reportgen ships (``conf/plan/llama3_8b``,
    ``plan/llama3_8b`` or ``conf/examples/...``, as the README writes them from a checkout), so the same command works
    from an installed wheel; None when it names none, or is absolute."""
    if given.is_absolute():
        return None
    from reportgen.paths import conf_dir

    for root in (conf_dir().parent, conf_dir()):
        candidate = root / given
        candidate = candidate / "config.json" if candidate.is_dir() else candidate
        if candidate.is_file():
            return candidate
    return None


def load_config(path: str | Path, name: str | None = "model.config", bounded: bool = False, **overrides: Any) -> Any:
    """A transformers config object from a local ``config.json`` (or a folder holding one): nothing is
    downloaded, no remote code runs, transformers never prompts. The one loader of the main command's
    ``model.config`` / ``model.pretrained`` and of the planner's CONFIG.

    Args:
        path, name: as :func:`config_file`.
        bounded: also refuse a size that is not a positive integer or lies beyond :data:`BOUNDS`, and more
            than :data:`MAX_LAYERS` decoder layers (the planner's bounds, docs/trust.md).
        **overrides: config fields set over the file's (the planner: ``use_cache=False``).

    Returns:
        An instance of the config class its ``model_type`` names (``AutoConfig.for_model``).

    Raises:
        SetupError: transformers is missing; the file is not a JSON object, has no ``model_type``, or a
            ``model_type`` the installed transformers does not know; it needs remote code
            (``auto_map``); the config class refuses its fields; with ``bounded``, a size out of bounds.
    """
    hf = require_transformers()
    file = config_file(path, name)
    where = f"{name}={path}: {file}" if name else str(file)
    try:
        fields = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SetupError(f"{where} is not valid JSON ({exc}); give a Hugging Face config.json") from None
    if not isinstance(fields, dict) or not isinstance(fields.get("model_type"), str):
        raise SetupError(
            f'{where} has no "model_type" (e.g. "llama", "gpt2"); a Hugging Face '
            "config.json names its architecture there"
        )
    if fields.get("auto_map"):
        raise SetupError(
            f"{where} needs remote code (auto_map), which reportgen never downloads or "
            "runs; use an architecture built into transformers, or your own factory (docs/own-model.md)"
        )
    for key, bound in BOUNDS.items() if bounded else ():
        value = fields.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SetupError(f"{where}: {key} is {value!r}; it must be a positive integer (at most {bound})")
        if value is not None and value > bound:
            raise SetupError(
                f"{where}: {key} is {value}, above the bound of {bound} that reportgen accepts (no published model "
                "comes near it); fix the config"
            )
    kind = fields.pop("model_type")
    try:
        config = hf.AutoConfig.for_model(kind, **{**fields, **overrides})
    except Exception as exc:  # noqa: BLE001 - ValueError (unknown model_type, a refused field), TypeError ...
        if "Unrecognized model identifier" in str(exc):
            raise SetupError(
                f"{where}: model_type {kind!r} is not known to the installed transformers "
                f"{hf.__version__}; upgrade it (pip install -U transformers) or fix model_type"
            ) from None
        reason = " ".join(str(exc).split())[:200]
        raise SetupError(
            f"{where}: transformers cannot read it as a model config ({type(exc).__name__}: {reason}); fix the config"
        ) from None
    layers = getattr(config, "num_hidden_layers", None)
    if bounded and isinstance(layers, int) and not 1 <= layers <= MAX_LAYERS:
        raise SetupError(
            f"{where}: num_hidden_layers={layers} is outside 1..{MAX_LAYERS}; give the model's real layer count"
        )
    if missing := missing_sizes(config, fields):
        defaults = ", ".join(f"{name}={getattr(config, name)!r}" for name in missing)
        raise SetupError(
            f"{where} does not set {', '.join(missing)}: transformers would silently use {kind}'s defaults "
            f"({defaults}), another model than the one meant; set them in config.json"
        )
    return config


#: The sizes that make a model what it is; a config.json must state each its config class has (under its own name
#: or an alias of the class's ``attribute_map``, e.g. GPT-2's ``n_embd``) rather than take the class's default.
SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def missing_sizes(config: Any, fields: dict) -> list[str]:
    """The :data:`SIZES` that ``config`` (a transformers config) has but ``fields`` (its config.json) does not set."""
    aliases = getattr(type(config), "attribute_map", {}) or {}
    return [name for name in SIZES if hasattr(config, name) and name not in fields and aliases.get(name) not in fields]


def model_config(config: str | None, pretrained: str | None) -> Any:
    """The config of the model to build: ``model.config``'s, or the local ``model.pretrained`` folder's.

    Raises:
        SetupError: neither or both given, or see :func:`load_config` / :func:`pretrained_folder`.
    """
    if (config is None) == (pretrained is None):
        raise SetupError(
            "+model=hf_causal_lm needs exactly one of model.config=PATH (a local config.json or a folder "
            "holding one: random weights) or model.pretrained=FOLDER (local weights), e.g. "
            f"model.config={EXAMPLE}"
        )
    return load_config(config if config is not None else str(pretrained_folder(str(pretrained))))


def pretrained_folder(path: str) -> Path:
    """The local folder ``model.pretrained`` names (a ``save_pretrained`` folder).

    Raises:
        SetupError: it is not a local folder with a config.json (a Hub name is refused: nothing
            is downloaded).
    """
    folder = Path(str(path)).expanduser()
    if (folder / "config.json").is_file():
        return folder
    if folder.is_absolute() or str(path).startswith((".", "~")) or folder.exists():  # a local path, not a Hub name
        what = "is a folder without config.json" if folder.is_dir() else "does not exist"
        raise SetupError(
            f"model.pretrained={path} {what}; give the folder save_pretrained wrote (it holds "
            "config.json and the weights)"
        )
    raise SetupError(
        f"model.pretrained={path} is not a local folder holding config.json; reportgen never downloads. "
        f"Download it first (e.g. `hf download {path} --local-dir ./{Path(str(path)).name}`) and "
        "pass that folder"
    )


def max_positions(cfg: Any) -> int | None:
    """The longest sequence the config allows (its first :data:`POSITION_FIELDS` field), or None."""
    return next((v for name in POSITION_FIELDS if isinstance(v := getattr(cfg, name, None), int) and v > 0), None)


def causal_lm(
    task: Any,
    config: str | None = None,
    pretrained: str | None = None,
    attn_implementation: str | None = None,
    use_cache: bool = False,
) -> nn.Module:
    """A Hugging Face causal LM: random weights from a local config.json, or local weights.

    Args:
        task: a :class:`TextCausalLMTask` (its ids must fit the embedding, its windows the positions).
        config: a local ``config.json`` or a folder holding one (random init; reportgen seeds
            torch with ``seed`` before this call).
        pretrained: a local ``save_pretrained`` folder, loaded with ``from_pretrained(...,
            local_files_only=True)``; give this or ``config``, not both.
        attn_implementation: ``"eager"``, ``"sdpa"``, ...; None = what transformers picks.
        use_cache: return the key/value cache (default False, see :func:`reportgen.models.hf.gpt2`).

    Returns:
        The ``AutoModelForCausalLM`` class for the config's ``model_type``, e.g. ``Qwen2ForCausalLM``.

    Raises:
        SetupError: see :func:`model_config`; the architecture has no causal-LM head in this
            transformers; the task's ids or windows do not fit the config.
    """
    cfg = model_config(config, pretrained)
    cfg.use_cache = use_cache
    model = auto_model(cfg, task=task, pretrained=pretrained, attn=attn_implementation)
    refuse_non_causal(model, cfg)
    return model


def refuse_non_causal(model: nn.Module, cfg: Any) -> None:
    """Refuse a "causal LM" whose earlier positions see later tokens (e.g. BERT's LM head without
    ``is_decoder: true``): the next-token metric would then read the answer.

    The probe: logits of a random window, and of the same window with its last token changed, in
    eval mode without grad (no generator is drawn from, no weight changes); every position but
    the last must agree (``allclose``, rtol 1e-4, atol 1e-5).

    A model built on fake tensors (the GPU-free memory estimate, :mod:`reportgen.memory.estimate`)
    is not probed: fake tensors have shapes but no values to compare, and the same factory already
    probed the real twins with the same config.

    Raises:
        SetupError: naming ``is_decoder: true`` in config.json as the fix.
    """
    from torch._subclasses.fake_tensor import is_fake

    vocab, length = int(cfg.vocab_size), min(8, max_positions(cfg) or 8)
    if vocab < 2 or length < 2 or any(is_fake(p) for p in model.parameters()):
        return
    ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % vocab
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            before, after = (model(input_ids=x).logits[0, :-1] for x in (ids, changed))
    finally:
        model.train(was_training)
    if not torch.allclose(before, after, rtol=1e-4, atol=1e-5):
        raise SetupError(
            f"{type(model).__name__} is not causal with this config: changing the last token changes the "
            "logits of earlier positions, so a next-token metric would read the answer; set "
            '"is_decoder": true in config.json (encoder models such as BERT), or give a decoder-only config'
        )


#: Per auto class: the head it adds and what the main command's config for it tests (named when an
#: architecture has no such head).
HEADS = {
    "AutoModelForCausalLM": ("causal-LM head", "+model=hf_causal_lm tests decoder-only language models"),
    "AutoModelForMaskedLM": ("masked-LM head", "+model=hf_masked_lm tests encoder models with a masked-LM head"),
}


@contextlib.contextmanager
def without_detection_losses():
    """While inside, transformers reads scipy as absent, if its modeling code is not imported yet.

    ``transformers.modeling_utils`` imports its loss zoo, whose object-detection losses import
    ``scipy.optimize`` (Hungarian matching) when scipy is installed: about 0.4 s of CPU (a tenth of a
    plan's run) for code a language model never calls. Those modules then run as on a machine without
    scipy (their loss raises asking for scipy); nothing else reads the flag at import. Once
    transformers' modeling code is imported this does nothing.
    """
    if "transformers.modeling_utils" in sys.modules or "scipy.optimize" in sys.modules:
        yield
        return
    import transformers.utils as hf_utils

    found = hf_utils.is_scipy_available
    hf_utils.is_scipy_available = lambda: False
    try:
        yield
    finally:
        hf_utils.is_scipy_available = found


def auto_model(
    cfg: Any,
    auto_class: str = "AutoModelForCausalLM",
    scope: str | None = None,
    *,
    task: Any = None,
    pretrained: str | None = None,
    attn: str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """``transformers.<auto_class>`` built from ``cfg`` (random init) or loaded from ``pretrained``: the one
    builder of the main command's Hugging Face models and of the planner's (which calls it inside its
    ``FakeTensorMode``: fake parameters, created in ``dtype`` since ``.to`` cannot convert fake ones).

    Args:
        cfg: the config object (:func:`load_config`).
        auto_class: a key of :data:`HEADS`.
        scope: what to do instead when the architecture has no such head (None: the main command's words).
        task: checked against ``cfg`` first (:func:`_fits`); None: not checked.
        pretrained: a local folder, or None for random weights.
        attn: ``attn_implementation``, passed through when not None.
        dtype: the parameters' dtype (transformers' ``dtype=``); None: transformers' choice.

    Raises:
        SetupError: the architecture has no such head, transformers cannot use ``attn``, or the local
            weights cannot be loaded.
    """
    hf = require_transformers()
    if task is not None:
        _fits(task, cfg)
    kwargs = {k: v for k, v in {"attn_implementation": attn, "dtype": dtype}.items() if v is not None}
    try:
        with without_detection_losses():
            auto = getattr(hf, auto_class)
            if pretrained is not None:
                folder = str(pretrained_folder(pretrained))
                return auto.from_pretrained(
                    folder, config=cfg, local_files_only=True, trust_remote_code=False, **kwargs
                )
            return auto.from_config(cfg, trust_remote_code=False, **kwargs)
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise
        head, tests = HEADS[auto_class]
        scope = scope or f"{tests}; for another architecture write a factory (docs/own-model.md)"
        raise SetupError(
            f"{type(cfg).__name__} (model_type {cfg.model_type!r}) has no {head} in transformers "
            f"{hf.__version__} ({auto_class}): {scope}"
        ) from None
    except OSError as exc:
        raise SetupError(
            f"model.pretrained={pretrained}: the local weights cannot be loaded ({str(exc).splitlines()[0]}); "
            "give a folder written by save_pretrained"
        ) from None
    except ImportError as exc:  # e.g. attn_implementation=flash_attention_2 without its package
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise SetupError(
            f"model.attn_implementation={attn}: transformers cannot use it here ({reason}); "
            "use model.attn_implementation=eager or sdpa (the planner: attn=eager)"
        ) from None


def _fits(task: Any, cfg: Any) -> None:
    """Refuse a task whose token ids or windows the config cannot take (the message names the fix)."""
    vocab = int(getattr(cfg, "vocab_size", 0) or 0)
    if int(task.vocab_size) > vocab:
        raise SetupError(
            f"the task uses {task.vocab_size} token ids but the config's vocab_size is {vocab}; give the "
            "task the same model.config / model.pretrained (task.config, task.pretrained)"
        )
    limit = max_positions(cfg)
    if limit is not None and int(task.block_size) > limit:
        raise SetupError(
            f"task.block_size={task.block_size} is longer than the config's {limit} positions; set "
            f"task.block_size<={limit}"
        )


class TextCausalLMTask(CausalLMTask):
    """Character-level causal LM on a local text, sized to a Hugging Face config.

    Each distinct character is one token id, most frequent first (ties in character order);
    when the text has more characters than the config's ``vocab_size``, the rarest share the
    last id. The last ``val_fraction`` of the text is held out. Metric: held-out bits per
    character (lower is better), as :class:`reportgen.models.hf.CausalLMTask`.

    Args:
        config: the model's local config.json (or folder); read for ``vocab_size``.
        pretrained: or the model's local ``save_pretrained`` folder.
        text_file: a UTF-8 text file (undecodable bytes replaced); None = Python's bundled docs
            (``pydoc_data.topics``, about 1 MB, ships with CPython).
        block_size: tokens (characters) per example; at most the config's positions.
        val_fraction, eval_batches, eval_batch_size: as :class:`reportgen.models.hf.CausalLMTask`.

    Raises:
        SetupError: see :func:`model_config`; the text file is missing, or too short for
            ``block_size`` windows in both splits.
    """

    def __init__(
        self,
        config: str | None = None,
        pretrained: str | None = None,
        text_file: str | None = None,
        block_size: int = 64,
        val_fraction: float = 0.1,
        eval_batches: int = 8,
        eval_batch_size: int = 16,
    ):
        self.vocab, self.train, self.val = split_text(config, pretrained, text_file, block_size, val_fraction, 0, 2)
        self.block_size, self.eval_batches, self.eval_batch_size = block_size, eval_batches, eval_batch_size


def split_text(
    config: str | None,
    pretrained: str | None,
    text_file: str | None,
    block_size: int,
    val_fraction: float,
    reserved: int,
    margin: int,
) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """``(characters, train ids, held-out ids)`` of a text task: ``text_file`` (UTF-8; None = Python's
    bundled docs joined in key order), ids by :func:`char_ids` (the config's ``vocab_size`` less ``reserved``
    ids kept for the task), the last ``val_fraction`` held out.

    Raises:
        SetupError: see :func:`model_config`; ``text_file`` is not a readable file; ``block_size`` is not a
            whole number >= 1; either split is shorter than ``block_size + margin`` characters.
    """
    cfg = model_config(config, pretrained)
    if text_file is None:
        from pydoc_data.topics import topics

        text = "\n".join(topics[k] for k in sorted(topics))
    elif not (path := Path(str(text_file)).expanduser()).is_file():
        what = "is a folder, not a file" if path.is_dir() else "no such file"
        raise SetupError(
            f"task.text_file={text_file}: {what}; give a UTF-8 text file, or leave task.text_file unset "
            "for Python's bundled docs"
        )
    else:
        text = path.read_bytes().decode("utf-8", errors="replace")
    vocab, ids = char_ids(text, int(cfg.vocab_size) - reserved)
    n_val = int(len(ids) * val_fraction)
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise SetupError(
            f"task.block_size={block_size!r} must be a whole number of characters, at least 1 (e.g. task.block_size=64)"
        )
    if min(n_val, len(ids) - n_val) < block_size + margin:
        raise SetupError(
            f"task.text_file={text_file}: {len(text)} characters are too few for task.block_size="
            f"{block_size} windows in both splits (val_fraction={val_fraction}); give a longer text"
        )
    return vocab, ids[:-n_val], ids[-n_val:]


def char_ids(text: str, vocab_size: int) -> tuple[list[str], torch.Tensor]:
    """Token ids of ``text``, one per character, at most ``vocab_size`` distinct.

    Returns:
        ``(vocab, ids)``: ``vocab[i]`` is id ``i``'s character (the last one stands for every
        rarer character when clipped: ``"<rare>"``); ``ids`` int64 ``[len(text)]``.

    Raises:
        SetupError: ``vocab_size`` < 2 (no room for a character and the shared rare id).
    """
    if vocab_size < 2:
        raise SetupError(
            f"the config's vocab_size={vocab_size} leaves no room for a text; give a config with vocab_size >= 2"
        )
    counts = Counter(text)
    ranked = sorted(counts, key=lambda ch: (-counts[ch], ch))
    vocab = ranked if len(ranked) <= vocab_size else ranked[: vocab_size - 1] + ["<rare>"]
    rare = len(vocab) - 1
    index = {ch: i for i, ch in enumerate(vocab)}
    return vocab, torch.tensor([index.get(ch, rare) for ch in text], dtype=torch.int64)
