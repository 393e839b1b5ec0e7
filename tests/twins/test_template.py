"""One build of the user's model per process; twins are exact copies (reportgen.twins.template)."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import run_pipeline
from user_models import counting

from reportgen.errors import ExitCode
from reportgen.twins.template import Template, copy_module, shared_references


def test_factory_runs_once_across_every_check_estimate_search_and_budget(tmp_path):
    counting.CALLS["count"] = 0
    code, frame = run_pipeline(
        tmp_path,
        "+model=ffn",
        "model._target_=user_models.counting.build_counted",
        "larger_batch.enabled=true",
        "larger_batch.max_batch_size=64",
        "budget.examples=64",
        "run.max_estimated_minutes=60",
    )
    assert code == 0
    checks = set(frame["check"])
    assert {"gradient parity", "trajectory parity", "warm-step memory", "task metrics"} <= checks
    assert any("larger" in c for c in checks)
    assert counting.CALLS["count"] == 1


def test_copy_keeps_ties_parametrizations_buffers_attributes_and_hooks():
    torch.manual_seed(3)
    template = counting.build_tricky()
    twin = copy_module(template, lambda t: t.clone())
    assert twin.head.weight is twin.embed.weight and twin.head.weight is not template.head.weight
    assert torch.equal(twin.scale, template.scale) and twin.scale.data_ptr() != template.scale.data_ptr()
    original = twin.mid.parametrizations.weight.original
    assert original is not template.mid.parametrizations.weight.original
    assert torch.equal(twin.mid.weight, template.mid.weight) and torch.equal(twin.mid.weight, twin.mid.weight.T)
    twin(torch.tensor([[1, 2, 3]]))
    assert (twin.calls, template.calls) == (1, 0)  # the bound-method hook acts on the copy
    loss = twin(torch.tensor([[1, 2]])).sum()
    loss.backward()
    assert twin.embed.weight.grad is not None and template.embed.weight.grad is None
    assert original.requires_grad and original.grad is not None


def test_a_closure_hook_over_a_module_is_named():
    assert shared_references(counting.build_tricky()) == []
    named = shared_references(counting.build_tricky(closure_hook=True))
    assert len(named) == 1 and named[0].startswith("mid._forward_hooks: build_tricky.<locals>.<lambda>")


def test_a_twin_leaves_torch_generators_where_a_fresh_build_would():
    torch.manual_seed(7)
    model = counting.build_tricky()
    template = Template(model, 7, torch.get_rng_state())
    fresh = torch.rand(4)
    torch.manual_seed(123)
    template.twin(torch.device("cpu"))
    assert torch.equal(torch.rand(4), fresh)


def test_a_renderer_that_cannot_load_stops_the_run_before_the_model_is_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "weasyprint", None)  # `import weasyprint` raises, as without Pango
    counting.CALLS["count"] = 0
    code, _ = run_pipeline(
        tmp_path, "+model=ffn", "model._target_=user_models.counting.build_counted", "report.pdf=true"
    )
    out = capsys.readouterr().out
    assert code == ExitCode.USAGE and counting.CALLS["count"] == 0
    assert "the PDF renderer (WeasyPrint) is not installed" in out and "report.pdf=false" in out


def test_a_run_folder_that_cannot_be_written_stops_the_run_before_the_model_is_built(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    counting.CALLS["count"] = 0
    code, _ = run_pipeline(
        tmp_path / "a-file" / "run", "+model=ffn", "model._target_=user_models.counting.build_counted"
    )
    out = capsys.readouterr().out
    assert code == ExitCode.USAGE and counting.CALLS["count"] == 0
    assert "is not writable" in out and "hydra.run.dir=PATH" in out


@pytest.mark.parametrize(
    "factory, because",
    [
        ("build_tricky_ffn", "hooks the factory registered hold a module of the model"),
        ("build_locked_ffn", "copy.deepcopy cannot copy the model (TypeError"),
    ],
)
def test_a_model_a_copy_cannot_stand_for_is_built_by_its_factory_for_every_twin(tmp_path, factory, because):
    """A closure hook over a module would act on (and change) the one build from every copy; a lock cannot
    be copied at all: each twin is then a fresh build, the claim is judged as before, and a row says why."""
    counting.CALLS["count"] = 0
    code, frame = run_pipeline(
        tmp_path,
        "+model=ffn",
        f"model._target_=user_models.counting.{factory}",
        "budget.enabled=false",
        "timing.enabled=false",
        "verdict.required=[gradient parity,optimizer-step parity,state parity,trajectory parity]",
    )
    row = frame[frame["item"] == "twins built by the factory"]
    assert code == 0 and len(row) == 1 and row.status.item() == "INFO"
    assert because in row.detail.item() and "bound methods" in row.detail.item()
    assert counting.CALLS["count"] > 10  # the build, the probe, and one per twin
