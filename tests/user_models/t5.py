"""A tiny Hugging Face T5 (encoder-decoder) recomputed by its own switch under reentrant
recompute (issue 16, item 4): gradients agree to rounding level, and training carries those
last-bit differences on. Needs transformers (tests using it carry ``@pytest.mark.hf``).
Imports nothing from reportgen; random weights from a ``T5Config``, nothing downloaded."""

import torch
from torch.nn import functional as F

VOCAB, SEQ = 32, 12


def build_t5(d_model=32, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.1):
    """``T5ForConditionalGeneration`` with ``num_layers`` encoder and decoder blocks, width ``d_model``."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=VOCAB,
        d_model=d_model,
        d_kv=d_model // num_heads,
        d_ff=d_ff,
        num_layers=num_layers,
        num_heads=num_heads,
        dropout_rate=dropout_rate,
        use_cache=False,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return T5ForConditionalGeneration(cfg)


def make_batch(generator, batch_size=4):
    """A reversal task: ``({"input_ids", "attention_mask", "decoder_input_ids"} [b, SEQ] int64,
    target ids [b, SEQ])``; the decoder reads the target shifted right behind the start token 0."""
    ids = torch.randint(2, VOCAB, (batch_size, SEQ), generator=generator)
    target = ids.flip(1)
    decoder = torch.cat([torch.zeros(batch_size, 1, dtype=torch.long), target[:, :-1]], dim=1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "decoder_input_ids": decoder}, target


def loss(output, target):
    """Cross-entropy (nats/token) of ``output.logits`` ``[b, SEQ, VOCAB]`` against the target ids."""
    return F.cross_entropy(output.logits.flatten(0, 1).float(), target.flatten())
