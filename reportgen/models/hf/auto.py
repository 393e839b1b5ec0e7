"""Any Hugging Face causal LM from a local ``config.json`` (or local weights), and a text task for it.

``python -m reportgen +model=hf_causal_lm model.config=PATH`` tests a user's own architecture
with one command: no factory, batch function or loss to write.

- :func:`load_config` reads a local ``config.json`` (or a folder holding one) into the
  transformers config class its ``model_type`` names; nothing is downloaded.
- :func:`causal_lm` builds ``AutoModelForCausalLM.from_config`` with random weights (seeded by
  reportgen before the call), or loads local weights with ``from_pretrained(local_files_only=True)``.
- :class:`TextCausalLMTask` is :class:`reportgen.models.hf.CausalLMTask` on any UTF-8 text
  (``task.text_file``; default Python's bundled docs, ``pydoc_data.topics``), character-level,
  its vocabulary clipped to the config's ``vocab_size``.

Every bad input (a missing path, a config.json without a known ``model_type``, an architecture
without a causal-LM head, code that would have to be downloaded) is a
:class:`reportgen.errors.SetupError` naming the fix, so the run exits 2.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reportgen.errors import SetupError
from reportgen.models.hf import CausalLMTask, require_transformers

#: The tiny example config shipped with reportgen (``conf/examples/...``), named in messages.
EXAMPLE = "conf/examples/hf_causal_lm/config.json"
#: Config fields that bound the sequence length, in the order transformers' families use them.
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")


def config_file(path: str) -> Path:
    """The ``config.json`` that ``path`` names: the file itself, or ``path/config.json`` for a folder.

    Raises:
        SetupError: nothing is there (the message says what to pass).
    """
    given = Path(str(path)).expanduser()
    found = given / "config.json" if given.is_dir() else given
    if not found.is_file():
        raise SetupError(
            f"model.config={path}: no such {'file' if not given.is_dir() else 'config.json in that folder'}"
            f". Give a local config.json or a folder holding one (nothing is downloaded), e.g. "
            f"model.config={EXAMPLE}"
        )
    return found


def load_config(path: str) -> Any:
    """A transformers config object from a local ``config.json`` (or a folder holding one).

    Args:
        path: file or folder.

    Returns:
        An instance of the config class its ``model_type`` names (``AutoConfig.for_model``).

    Raises:
        SetupError: transformers is missing, the file is not a JSON object, it has no
            ``model_type``, transformers does not know that type, or it needs remote code
            (``auto_map``).
    """
    require_transformers()
    from transformers import AutoConfig

    file = config_file(path)
    try:
        fields = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SetupError(
            f"model.config={path}: {file} is not valid JSON ({exc}); give a Hugging Face config.json"
        ) from None
    if not isinstance(fields, dict) or not isinstance(fields.get("model_type"), str):
        raise SetupError(
            f'model.config={path}: {file} has no "model_type" (e.g. "llama", "gpt2"); a Hugging Face '
            "config.json names its architecture there"
        )
    if fields.get("auto_map"):
        raise SetupError(
            f"model.config={path}: {file} needs remote code (auto_map), which reportgen never downloads or "
            "runs; use an architecture built into transformers, or your own factory (docs/own-model.md)"
        )
    kind = fields.pop("model_type")
    try:
        return AutoConfig.for_model(kind, **fields)
    except ValueError:
        raise SetupError(
            f"model.config={path}: model_type {kind!r} is not known to the installed transformers "
            f"{_version()}; upgrade it (pip install -U transformers) or fix model_type"
        ) from None


def _version() -> str:
    return require_transformers().__version__


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
    for name in POSITION_FIELDS:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


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
    scope = "+model=hf_causal_lm tests decoder-only language models"
    model = auto_model("AutoModelForCausalLM", "causal-LM head", scope, task, cfg, pretrained, attn_implementation)
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
    vocab, length = int(cfg.vocab_size), min(8, max_positions(cfg) or 8)
    if vocab < 2 or length < 2 or on_fake_tensors(model):
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


def on_fake_tensors(model: nn.Module) -> bool:
    """True when ``model``'s parameters are fake tensors (built under ``FakeTensorMode``): shapes, no values."""
    from torch._subclasses.fake_tensor import is_fake

    return any(is_fake(p) for p in model.parameters())


def auto_model(
    auto_class: str, head: str, scope: str, task: Any, cfg: Any, pretrained: str | None, attn_implementation: str | None
) -> nn.Module:
    """``transformers.<auto_class>`` built from ``cfg`` (random init) or loaded from ``pretrained``.

    Args:
        auto_class: e.g. ``"AutoModelForCausalLM"``, ``"AutoModelForMaskedLM"``.
        head, scope: words for the message when the architecture has no such head.
        task: checked against ``cfg`` first (:func:`_fits`).
        cfg: the config object (:func:`model_config`).
        pretrained: a local folder, or None for random weights.
        attn_implementation: passed through when not None.

    Raises:
        SetupError: the architecture has no such head, or the local weights cannot be loaded.
    """
    auto = getattr(require_transformers(), auto_class)
    _fits(task, cfg)
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    try:
        if pretrained is not None:
            return auto.from_pretrained(str(pretrained_folder(pretrained)), config=cfg, local_files_only=True, **kwargs)
        return auto.from_config(cfg, **kwargs)
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise
        raise SetupError(
            f"{type(cfg).__name__} (model_type {cfg.model_type!r}) has no {head} in transformers "
            f"{_version()}: {scope} ({auto_class}). For another architecture write a factory "
            "(docs/own-model.md)"
        ) from None
    except OSError as exc:
        raise SetupError(
            f"model.pretrained={pretrained}: the local weights cannot be loaded ({str(exc).splitlines()[0]}); "
            "give a folder written by save_pretrained"
        ) from None
    except ImportError as exc:  # e.g. attn_implementation=flash_attention_2 without its package
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise SetupError(
            f"model.attn_implementation={attn_implementation}: transformers cannot use it here ({reason}); "
            "use model.attn_implementation=eager or sdpa"
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
        self.text_file = text_file

    @property
    def vocab_size(self) -> int:
        """Token ids in use (at most the config's ``vocab_size``)."""
        return len(self.vocab)


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
