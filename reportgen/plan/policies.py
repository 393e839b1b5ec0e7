"""Recompute policies the plan weighs, how each is switched on in a Hugging Face model, and the
recompute config file the main command takes for the chosen one.

Every policy is the model's own switch (:func:`reportgen.hf.enable`, the same call as
``recompute.method: model_switch`` in ``conf/model/hf_causal_lm.yaml``) with a ``recompute`` node:

* ``none``: no recompute;
* ``full``: every decoder layer, non-reentrant (``torch.utils.checkpoint``, use_reentrant=False);
* ``every_2``, ``every_4``: layers ``0, k, 2k ...`` only (torchtitan's ``selective`` layer option,
  ``ac_freq``), via ``recompute.targets`` (:func:`reportgen.hf.keep_only_targets`);
* ``selective_op``: every layer, saving the outputs of torchtitan's selective op list (matmuls and
  attention kernels) except every second ``aten.mm`` (``recompute.save_period``), torchtitan's
  ``_apply_op_sac`` (torchtitan/distributed/activation_checkpoint.py, 2024-12);
* ``selective_mm``: the same list, every matmul's output saved (less recompute, more memory).

The list's attention kernels are sdpa's: under another attention implementation (``attn=eager``: matmuls
and a softmax) they are never called, so :meth:`Policy.for_attn` leaves them out of the traced policy and
of the written file (a main run would WARN for each entry that matches nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from omegaconf import OmegaConf
from torch import nn

from reportgen.config import RecomputeConfig

#: torchtitan's selective op save list, with the CPU flash kernel (the one a CPU run calls).
SAVE_OPS = [
    "aten.mm",
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu",
]
#: Of those, the attention kernels: only ``attn_implementation="sdpa"`` calls them.
SDPA_OPS = tuple(op for op in SAVE_OPS if op.startswith("aten._scaled_dot_product"))


@dataclass(frozen=True)
class Policy:
    """One recompute policy.

    Attributes:
        name: its word (``recompute=`` of the plan).
        every: recompute layers whose index is a multiple of this (0: none; 1: all).
        save_ops: selective mode: ops whose outputs are saved (empty: full recompute of a layer).
        save_period: ``{op: n}``: of those, only every n-th call's output is saved.
        label: a phrase for the tables.
    """

    name: str
    every: int
    save_ops: tuple[str, ...] = ()
    save_period: dict[str, int] = field(default_factory=dict, hash=False)
    label: str = ""

    def flags(self, indices: list[int]) -> list[bool]:
        """Which of the layers ``indices`` (indices in the full model) this policy recomputes."""
        return [self.every > 0 and i % self.every == 0 for i in indices]

    def for_attn(self, attn: str) -> Policy:
        """This policy for a model built with ``attn_implementation=attn``: with any attention but
        ``sdpa`` the save list holds no :data:`SDPA_OPS` (that attention never calls them)."""
        if attn == "sdpa" or not self.save_ops:
            return self
        return replace(self, save_ops=tuple(op for op in self.save_ops if op not in SDPA_OPS))

    def node(self, targets: list[str]) -> dict[str, Any]:
        """The ``recompute`` node (fields of :class:`reportgen.config.RecomputeConfig`) for layers ``targets``
        ([] = every layer the switch turns on)."""
        node: dict[str, Any] = {"mode": "selective" if self.save_ops else "non_reentrant", "preserve_rng_state": True}
        node |= {"determinism_check": "default", "save_ops": list(self.save_ops), "save_period": dict(self.save_period)}
        return node | {"targets": list(targets)}


POLICIES = (
    Policy("none", 0, label="no recompute"),
    Policy("full", 1, label="every layer, full"),
    Policy("every_2", 2, label="every 2nd layer, full"),
    Policy("every_4", 4, label="every 4th layer, full"),
    Policy(
        "selective_op",
        1,
        tuple(SAVE_OPS),
        {"aten.mm": 2},
        label="every layer, matmul/attention outputs saved except every second mm (torchtitan op SAC)",
    ),
    Policy("selective_mm", 1, tuple(SAVE_OPS), label="every layer, every matmul/attention output saved"),
)


def names() -> list[str]:
    """The ``recompute=`` words of the plan."""
    return [p.name for p in POLICIES]


def by_name(name: str) -> Policy:
    """The policy called ``name`` (a word of :func:`names`)."""
    return next(p for p in POLICIES if p.name == name)


def switch_on(model: nn.Module, policy: Policy, flags: list[bool], layer_paths: list[str]) -> None:
    """Turn ``policy`` on in ``model`` (a Hugging Face causal LM, changed in place) with the model's own switch,
    on the decoder layers (``layer_paths``, :func:`reportgen.plan.model.decoder_layers`) whose flag is set;
    ``none`` or no flag set leave the model alone."""
    from reportgen.models.hf import enable

    if policy.every == 0 or not any(flags):
        return
    targets = [] if all(flags) else [p for p, on in zip(layer_paths, flags) if on]
    enable(model, OmegaConf.merge(OmegaConf.structured(RecomputeConfig), policy.node(targets)))


def recompute_file(policy: Policy, n_layers: int, layer_prefix: str, header: list[str]) -> str:
    """The text of ``recompute/planned.yaml``: ``policy`` (not ``none``) as a ``recompute`` config group file
    for a model of ``n_layers`` decoder layers at ``layer_prefix`` (``model.layers``), under the comment
    lines ``header`` (the command that uses it, the plan's figures)."""
    targets = [] if policy.every <= 1 else [f"{layer_prefix}.{i}" for i in range(0, n_layers, policy.every)]
    body = OmegaConf.to_yaml(OmegaConf.create({**policy.node(targets), "planned": {"policy": policy.name}}))
    return "".join(f"# {line}\n" for line in header) + body
