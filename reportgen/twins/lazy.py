"""Lazy modules (``torch.nn.LazyLinear`` and kin): their parameters have no shape until the first forward, so the
one build is materialised with the fixed batch before it is kept (:func:`materialise_lazy`; torch docs,
``torch.nn.modules.lazy.LazyModuleMixin``: "a dry run ... to initialize all the lazy modules")."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from reportgen.errors import SetupError
from reportgen.structure import call_model


def lazy_paths(model: nn.Module) -> list[str]:
    """Paths of the submodules of ``model`` whose parameters are not yet made (``has_uninitialized_params``)."""
    return [
        path or "(root)"
        for path, module in model.named_modules()
        if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params()
    ]


def has_lazy(model: nn.Module) -> bool:
    """True when ``model`` holds a lazy module whose parameters are not made yet."""
    return bool(lazy_paths(model))


def materialise_lazy(model: nn.Module, inputs: Any) -> None:
    """Make the lazy parameters of ``model`` by one dry forward on ``inputs`` (the fixed batch's, on the host), in
    eval mode (no running statistics move) under ``torch.no_grad``, with the generators as the factory left them
    (so every build of the factory, seeded alike, makes the same values). The model is modified in place.

    Raises:
        SetupError: the dry forward raises, or a lazy module is still uninitialised after it (one line naming
            them and the fix: give the sizes, e.g. ``nn.Linear(in_features, out)``, or call the model once in
            the factory).
    """
    lazy, was_training = lazy_paths(model), model.training
    named = ", ".join(lazy[:4]) + (f" and {len(lazy) - 4} more" if len(lazy) > 4 else "")
    fix = "give their sizes (e.g. nn.Linear(in_features, out_features)) or call the model once in your factory"
    try:
        model.eval()
        with torch.no_grad():
            call_model(model, inputs)
    except Exception as exc:  # noqa: BLE001 - whatever the user's forward raises on the fixed batch
        raise SetupError(
            f"the model has lazy modules ({named}) that one forward of the fixed batch could not make "
            f"({type(exc).__name__}: {exc}); {fix}"
        ) from None
    finally:
        model.train(was_training)
    if left := lazy_paths(model):
        raise SetupError(f"lazy modules {', '.join(left[:4])} were not used by a forward of the fixed batch; {fix}")
