"""All-zero evidence is flagged (issue 36, item 5): two all-zero tensors compare "bitwise equal" but show
nothing, so their row says so, and a parity section whose plain gradients are all zero is INCONCLUSIVE
(a loss that does not depend on the parameters, a user step that zeroes the gradients)."""

from __future__ import annotations

import torch

from reportgen.checks.base.run import Run
from reportgen.checks.parity.gradient import gradient_parity
from reportgen.config import GRADIENT_PARITY
from reportgen.results import Role, Status
from reportgen.results.compared import tensor_row
from reportgen.results.rows import zero_gradients_row


def test_two_all_zero_tensors_are_equal_with_a_note_that_they_show_nothing():
    row = tensor_row(GRADIENT_PARITY, "w.grad", torch.zeros(3), torch.zeros(3), None, None, Role.PARAM_GRAD)
    assert row.status == Status.PASS and row.detail.startswith("bitwise equal, both all zero")
    other = tensor_row(GRADIENT_PARITY, "w.grad", torch.ones(3), torch.ones(3), None, None, Role.PARAM_GRAD)
    assert other.detail == "bitwise equal"


def test_all_zero_plain_gradients_make_the_section_inconclusive_one_non_zero_passes():
    zero = zero_gradients_row(GRADIENT_PARITY, {"a": torch.zeros(2), "b": None, "c": torch.zeros(1)})
    assert (zero.status, zero.value, zero.role) == (Status.INCONCLUSIVE, 0.0, Role.ZERO_GRADIENTS)
    assert "every one of the plain twin's 2 parameter gradients is zero" in zero.detail
    some = zero_gradients_row(GRADIENT_PARITY, {"a": torch.zeros(2), "c": torch.tensor([0.0, 1e-30])})
    assert (some.status, some.value) == (Status.PASS, 1.0)


def test_gradient_parity_of_a_loss_that_ignores_the_parameters_is_inconclusive(setup):
    s = setup("+model=ffn")
    loss = s.task.loss
    s.task.loss = lambda output, target: 0.0 * loss(output, target)
    rows = gradient_parity(Run(s))
    gate = next(r for r in rows if r.role == Role.ZERO_GRADIENTS)
    assert gate.status == Status.INCONCLUSIVE
    grads = [r for r in rows if r.role == Role.PARAM_GRAD]
    assert grads and all("both all zero" in r.detail for r in grads)
    s.task.loss = loss
    assert next(r for r in gradient_parity(Run(s)) if r.role == Role.ZERO_GRADIENTS).status == Status.PASS
