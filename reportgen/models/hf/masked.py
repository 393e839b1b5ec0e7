"""Any Hugging Face masked LM from a local ``config.json`` (or local weights), and a text task for it.

``python -m reportgen +model=hf_masked_lm model.config=PATH``: the masked-LM twin of
:mod:`reportgen.models.hf.auto`'s ``hf_causal_lm`` (same config loading, same text, same refusals).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from reportgen.errors import SetupError
from reportgen.models.hf.auto import auto_model, model_config, split_text
from reportgen.tasks import held_out_loss

#: ``ignore_index`` of the targets at positions that are not masked (torch's cross-entropy default).
IGNORE = -100


def masked_lm(
    task: Any, config: str | None = None, pretrained: str | None = None, attn_implementation: str | None = None
) -> nn.Module:
    """A Hugging Face masked LM (``AutoModelForMaskedLM``, e.g. ``BertForMaskedLM``): random weights from a local
    config.json, or local weights. Arguments and refusals as :func:`reportgen.models.hf.auto.causal_lm`, with
    ``task`` a :class:`TextMaskedLMTask` (its ids, mask id included, must fit the embedding)."""
    cfg = model_config(config, pretrained)
    return auto_model(cfg, "AutoModelForMaskedLM", task=task, pretrained=pretrained, attn=attn_implementation)


class TextMaskedLMTask:
    """Character-level masked LM on a local text, sized to a Hugging Face config.

    Characters get ids as in :func:`reportgen.models.hf.auto.char_ids`, clipped to ``vocab_size - 1``;
    the next id is the mask id. Each position is masked with probability ``mask_prob``, at least one per
    window (BERT's objective without its random- and keep-token variants; batches: :meth:`make_batch`). The
    last ``val_fraction`` of the text is held out. Metric: held-out cross-entropy per masked character in bits
    (lower is better).

    Args: as :class:`reportgen.models.hf.auto.TextCausalLMTask`, and
        mask_prob: probability that a position is masked (BERT: 0.15).

    Raises:
        SetupError: see :func:`reportgen.models.hf.auto.model_config`; a missing text file; a text too
            short for the windows; ``mask_prob`` outside (0, 1].
    """

    metric = "bits_per_masked_char"
    higher_is_better = False

    def __init__(
        self,
        config: str | None = None,
        pretrained: str | None = None,
        text_file: str | None = None,
        block_size: int = 32,
        mask_prob: float = 0.15,
        val_fraction: float = 0.1,
        eval_batches: int = 8,
        eval_batch_size: int = 16,
    ):
        if not 0.0 < mask_prob <= 1.0:
            raise SetupError(f"task.mask_prob={mask_prob} must be in (0, 1] (BERT masks 0.15)")
        self.vocab, self.train, self.val = split_text(config, pretrained, text_file, block_size, val_fraction, 1, 0)
        self.mask_id = len(self.vocab)
        self.block_size, self.mask_prob = block_size, mask_prob
        self.eval_batches, self.eval_batch_size = eval_batches, eval_batch_size

    @property
    def vocab_size(self) -> int:
        """Token ids in use: the characters' and the mask id."""
        return self.mask_id + 1

    def _masked(self, data: Tensor, generator: torch.Generator, batch_size: int) -> tuple[dict[str, Tensor], Tensor]:
        start = torch.randint(0, len(data) - self.block_size, (batch_size,), generator=generator)
        ids = data[start[:, None] + torch.arange(self.block_size)]
        masked = torch.rand(ids.shape, generator=generator) < self.mask_prob
        masked[torch.arange(batch_size), torch.randint(0, self.block_size, (batch_size,), generator=generator)] = True
        inputs = torch.where(masked, torch.full_like(ids, self.mask_id), ids)
        return {"input_ids": inputs, "attention_mask": torch.ones_like(ids)}, torch.where(masked, ids, IGNORE)

    def make_batch(self, generator: torch.Generator, batch_size: int) -> tuple[dict[str, Tensor], Tensor]:
        """Random training windows, masked, drawn with ``generator``.

        Returns:
            ``({"input_ids": [b, s] int64 with mask ids, "attention_mask": [b, s] int64 ones},
            targets [b, s] int64: the original id where masked, -100 elsewhere)``.
        """
        return self._masked(self.train, generator, batch_size)

    def loss(self, output: Any, target: Tensor) -> Tensor:
        """Mean cross-entropy (nats per masked character) of ``output.logits`` ``[b, s, vocab]``, in float32."""
        return F.cross_entropy(output.logits.flatten(0, 1).float(), target.flatten(), ignore_index=IGNORE)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Held-out masked loss (nats per masked character) and bits per masked character (= loss / ln 2)
        on fixed held-out windows and masks."""
        loss = held_out_loss(self, model, lambda g: self._masked(self.val, g, self.eval_batch_size))
        return {"val_masked_loss": loss, "bits_per_masked_char": loss / math.log(2)}
