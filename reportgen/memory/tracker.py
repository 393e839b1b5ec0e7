"""The tracker behind :func:`reportgen.memory.peak.warm_step_peak`: torch's ``MemTracker`` that also
records, at each new peak, the phase, the active module and the recompute region.

Its own module because importing ``torch.distributed._tools.mem_tracker`` pulls in DTensor, dynamo
and inductor (about 1.9 s of CPU): :mod:`reportgen.memory.peak` imports it only when a step is
tracked, so a command that stops early (a usage error, ``--help``) does not pay for it.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.utils._pytree import tree_leaves

from reportgen.memory.step_peak import OUTSIDE, StepPeak
from reportgen.twins.recompute import plain_name

__all__ = ["StepTracker"]


class StepTracker(MemTracker):
    """``MemTracker`` that also records, at each new peak, the phase, the active module and
    which activations are saved for backward or recomputed.

    Use it like MemTracker: ``track_external(model, optimizer, batch tensors)`` before entering,
    then run one step inside ``with tracker:``; read :meth:`step_peak` after.

    Args:
        model: the twin whose step is tracked (region names are read from its wrappers).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self._regions = {
            module: plain_name(name) for name, module in model.named_modules() if isinstance(module, CheckpointWrapper)
        }
        self._live: dict[str, int] = {"saved": 0}  # bytes of live marked storages: "saved", "recomputed <region>"
        self._marked: set[int] = set()  # id(storage object) of marked storages (each counted once)
        self._handles: list[Any] = []
        self._saved_hooks: Any = None
        self._peak_where: dict[torch.device, tuple] = {}

    # -- marking saved and recomputed storages -------------------------------------------
    def _mark(self, kind: str, t: Any) -> None:
        """Count ``t``'s storage as ``kind`` (``"saved"``, ``"recomputed <region>"``) while it
        lives, once, and only if the tracker calls it an activation (weights and the batch keep
        their category)."""
        if not isinstance(t, Tensor):
            return
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested: no plain storage
            return
        winfo, _ = self._WINFO.get(storage, (None, None))
        if winfo is None or winfo.reftype != _MemRefType.ACT or id(storage) in self._marked:
            return
        nbytes = int(winfo.mem_consumed)
        self._marked.add(id(storage))
        self._live[kind] = self._live.get(kind, 0) + nbytes
        key = id(storage)

        def release(live=self._live, marked=self._marked) -> None:
            live[kind] -= nbytes
            marked.discard(key)

        weakref.finalize(storage, release)

    def _pack(self, t: Tensor) -> Tensor:
        """Saved-tensor pack hook: identity (what is stored is unchanged), marks the storage."""
        self._mark("saved", t)
        return t

    def _region_inputs(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        """A region's inputs are kept for its recompute (non-reentrant keeps them in a closure)."""
        if not self._mod_tracker.is_bw:
            for leaf in tree_leaves((args, kwargs)):
                self._mark("saved", leaf)

    # -- MemTracker extension points -------------------------------------------------------
    def __enter__(self) -> StepTracker:
        super().__enter__()
        if self._depth == 1:
            self._handles = [m.register_forward_pre_hook(self._region_inputs, with_kwargs=True) for m in self._regions]
            self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
            self._saved_hooks.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        if self._depth == 1:
            self._saved_hooks.__exit__(*args)
            for handle in self._handles:
                handle.remove()
        super().__exit__(*args)

    def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True) -> tuple[int, int]:
        """MemTracker's accounting of parameters and buffers, with gradient hooks on trainable
        (leaf) parameters only: torch's own registers one on every parameter and raises on a frozen one
        ("cannot register a hook on a tensor that doesn't require gradient"), so a frozen
        embedding or LoRA's frozen base could not be tracked."""
        sizes = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
        if install_grad_hooks:
            for param in module.parameters():
                # a non-leaf parameter (FSDP1's use_orig_params view of its flat parameter) takes no
                # post-accumulate hook; its gradient is counted on the flat parameter FSDP1 owns
                if param.requires_grad and param.is_leaf and self._param_to_grad_hook_handles.get(param) is None:

                    def on_grad(grad: Tensor) -> None:
                        self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

                    self._param_to_grad_hook_handles[param] = (
                        param.register_hook(on_grad),
                        param.register_post_accumulate_grad_hook(lambda p: on_grad(p.grad)),
                    )
        return sizes

    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        """MemTracker's, except that a root module called again in forward (a user's step that runs one forward per
        micro-batch) starts its module statistics again where MemTracker raises "multiple iterative calls": the
        step's peak is this tracker's own (:meth:`step_peak`), not the per-module statistics."""
        parents = set(self._mod_tracker.parents) - {self._mod_tracker.get_known_fqn(module)}
        if module in self.memory_tracking and not self._mod_tracker.is_bw and parents == {"Global"}:
            del self.memory_tracking[module]
        super()._pre_fw_hook(module, inputs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # MemTracker's method
        res = super().__torch_dispatch__(func, types, args, kwargs)
        if self._in_ac and self._mod_tracker.is_bw:
            kind = f"recomputed {self._region() or '(unknown region)'}"
            for leaf in tree_leaves(res):
                self._mark(kind, leaf)
        return res

    def _update_peak_stats(self, peak_state: Any) -> None:
        """The device-wide peak only, and where it happened. MemTracker's own version also updates every
        active module's local peak with a deep copy after each op, which this report does not read and
        which made a 24-layer fake step 40x slower."""
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                self._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(dev_snap)
                self._peak_where[dev] = (self._phase(), self._innermost(), self._region(), dict(self._live))

    # -- what is running ---------------------------------------------------------------------
    def _phase(self) -> str:
        if self._in_opt:
            return "optimizer step"
        if self._mod_tracker.is_bw:
            return "recompute" if self._in_ac else "backward"
        return "forward"

    @staticmethod
    def _plain_path(fqn: str) -> str:
        """ModTracker's ``Root.a.b`` as the plain model's ``a.b`` (root: ``""``)."""
        return plain_name(fqn.split(".", 1)[1] if "." in fqn else "")

    def _innermost(self) -> str:
        names = [n for n in self._mod_tracker.parents if n != "Global"]
        if not names:
            return OUTSIDE
        return self._plain_path(max(names, key=lambda n: n.count(".")))

    def _region(self) -> str | None:
        """The region being recomputed: a wrapped module, or (a model's own switch) the
        outermost module whose forward runs again inside backward."""
        if not self._in_ac or self._ac_mod is None:
            return None
        module = self._ac_mod()
        if module is None:
            return None
        if module in self._regions:
            return self._regions[module]
        fqn = self._mod_tracker.get_known_fqn(module)
        return self._plain_path(fqn) if fqn is not None else None

    # -- the result --------------------------------------------------------------------------
    def step_peak(self, device: torch.device, baseline_bytes: int) -> StepPeak:
        """The peak on ``device`` since entering, with its phase, module and categories.

        Args:
            device: the device of the twin.
            baseline_bytes: live bytes before the step (:meth:`live_bytes` before entering).

        Raises:
            RuntimeError: nothing was counted on ``device`` (the step ran elsewhere).
        """
        snap = self.get_tracker_snapshot("peak").get(device)
        if snap is None or device not in self._peak_where:
            raise RuntimeError(f"the memory tracker counted no tensor on {device} during the step")
        phase, module, region, live = self._peak_where[device]
        activations = int(snap.get(_MemRefType.ACT, 0))
        by_region = {k.removeprefix("recomputed "): v for k, v in live.items() if k.startswith("recomputed ")}
        saved = min(live["saved"], activations)
        recomputed = min(sum(by_region.values()), activations - saved)
        categories = {
            "parameters": int(snap.get(_MemRefType.PARAM, 0)),
            "buffers": int(snap.get(_MemRefType.BUFFER, 0)),
            "gradients": int(snap.get(_MemRefType.GRAD, 0)),
            "optimizer state": int(snap.get(_MemRefType.OPT, 0)),
            "batch": int(snap.get(_MemRefType.OTH, 0)),
            "saved activations": saved,
            "recomputed activations": recomputed,
            "other activations": activations - saved - recomputed,
            "backward temporaries": int(snap.get(_MemRefType.TEMP, 0)),
        }
        return StepPeak(
            int(self._peak_mem[device]),
            int(baseline_bytes),
            phase,
            module,
            region,
            categories,
            str(device),
            by_region,
        )

    def live_bytes(self, device: torch.device) -> int:
        """Live tensor bytes the tracker counts on ``device`` now, B."""
        return int(self.get_tracker_snapshot("current").get(device, {}).get(_TOTAL_KEY, 0))
