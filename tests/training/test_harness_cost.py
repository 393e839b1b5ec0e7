"""The report costs little beside the checklist (issue 28, item 9): the harness's per-step work
(seeding, the finite check) and its fixed costs (the digits data, plots) are cut without
changing what they compute. benchmarks/harness_overhead.py times it; these tests check the values."""

from __future__ import annotations

import subprocess
import sys
import traceback

import numpy as np
import torch
from conftest import REPO

from reportgen.rng import seed_all
from reportgen.tasks import load_digits_arrays
from reportgen.training.loop import all_finite


def test_seed_all_without_an_accelerator_seeds_the_cpu_generator_as_torch_manual_seed_does(monkeypatch):
    seed_all(123)
    ours = torch.rand(5), np.random.rand(), __import__("random").random()
    torch.manual_seed(123), np.random.seed(123), __import__("random").seed(123)
    reference = torch.rand(5), np.random.rand(), __import__("random").random()
    assert torch.equal(ours[0], reference[0]) and ours[1:] == reference[1:]
    stacks = []
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: stacks.append(1) or [])
    seed_all(5)  # torch.manual_seed would record a stack per lazy device seed (CUDA, XPU, MTIA)
    assert stacks == [] or torch.accelerator.is_available()


def _params(*grads):
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g
    return params


def test_all_finite_is_exact_where_the_fused_norm_overflows_or_a_value_is_nan_or_inf():
    ok = torch.ones(3)
    big = torch.full((4,), 3e38)  # every element finite, its norm overflows float32
    assert all_finite(torch.tensor(0.5), _params(ok, big))
    assert not all_finite(torch.tensor(0.5), _params(ok, torch.tensor([1.0, float("nan")])))
    assert not all_finite(torch.tensor(0.5), _params(torch.tensor([float("-inf")]), ok))
    assert not all_finite(torch.tensor(float("nan")), _params(ok))
    assert not all_finite(torch.tensor([1.0, float("inf")]), _params(ok))  # a loss that is not a scalar
    assert all_finite(torch.tensor(1.0, dtype=torch.bfloat16), _params(ok.bfloat16()))
    assert all_finite(torch.tensor(1.0), [torch.nn.Parameter(torch.zeros(2))])  # no gradient at all


def test_digits_are_sklearns_own_values_read_without_importing_sklearn():
    code = (
        "import sys; from reportgen.tasks import load_digits_arrays; x, y = load_digits_arrays(); "
        "print(x.shape, int(y.sum()), 'sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["(1797,", "64)", str(int(load_digits_arrays()[1].sum())), "False"]
    from sklearn.datasets import load_digits

    reference, (images, labels) = load_digits(), load_digits_arrays()
    assert np.array_equal(images, reference.data) and np.array_equal(labels, reference.target)


def test_a_plot_is_drawn_once_with_the_same_bytes_as_before(monkeypatch):
    from matplotlib.figure import Figure

    from reportgen.checks.base.plots import finish_axes, to_svg

    def figure():
        fig = Figure(figsize=(4, 2))
        ax = fig.subplots()
        ax.plot([1, 2, 3], [3, 1, 2], label="plain", rasterized=True)
        finish_axes(fig, ax, "optimizer step", "saved MiB")  # tight_layout leaves a placeholder engine
        return fig

    draws = []
    real = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, renderer: draws.append(1) or real(self, renderer))
    svg = to_svg(figure())
    assert len(draws) == 1 and svg.startswith("<svg") and "plain</text>" in svg
    assert to_svg(figure()) == svg  # deterministic bytes
