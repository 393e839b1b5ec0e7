"""The tutorial's ffn behind models a copy of one build cannot stand for (issue 44): a ``__deepcopy__`` that
returns the model itself or a new model, and a lazy first layer (``nn.LazyLinear``) whose weight has no shape
until the first forward."""

from torch import nn

from reportgen.models.ffn import build as ffn


class SelfCopy(nn.Sequential):
    """``copy.deepcopy`` returns the same object."""

    def __deepcopy__(self, memo):
        return self


class FreshCopy(nn.Sequential):
    """``copy.deepcopy`` returns a new model (unseeded, so other weights)."""

    def __deepcopy__(self, memo):
        return FreshCopy(*ffn())


def self_copy():
    """The ffn whose deepcopy is itself."""
    return SelfCopy(*ffn())


def fresh_copy():
    """The ffn whose deepcopy is a new model."""
    return FreshCopy(*ffn())


def lazy():
    """``LazyLinear(12)`` (in features from the first batch: 12), then the ffn."""
    return nn.Sequential(nn.LazyLinear(12), *ffn())
