"""Tasks: where batches, the loss and the held-out metrics come from.

A task is any object with the four members of :class:`Task` (duck-typed; reportgen never
requires subclassing). Built-in tasks use data that ships with the machine: scikit-learn's
digits images and the documentation text inside Python (``pydoc_data.topics``).
"""

from __future__ import annotations

import gzip
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from hydra.utils import get_method
from torch import Tensor, nn
from torch.nn import functional as F

from reportgen.structure import call_model, to_device

#: ``(inputs, targets)``: inputs a Tensor, a tuple/list or a dict of tensors (see
#: :mod:`reportgen.structure`); targets any nesting of tensors the task's loss understands.
Batch = tuple[Any, Any]


class Task(Protocol):
    """What reportgen needs from a task.

    Attributes:
        metric: name of the primary held-out metric (e.g. ``"accuracy"``).
        higher_is_better: direction of ``metric``.
    """

    metric: str
    higher_is_better: bool

    def make_batch(self, generator: torch.Generator, batch_size: int) -> Batch:
        """A batch ``(inputs, targets)`` drawn with ``generator`` (fixed input for parity)."""

    def loss(self, output: Tensor, target: Tensor) -> Tensor:
        """Scalar training loss of the model output against the targets."""

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Held-out metrics (must include ``metric``); called under ``torch.no_grad`` in eval mode."""


#: Optional members of a task: the user's own training step (reportgen.twins.step).
#: ``forward_backward(model, batch) -> loss``: forwards and backwards (several forwards, micro-batches
#: with ``no_sync``); ``before_step(model, optimizer)``: between backward and the optimizer step
#: (clipping, unscaling); ``make_optimizer(params)`` and ``make_lr_scheduler(optimizer)``: factories.
TRAINING_STEP_MEMBERS = ("forward_backward", "before_step", "make_optimizer", "make_lr_scheduler")


class FunctionTask:
    """A task made of plain functions, for user models such as ``../shared/cases/*.py``.

    Args:
        make_batch: dotted path of ``fn(generator, batch_size) -> (inputs, targets)``.
        loss: dotted path of ``fn(output, target) -> scalar``.
        eval_batches: held-out batches for the ``loss`` metric (drawn with ``eval_seed``).
        eval_batch_size: examples per held-out batch.
        eval_seed: seed of the held-out generator, disjoint from training seeds by default.
        forward_backward, before_step, make_optimizer, make_lr_scheduler: optional dotted paths of the
            user's training step (:data:`TRAINING_STEP_MEMBERS`); null = reportgen's own.
    """

    metric = "loss"
    higher_is_better = False

    def __init__(
        self,
        make_batch: str | Callable,
        loss: str | Callable,
        eval_batches: int = 4,
        eval_batch_size: int = 32,
        eval_seed: int = 10_007,
        forward_backward: str | None = None,
        before_step: str | None = None,
        make_optimizer: str | None = None,
        make_lr_scheduler: str | None = None,
    ):
        self._make_batch: Callable = get_method(make_batch) if isinstance(make_batch, str) else make_batch
        self._loss: Callable = get_method(loss) if isinstance(loss, str) else loss
        self.eval_batches, self.eval_batch_size, self.eval_seed = eval_batches, eval_batch_size, eval_seed
        given = {
            "forward_backward": forward_backward,
            "before_step": before_step,
            "make_optimizer": make_optimizer,
            "make_lr_scheduler": make_lr_scheduler,
        }
        for name, path in given.items():  # only the members given: the others stay reportgen's
            if path is not None:
                setattr(self, name, get_method(path) if isinstance(path, str) else path)

    def make_batch(self, generator: torch.Generator, batch_size: int) -> Batch:
        """See :class:`Task`."""
        return self._make_batch(generator, batch_size)

    def loss(self, output: Tensor, target: Tensor) -> Tensor:
        """See :class:`Task`."""
        return self._loss(output, target)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Mean loss over ``eval_batches`` fixed held-out batches."""
        return {"loss": held_out_loss(self, model, lambda g: self.make_batch(g, self.eval_batch_size), self.eval_seed)}


class SquaredOutputTask(FunctionTask):
    """The tutorial's task: a fixed random input, loss = mean of squared outputs.

    Args:
        width: features per example (the tutorial uses 12).
    """

    def __init__(self, width: int = 12, eval_batches: int = 4, eval_batch_size: int = 32):
        super().__init__(self._batch, self._squared, eval_batches, eval_batch_size)
        self.width = width

    def _batch(self, generator: torch.Generator, batch_size: int) -> Batch:
        x = torch.randn(batch_size, self.width, generator=generator)
        return x, torch.zeros(batch_size, self.width)

    @staticmethod
    def _squared(output: Tensor, target: Tensor) -> Tensor:
        return output.square().mean()


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits: ``(images [1797, 64] float64 in 0..16, labels [1797] int)``.

    Read from scikit-learn's own data file (``sklearn/datasets/data/digits.csv.gz``) with
    ``np.loadtxt``, as ``sklearn.datasets.load_digits`` reads it (same values, same order), but
    without importing scikit-learn, which costs about a second of every run; where that file is
    not found (another layout), ``load_digits`` itself.
    """
    spec = importlib.util.find_spec("sklearn")  # locates the package without running it
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        data = load_digits()
        return data.data, data.target
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    return table[:, :-1], table[:, -1].astype(int)


class DigitsTask:
    """scikit-learn's bundled digits (1797 images, 8×8, 10 classes), as ``[batch, 64]`` floats in [0, 1].

    Args:
        val_fraction: share of images held out (stratified by a seeded permutation).
        split_seed: seed of the train/validation permutation.
    """

    metric = "accuracy"
    higher_is_better = True

    def __init__(self, val_fraction: float = 0.2, split_seed: int = 0):
        images, labels = load_digits_arrays()
        x = torch.tensor(images, dtype=torch.float32) / 16.0
        y = torch.tensor(labels, dtype=torch.int64)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(split_seed))
        n_val = int(round(len(x) * val_fraction))
        self.x_val, self.y_val = x[order[:n_val]], y[order[:n_val]]
        self.x_train, self.y_train = x[order[n_val:]], y[order[n_val:]]

    def make_batch(self, generator: torch.Generator, batch_size: int) -> Batch:
        """``batch_size`` training images drawn without replacement: ``([b, 64], [b])``."""
        idx = torch.randperm(len(self.x_train), generator=generator)[:batch_size]
        return self.x_train[idx], self.y_train[idx]

    def loss(self, output: Tensor, target: Tensor) -> Tensor:
        """Cross-entropy of logits ``[b, 10]`` against labels ``[b]``."""
        return F.cross_entropy(output, target)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Accuracy and loss on the held-out images."""
        p = next(model.parameters())
        logits = model(self.x_val.to(p.device, p.dtype))
        y = self.y_val.to(p.device)
        return {
            "accuracy": float((logits.argmax(-1) == y).float().mean()),
            "loss": float(F.cross_entropy(logits.float(), y)),
        }


class CharTextTask:
    """Character-level language modelling on Python's own documentation text.

    The text is ``pydoc_data.topics.topics`` (ships with CPython), joined in key order;
    the last ``val_fraction`` of it is held out.

    Args:
        block_size: characters per example (sequence length).
        val_fraction: share of the text held out.
        eval_batches: held-out batches of ``eval_batch_size`` windows for evaluation.
    """

    metric = "bits_per_char"
    higher_is_better = False

    def __init__(
        self, block_size: int = 64, val_fraction: float = 0.1, eval_batches: int = 8, eval_batch_size: int = 32
    ):
        from pydoc_data.topics import topics

        text = "\n".join(topics[k] for k in sorted(topics))
        self.vocab = sorted(set(text))
        index = {ch: i for i, ch in enumerate(self.vocab)}
        data = torch.tensor([index[ch] for ch in text], dtype=torch.int64)
        n_val = int(len(data) * val_fraction)
        self.train, self.val = data[:-n_val], data[-n_val:]
        self.block_size, self.eval_batches, self.eval_batch_size = block_size, eval_batches, eval_batch_size

    @property
    def vocab_size(self) -> int:
        """Distinct characters in the text."""
        return len(self.vocab)

    @staticmethod
    def _inputs(ids: Tensor) -> Any:
        return ids

    def _windows(self, data: Tensor, generator: torch.Generator, batch_size: int) -> Batch:
        start = torch.randint(0, len(data) - self.block_size - 1, (batch_size,), generator=generator)
        offsets = torch.arange(self.block_size)
        return self._inputs(data[start[:, None] + offsets]), data[start[:, None] + offsets + 1]

    def make_batch(self, generator: torch.Generator, batch_size: int) -> Batch:
        """Random training windows: ids ``[b, block_size]`` and next-char targets, same shape."""
        return self._windows(self.train, generator, batch_size)

    def loss(self, output: Tensor, target: Tensor) -> Tensor:
        """Mean cross-entropy (nats/char) of logits ``[b, t, vocab]``."""
        return F.cross_entropy(output.flatten(0, 1).float(), target.flatten())

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Validation loss (nats/char) and bits per character (= loss / ln 2) on fixed held-out windows."""
        loss = held_out_loss(self, model, lambda g: self._windows(self.val, g, self.eval_batch_size))
        return {"val_loss": loss, "bits_per_char": loss / math.log(2)}


def held_out_loss(task: Any, model: nn.Module, draw: Callable[[torch.Generator], Batch], seed: int = 10_007) -> float:
    """Mean ``task.loss`` over ``task.eval_batches`` held-out batches ``draw(generator)`` (the generator seeded
    with ``seed``), moved to the model's device (floating tensors cast to its dtype)."""
    generator = torch.Generator().manual_seed(seed)
    p = next(model.parameters())
    total = 0.0
    for _ in range(task.eval_batches):
        x, y = batch_to(draw(generator), p.device, p.dtype)
        total += float(task.loss(call_model(model, x), y))
    return total / task.eval_batches


def batch_to(batch: Batch, device: torch.device | str, dtype: torch.dtype) -> Batch:
    """Move a batch (any structure) to ``device``; floating tensors are cast to ``dtype``,
    integer ones kept."""
    inputs, targets = batch
    return to_device(inputs, device, dtype), to_device(targets, device, dtype)
