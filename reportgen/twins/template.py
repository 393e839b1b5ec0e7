"""One build of the user's model per process; every twin of every check is a copy of it (docs/architecture.md).

The user's factory runs once (seeded with ``cfg.seed``); that model, the *template*, stays in the run's dtype
where the factory left it (host memory for a CUDA run). A twin is ``copy.deepcopy`` of it with every parameter
and buffer pre-entered in deepcopy's memo as a copy on the run's device (:func:`copy_module`): the initialisation
never runs again, the weights cross to the device once per twin, and everything state parity compares stays exact
(buffers, ties, parametrizations, attributes, held generators, bound-method hooks). A model a copy cannot stand for
(:func:`one_build`) is built by its factory for every twin, and a row of the report says why.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import functools
import gc
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_leaves, tree_map

Kept = TypeVar("Kept", bound=Any)

#: Hook dictionaries of ``nn.Module`` whose functions :func:`shared_references` inspects.
HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


#: Template size from which :meth:`Template.twin` calls :func:`release_memory` first (bytes): below it a
#: twin is small beside the interpreter, and a full ``gc.collect()`` (about 0.1 s in a process that
#: imported torch, transformers and matplotlib) would cost more than it returns.
RELEASE_ABOVE = 64 * 2**20


@dataclass(frozen=True)
class Template:
    """The one built model of this process, and the generator state its build left.

    Attributes:
        module: the user's model in the run's dtype, as the factory built it (never trained,
            never wrapped: twins are copies).
        seed: ``cfg.seed``, the seed the factory ran under.
        rng_state: ``torch.get_rng_state()`` right after the factory returned (uint8 tensor).
        rebuild: the factory itself (seeded, in the run's dtype) when a copy cannot stand for a build
            (:attr:`rebuilt_because`); None: every twin is a copy.
        rebuilt_because: why every twin calls the factory again ("" when twins are copies): hooks that
            hold a module of the model (:func:`shared_references`: on a copy they would act on, and
            change, the one build) or a model ``copy.deepcopy`` refuses (a lock, an open file).
    """

    module: nn.Module
    seed: int
    rng_state: Tensor
    rebuild: Callable[[], nn.Module] | None = None
    rebuilt_because: str = ""

    @functools.cached_property
    def nbytes(self) -> int:
        """Bytes of the template's parameters and buffers (ties counted once)."""
        return sum(
            t.numel() * t.element_size() for t in itertools.chain(self.module.parameters(), self.module.buffers())
        )

    def twin(self, device: torch.device) -> nn.Module:
        """A fresh copy of :attr:`module` with its parameters and buffers on ``device`` (a fresh build
        by :attr:`rebuild` where a copy cannot stand for one).

        Leaves torch's generators as a fresh build would: every generator seeded with
        :attr:`seed`, the CPU generator then at :attr:`rng_state`.
        """
        if self.nbytes >= RELEASE_ABOVE:  # the previous twin's memory, before this one takes as much again
            release_memory()
        if self.rebuild is not None:
            built = self.rebuild()
            if on_meta(built):  # a rank's meta build: left on meta, or materialised whole on ``device``
                return built if device.type == "meta" else materialise(built, device, self.seed)
            return built.to(device)
        meta = on_meta(self.module)
        model = copy_module(self.module, (lambda t: t.clone()) if meta else (lambda t: t.to(device, copy=True)))
        if meta and device.type != "meta":
            materialise(model, device, self.seed)
        torch.manual_seed(self.seed)
        torch.set_rng_state(self.rng_state)
        return model


def one_build(module: nn.Module, seed: int, rebuild: Callable[[], nn.Module]) -> tuple[Template, nn.Module]:
    """The :class:`Template` of ``module`` (just built by ``rebuild``, seeded with ``seed``) and a copy of it
    on the host to probe the recompute settings on. Twins are copies unless the factory registered hooks that
    hold a module of the model or ``copy.deepcopy`` refuses the model; then :attr:`Template.rebuild` is
    ``rebuild`` and :attr:`Template.rebuilt_because` says why (a row of the report names it)."""
    rng_state = torch.get_rng_state()
    because = ""
    if shared := shared_references(module):
        more = f" and {len(shared) - 4} more" if len(shared) > 4 else ""
        because = f"hooks the factory registered hold a module of the model ({'; '.join(shared[:4])}{more})"
    else:
        try:
            probe = copy_module(module, lambda t: t.clone())
        except Exception as exc:  # noqa: BLE001 - whatever deepcopy raises on the user's object
            because = f"copy.deepcopy cannot copy the model ({type(exc).__name__}: {exc})"
        else:
            because = not_a_copy(module, probe)
    if because:
        probe = rebuild()
    torch.set_rng_state(rng_state)
    return Template(module, seed, rng_state, rebuild if because else None, because), probe


def not_a_copy(module: nn.Module, copied: nn.Module) -> str:
    """Why ``copied`` (``copy.deepcopy`` of ``module``) cannot stand for a build, or ``""``: a ``__deepcopy__``
    that returns the same object (every twin would be the one build, trained in place) or a model that shares a
    tensor with it, or whose state (names, shapes, dtypes, bytes; meta tensors by shape) is not the build's (a
    fresh model, say)."""
    if copied is module:
        return "copy.deepcopy returns the model itself (its __deepcopy__ returns self), so twins would share it"
    state, copy_state = module.state_dict(keep_vars=True), copied.state_dict(keep_vars=True)
    if list(state) != list(copy_state):
        return "copy.deepcopy returns a model with other parameters or buffers than the build (its __deepcopy__)"
    for name, tensor in state.items():
        other = copy_state[name]
        if other is tensor:
            return f"copy.deepcopy returns a model that shares {name} with the build (its __deepcopy__)"
        if not _same_tensor(tensor, other):
            return f"copy.deepcopy returns a model whose {name} differs from the build's (its __deepcopy__)"
    return ""


def _same_tensor(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are tensors of one dtype and shape holding the same bytes (meta: shape only); a
    tensor subclass that cannot be compared this way counts as the same."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        return a == b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_meta or b.is_meta:
        return a.is_meta and b.is_meta
    if type(a) not in (nn.Parameter, Tensor) or type(b) not in (nn.Parameter, Tensor):
        return True  # left to the subclass's own __deepcopy__ (copy_module)
    flat = [t.detach().cpu().contiguous().reshape(-1) for t in (a, b)]
    return torch.equal(flat[0].view(torch.uint8), flat[1].view(torch.uint8)) if a.numel() else True


def on_meta(module: nn.Module) -> bool:
    """True when any parameter or buffer of ``module`` is on the meta device (a build that holds no values yet)."""
    return any(t.is_meta for t in itertools.chain(module.parameters(), module.buffers()))


class NoInitialiser(ValueError):
    """A model built on the meta device has no way to make its values: neither ``init_weights()`` nor any module
    with ``reset_parameters()``."""


def materialise(module: nn.Module, device: torch.device, seed: int) -> nn.Module:
    """Give a meta-device build (whole, or already sharded: ``fully_shard`` leaves ``DTensor`` shards on the meta
    device) its storage and values, as torchtitan does: ``module.to_empty(device=device)``, then, with torch's
    generators seeded with ``seed`` (and restored after), ``module.init_weights()`` when the model defines it, else
    ``reset_parameters()`` of every module whose class defines it, in ``modules()`` order. Every twin materialised
    with the same seed and the same layout holds the same values (state parity compares them).

    The class, not the instance, is asked: a recompute wrapper forwards unknown attributes to the module it
    wraps, which would otherwise be initialised twice (and draw twice from the generator).

    Raises:
        NoInitialiser: neither exists (the message names the fix).
    """
    module.to_empty(device=device)
    initialisers = (
        [module.init_weights]
        if callable(getattr(type(module), "init_weights", None))
        else [m.reset_parameters for m in module.modules() if callable(getattr(type(m), "reset_parameters", None))]
    )
    if not initialisers:
        raise NoInitialiser(
            f"the model ({type(module).__name__}) was built on the meta device but has no init_weights() and no "
            "module with reset_parameters(): give it an init_weights() that fills every parameter and buffer, or "
            "build it on the host"
        )
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        torch.manual_seed(seed)
        for init in initialisers:
            init()
    return module


def release_memory() -> None:
    """Give back what dropped twins held before the next is made: ``gc.collect()`` (a twin held in a
    reference cycle, e.g. by a hook bound to it, is freed only by the collector) and, where the C
    library is glibc, ``malloc_trim(0)``: tensors under glibc's mmap threshold (up to 32 MiB) live on
    the heap, whose freed pages glibc keeps unless asked (measured on the 113M Llama config: peak RSS
    of a report with them kept and trimmed, benchmarks/harness_overhead.py)."""
    gc.collect()
    if trim := _malloc_trim():
        trim(0)


#: glibc's ``mallopt`` parameter ``M_MMAP_THRESHOLD`` (``malloc.h``).
M_MMAP_THRESHOLD = -3
#: Bytes from which :func:`map_large_allocations` gives an allocation its own mapping: a rank's shards of a
#: 100M-parameter model are 1-6 MiB each.
MAP_ABOVE = 1 << 20


def map_large_allocations(threshold: int = MAP_ABOVE) -> bool:
    """Give every allocation of ``threshold`` bytes or more its own memory mapping, returned to the system when it is
    freed (glibc ``mallopt(M_MMAP_THRESHOLD, threshold)``; a no-op elsewhere). By default glibc raises that
    threshold after each freed mapping, up to 32 MiB, so the tensors of twin after twin land on the heap and leave
    it fragmented: measured on a rank of a 100M-parameter FSDP2 run (tests/distributed/test_shard_memory.py),
    3.24 GiB peak resident set with glibc's default, 2.91 GiB with this. Called once by each spawned rank.

    Returns:
        True when glibc accepted it.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None elsewhere (macOS, musl)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def on_host(kept: Kept) -> Kept:
    """``kept`` (a dataclass of tensors and containers of tensors: a
    :class:`reportgen.twins.forward.StepOutput`, a :class:`reportgen.twins.snapshot.Snapshot`) with
    every tensor off the accelerator: what a check keeps of one twin while it builds the next must
    not cost the device a second training state. The same object when nothing is on one."""
    leaves = [t for f in dataclasses.fields(kept) for t in tree_leaves(getattr(kept, f.name))]
    if all(not isinstance(t, Tensor) or t.device.type == "cpu" for t in leaves):
        return kept
    host = lambda t: t.to("cpu") if isinstance(t, Tensor) else t
    return dataclasses.replace(
        kept, **{f.name: tree_map(host, getattr(kept, f.name)) for f in dataclasses.fields(kept)}
    )


def copy_module(module: nn.Module, convert: Callable[[Tensor], Tensor]) -> nn.Module:
    """``copy.deepcopy(module)`` whose parameters and buffers are ``convert(tensor)`` (detached), e.g. a
    copy on the run's device (:meth:`Template.twin`) or a fake tensor (the GPU-free estimate).

    Each distinct parameter or buffer is converted once (ties stay ties); a parameter stays an
    ``nn.Parameter`` with its ``requires_grad``. Subclasses of ``nn.Parameter`` and tensor subclasses are
    left to their own ``__deepcopy__`` (and so stay where the template's are)."""
    memo: dict[int, object] = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if type(tensor) not in (nn.Parameter, Tensor) or id(tensor) in memo:
            continue
        new = convert(tensor.detach())
        memo[id(tensor)] = nn.Parameter(new, tensor.requires_grad) if type(tensor) is nn.Parameter else new
    return copy.deepcopy(module, memo)


def shared_references(module: nn.Module) -> list[str]:
    """Hooks registered on ``module`` (or a submodule) that are closures or partials holding a
    module of ``module``: a copy keeps them pointing at the original, so the hook of a twin
    would act on the template. Returns ``"<module path>.<hook dict>: <hook name>"`` entries."""
    inside = {id(m) for m in module.modules()}
    found = []
    for path, sub in module.named_modules():
        for attr in HOOK_DICTS:
            for hook in getattr(sub, attr, {}).values():
                hook = hook[0] if isinstance(hook, tuple) else hook  # (hook, with_module) pairs
                if any(id(obj) in inside for obj in _held(hook)):
                    found.append(f"{path or '(root)'}.{attr}: {getattr(hook, '__qualname__', repr(hook))}")
    return found


def _held(hook: object) -> list[object]:
    """What a hook function holds besides its own module binding: closure cells and partial arguments."""
    if isinstance(hook, functools.partial):
        return [*hook.args, *hook.keywords.values(), *_held(hook.func)]
    cells = getattr(hook, "__closure__", None) or ()
    held = []
    for cell in cells:
        try:
            held.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return held
