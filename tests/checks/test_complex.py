"""Complex parameters stay complex and are compared in both parts, at their real dtype's tolerances (issue 43's
held-out miss: ``model.to(dtype)`` dropped the imaginary part, complex tolerances were (0, 0) and the distance read
the real part only)."""

import pytest
import torch
from conftest import run_pipeline

from reportgen.results.distance import measure, tolerances
from reportgen.twins.setup import in_dtype


def test_a_difference_in_the_imaginary_part_only_is_measured():
    plain, recompute = torch.tensor([1 + 1j, 2 - 1j]), torch.tensor([1 + 1j, 2 - 1.5j])
    d = measure(recompute, plain, *tolerances(plain.dtype))
    assert d.max_abs_err == pytest.approx(0.5) and not d.bitwise_equal and d.worst_excess > 0


def test_complex_tolerances_are_the_real_dtypes():
    assert tolerances(torch.complex64) == tolerances(torch.float32) == (1.3e-6, 1e-5)
    assert tolerances(torch.complex128) == tolerances(torch.float64)


def test_the_runs_dtype_applies_to_real_floating_tensors_only():
    model = torch.nn.Linear(2, 2)
    model.w = torch.nn.Parameter(torch.tensor([1 + 2j, 3 - 4j]))
    in_dtype(model, torch.float64)
    assert model.weight.dtype == torch.float64 and model.w.dtype == torch.complex64
    assert torch.equal(model.w.imag, torch.tensor([2.0, -4.0]))  # the imaginary part kept


@pytest.mark.slow
@pytest.mark.parametrize("fault", [False, True])
def test_a_complex_parameter_model_holds_and_a_fault_in_its_imaginary_part_fails(tmp_path, fault):
    code, frame = run_pipeline(tmp_path, "+model=complex_params", f"model.imag_fault={fault}", user_conf=True)
    assert code == (1 if fault else 0), frame[frame.status != "PASS"][["check", "item", "status"]].to_string()
    grad = frame[(frame.check == "gradient parity") & (frame["item"] == "1.w.grad")].iloc[0]
    assert grad.status == ("FAIL" if fault else "PASS")
