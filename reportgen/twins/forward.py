"""One forward and backward of a twin on the fixed batch: the shared parity function, and what it returns.

Every parity check (gradient, optimizer-step, the lost-gradient cross-check of the memory check)
runs a twin through :func:`forward_backward`, so the twins are compared on exactly the same call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from reportgen.rng import fingerprint, seeded
from reportgen.structure import (
    cache_paths,
    changed_leaves,
    clone_inputs,
    leaf_states,
    named_tensors,
    other_leaves,
)
from reportgen.tasks import Batch
from reportgen.twins.recompute import named_inner_modules
from reportgen.twins.snapshot import grads_of
from reportgen.twins.twin import Twin


@dataclass
class StepOutput:
    """What one forward/backward produced.

    Attributes:
        loss: scalar loss (detached).
        output: ``{path: tensor}`` of every tensor leaf of the model output (detached), e.g.
            ``{"output": ...}`` or ``{"output.logits": ..., "output.past_key_values[0][0]": ...}``.
        input_grad: ``{input path: gradient}`` of the floating input leaves (empty when not
            asked or when no input is floating).
        grads: ``{plain parameter name: grad or None}`` for every trainable parameter.
        rng: every generator's state right after backward (:func:`reportgen.rng.fingerprint`).
        others: ``{path: description}`` of every output leaf that is not a tensor (None, numbers,
            strings, unknown objects) and of every cache object
            (:func:`reportgen.structure.other_leaves`), so no output goes unaccounted for.
        changed: ``{path: description}`` of the output's tensor leaves that changed while backward
            ran (:func:`reportgen.structure.changed_leaves`): a recomputation that wrote the forward's
            outputs again, e.g. a key/value cache appended twice. Empty in a plain run.
        caches: paths of the key/value cache objects in the output.
        retained: ``{module.attribute.grad: grad or None}`` of the tensors kept as module
            attributes that retain their gradient (:func:`retained_grads`).
        use_cache: the model's ``config.use_cache`` (None when it has no such attribute).
    """

    loss: Tensor
    output: dict[str, Tensor]
    input_grad: dict[str, Tensor | None]
    grads: dict[str, Tensor | None]
    rng: dict[str, Tensor] = field(default_factory=dict)
    others: dict[str, str] = field(default_factory=dict)
    changed: dict[str, str] = field(default_factory=dict)
    caches: list[str] = field(default_factory=list)
    retained: dict[str, Tensor | None] = field(default_factory=dict)
    use_cache: bool | None = None


#: Words of the note :func:`forward_backward` adds to an exception raised in backward when the
#: output changed meanwhile, and of :func:`changes_said`; ``reportgen.report.diagnose`` matches them.
CHANGED_IN_BACKWARD = "changed while backward ran"
#: Words said when the changed leaves lie in a key/value cache.
CACHE_WRITTEN_AGAIN = "a key/value cache the forward appends to"


def use_cache_of(model: nn.Module) -> bool | None:
    """``model.config.use_cache`` (Hugging Face's switch, and any model that copies it), else None."""
    value = getattr(getattr(model, "config", None), "use_cache", None)
    return value if isinstance(value, bool) else None


def changes_said(changed: dict[str, str], caches: list[str], use_cache: bool | None) -> str:
    """One sentence on output leaves that changed during backward: which, how, and whether in a cache."""
    listed = ", ".join(f"{path} ({how})" for path, how in list(changed.items())[:4])
    more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
    said = (
        f"output leaves {CHANGED_IN_BACKWARD}, so the recomputation wrote the forward's outputs again: {listed}{more}"
    )
    in_cache = [c for c in caches if any(p.startswith(c + ".") for p in changed)]
    if in_cache:
        said += f"; they lie in {CACHE_WRITTEN_AGAIN} ({', '.join(in_cache)})"
    if use_cache:
        said += "; the model's config says use_cache=True"
    return said


def retained_grads(model: nn.Module) -> dict[str, Tensor | None]:
    """``{module.attribute.grad: grad or None}`` of tensors kept as plain module attributes (not
    parameters or buffers) that called ``retain_grad()``, in plain-model naming.

    Under non-reentrant recompute the forward of a region runs again in backward and rebinds such
    an attribute to the recomputed tensor, whose graph backward never walks: its ``.grad`` is None
    where the plain twin has one. Retained tensors kept anywhere else (a list, a global) are not seen.
    """
    found = {}
    for path, module in named_inner_modules(model):
        for attr, value in vars(module).items():
            if isinstance(value, Tensor) and not isinstance(value, nn.Parameter) and value.retains_grad:
                found[f"{path}.{attr}.grad".lstrip(".")] = None if value.grad is None else value.grad.detach().clone()
    return found


def forward_backward(
    twin: Twin,
    batch: Batch,
    forward_seed: int | None,
    input_grad: bool = False,
    clone_grads: bool = True,
) -> StepOutput:
    """One forward and backward of ``twin`` on a clone of ``batch``, no optimizer step (the shared parity
    function). When the step's forwards are the task's own (``not twin.training_step.sees_outputs``) it is
    :meth:`reportgen.twins.twin.Twin.step` without applying: the :class:`StepOutput` holds the loss it returned,
    the gradients and the generators' states, and no outputs or input gradients (the user's forwards are theirs).

    Args:
        twin: a fresh twin in train mode.
        batch: ``(inputs, targets)`` of any structure; inputs are cloned, never modified.
        forward_seed: seeds every generator (:mod:`reportgen.rng`) right before the forward;
            the caller's generator states are restored afterwards (None = leave them alone).
        input_grad: make a floating input require grad and return its gradient. Off for the
            training-like runs: a leaf that requires grad changes what the reentrant
            implementation does, so it is measured in a separate run.
        clone_grads: copy the gradients (off: ``grads`` holds the model's own ``.grad`` tensors,
            detached, no second copy; for a caller that discards the twin or leaves its
            gradients alone).

    Raises:
        Exception: whatever the forward or backward raises; when the output's tensor leaves
            changed while backward ran, the exception carries a note (``__notes__``) saying
            which (:func:`changes_said`), for the ERROR row and the diagnosis.
    """
    model = twin.model
    if not twin.training_step.sees_outputs:
        stepped = twin.step(batch, forward_seed, accept=False)
        return StepOutput(
            stepped.loss, {}, {}, grads_of(model, clone_grads), stepped.rng, retained=retained_grads(model)
        )
    x = clone_inputs(batch[0], requires_grad=input_grad)
    with seeded(forward_seed):
        output, loss = twin.training_step.forward_loss(model, (x, batch[1]))
        before = leaf_states(output, "output")
        try:
            loss.backward()
        except Exception as exc:
            if changed := changed_leaves(before, output, "output"):
                exc.add_note(changes_said(changed, cache_paths(output, "output"), use_cache_of(model)))
            raise
        rng = fingerprint()
    outputs = {name: t.detach() for name, t in named_tensors(output, "output")}
    inputs = {f"{name}.grad": t.grad for name, t in named_tensors(x, "input") if t.requires_grad}
    return StepOutput(
        loss.detach(),
        outputs,
        inputs,
        grads_of(model, clone_grads),
        rng,
        other_leaves(output, "output"),
        changed_leaves(before, output, "output"),
        cache_paths(output, "output"),
        retained_grads(model),
        use_cache_of(model),
    )
