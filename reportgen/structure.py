"""Batches and outputs of any structure: tensors, tuples/lists, dicts, dataclasses, ``ModelOutput``.

A task's ``make_batch`` returns ``(inputs, targets)``. ``inputs`` decides the call
(:func:`call_model`): a Tensor → ``model(x)``, a tuple/list → ``model(*inputs)``, a dict →
``model(**inputs)``. Targets and outputs may nest tuples, lists, dicts, dataclasses and
Hugging Face ``ModelOutput`` s (an ordered dict); every tensor leaf is compared, named by its
path (``output.logits``, ``output["hidden"]``, ``output[0]``). Containers are walked with
``torch.utils._pytree`` (tuples, lists, dicts and the types it registers, ``ModelOutput``
among them); dataclass instances it does not know are read field by field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree


def _cache_children(obj: Any) -> list[tuple[str, Any]] | None:
    """The tensors of a key/value cache, or None when ``obj`` is not one.

    Hugging Face's caches (``DynamicCache`` and kin) are objects, not containers pytree knows:
    transformers 4.x keeps ``key_cache`` / ``value_cache`` lists (one tensor per layer), 5.x a
    ``layers`` list whose items hold ``keys`` / ``values``. Their tensors are outputs like any
    other (``output.past_key_values.key_cache[0]``).
    """
    if isinstance(getattr(obj, "key_cache", None), list) and isinstance(getattr(obj, "value_cache", None), list):
        return [(".key_cache", obj.key_cache), (".value_cache", obj.value_cache)]
    layers = getattr(obj, "layers", None)
    if (
        isinstance(layers, (list, tuple))
        and layers
        and all(
            isinstance(getattr(layer, "keys", None), (Tensor, type(None)))
            and isinstance(getattr(layer, "values", None), (Tensor, type(None)))
            for layer in layers
        )
    ):
        return [
            (f".layers[{i}].{part}", getattr(layer, part))
            for i, layer in enumerate(layers)
            for part in ("keys", "values")
        ]
    return None


def is_cache(obj: Any) -> bool:
    """Whether ``obj`` is a key/value cache object (:func:`_cache_children`)."""
    return _cache_children(obj) is not None


def _children(obj: Any) -> list[tuple[str, Any]] | None:
    """``[(path suffix, child)]`` of a container (a cache object included), or None for a leaf."""
    if (cache := _cache_children(obj)) is not None:
        return cache
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and not isinstance(obj, dict):
        return [(f".{f.name}", getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    if isinstance(obj, dict):  # dict, OrderedDict, ModelOutput: keys, insertion order
        return [
            (f".{k}" if _is_attr_key(obj, k) else (f'["{k}"]' if isinstance(k, str) else f"[{k!r}]"), v)
            for k, v in obj.items()
        ]
    if isinstance(obj, (tuple, list)):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    return None


def _is_attr_key(obj: dict, key: Any) -> bool:
    """``ModelOutput`` fields read as attributes (``output.logits``); plain dict keys as ``["k"]``."""
    return type(obj) not in (dict,) and isinstance(key, str) and hasattr(obj, key) and key.isidentifier()


def named_tensors(obj: Any, prefix: str) -> Iterator[tuple[str, Tensor]]:
    """Every tensor leaf of ``obj`` with its path, depth first, in container order.

    Args:
        obj: a tensor or any nesting of tuples, lists, dicts, dataclasses, ``ModelOutput`` s.
        prefix: the name of ``obj`` itself, e.g. ``"output"``.

    Yields:
        ``(path, tensor)``, e.g. ``("output.logits", Tensor[b, t, vocab])``; non-tensor leaves
        (None, numbers, strings) are skipped.
    """
    if isinstance(obj, Tensor):
        yield prefix, obj
        return
    children = _children(obj)
    for suffix, child in children or []:
        yield from named_tensors(child, prefix + suffix)


def other_leaves(obj: Any, prefix: str) -> dict[str, str]:
    """Every leaf of ``obj`` that is not a tensor, and every cache object, described for people.

    Args:
        obj: a model output of any structure (see :func:`named_tensors`).
        prefix: the name of ``obj`` itself, e.g. ``"output"``.

    Returns:
        ``{path: description}``: ``"None"``, ``"int 3"``, ``"str 'x'"``, ``"cache DynamicCache, 4
        tensors"`` (a cache's tensors are tensor leaves too), ``"object Foo (not compared)"``.
    """
    if isinstance(obj, Tensor):
        return {}
    if is_cache(obj):
        count = sum(1 for _ in named_tensors(obj, prefix))
        found = {prefix: f"cache {type(obj).__name__}, {count} tensors"}
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        return {prefix: "None" if obj is None else f"{type(obj).__name__} {obj!r}"}
    elif _children(obj) is None:
        return {prefix: f"object {type(obj).__name__} (not compared)"}
    else:
        found = {}
    for suffix, child in _children(obj) or []:
        found.update(other_leaves(child, prefix + suffix))
    return found


def map_tensors(fn: Callable[[Tensor], Tensor], obj: Any) -> Any:
    """``obj`` with ``fn`` applied to every tensor leaf (same structure; via ``pytree.tree_map``
    for the containers it knows, dataclasses rebuilt with ``dataclasses.replace``)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: map_tensors(fn, getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        )
    return pytree.tree_map(
        lambda leaf: (
            fn(leaf)
            if isinstance(leaf, Tensor)
            else (map_tensors(fn, leaf) if dataclasses.is_dataclass(leaf) else leaf)
        ),
        obj,
    )


def call_model(model: nn.Module, inputs: Any) -> Any:
    """Call ``model`` with a batch's inputs: Tensor → ``model(x)``, tuple/list →
    ``model(*inputs)``, dict → ``model(**inputs)``."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def batch_size_of(inputs: Any) -> int:
    """Examples in a batch: the leading size of its first tensor leaf.

    Raises:
        ValueError: the inputs hold no tensor, or a tensor without a leading dimension.
    """
    for _, t in named_tensors(inputs, "input"):
        if t.dim() == 0:
            raise ValueError("a batch's tensors must have a leading batch dimension; got a 0-d tensor")
        return int(t.shape[0])
    raise ValueError("a batch's inputs hold no tensor")


def clone_inputs(inputs: Any, requires_grad: bool = False) -> Any:
    """A copy of every tensor leaf (``clone``: an input that requires grad still does); with
    ``requires_grad`` every floating leaf becomes a fresh leaf that requires grad (to read its
    input gradient)."""

    def copy(t: Tensor) -> Tensor:
        if requires_grad and t.is_floating_point():
            return t.detach().clone().requires_grad_(True)
        return t.clone()

    return map_tensors(copy, inputs)


def has_floating(inputs: Any) -> bool:
    """True when any tensor leaf of ``inputs`` is floating point (so it can have a gradient)."""
    return any(t.is_floating_point() for _, t in named_tensors(inputs, "input"))


def describe(inputs: Any) -> str:
    """Shapes and dtypes for people: ``[16, 12] float32`` or ``input_ids [4, 32] int64, ...``."""
    parts = []
    for name, t in named_tensors(inputs, "input"):
        label = name.removeprefix("input").strip('.[]"')
        parts.append(f"{label} {list(t.shape)} {str(t.dtype).removeprefix('torch.')}".strip())
    return ", ".join(parts)


def to_device(obj: Any, device: torch.device | str, dtype: torch.dtype) -> Any:
    """Move every tensor leaf to ``device``; floating ones are cast to ``dtype``, others kept."""
    return map_tensors(lambda t: t.to(device, dtype) if t.is_floating_point() else t.to(device), obj)


def leaf_states(obj: Any, prefix: str) -> dict[str, tuple[Tensor, int]]:
    """``{path: (tensor, version counter)}`` of every tensor leaf of ``obj`` (see
    :func:`named_tensors`), to tell later whether a leaf was replaced or written in place
    (:func:`changed_leaves`). Holds the tensors, so an address is never reused meanwhile."""
    return {name: (t, t._version) for name, t in named_tensors(obj, prefix)}


def changed_leaves(before: dict[str, tuple[Tensor, int]], obj: Any, prefix: str) -> dict[str, str]:
    """Tensor leaves of ``obj`` that are not what :func:`leaf_states` recorded, described for people.

    Args:
        before: :func:`leaf_states` of the same object, taken earlier (e.g. after the forward).
        obj: the object now (e.g. after backward; a cache object may have been appended to).
        prefix: its name, as given to :func:`leaf_states`.

    Returns:
        ``{path: description}``: ``"shape [4, 6, 16] -> [4, 12, 16]"`` (replaced by a tensor of
        another shape), ``"replaced by another tensor"``, ``"written in place"``, ``"added"``
        (a leaf that was not there), ``"removed"``; empty when nothing changed.
    """
    now = dict(named_tensors(obj, prefix))
    found = {}
    for path in dict.fromkeys([*before, *now]):
        if path not in now or path not in before:
            found[path] = "removed" if path not in now else "added"
            continue
        (old, version), new = before[path], now[path]
        if new is not old:
            found[path] = (
                f"shape {list(old.shape)} -> {list(new.shape)}"
                if new.shape != old.shape
                else "replaced by another tensor"
            )
        elif new._version != version:
            found[path] = "written in place"
    return found


def cache_paths(obj: Any, prefix: str) -> list[str]:
    """Paths of the key/value cache objects in ``obj`` (:func:`is_cache`), outermost first."""
    return [path for path, what in other_leaves(obj, prefix).items() if what.startswith("cache ")]
