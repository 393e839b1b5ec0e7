"""The plan's recompute file holds only ops the chosen attention runs: planned with ``attn=eager`` (the
docs/planning.md example), its save list names no sdpa kernel, and every op in it is called by the eager
model; a save-list entry never called is a WARN whose console line says so plainly."""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

from reportgen.checks.base.run import Run
from reportgen.commands import plan
from reportgen.plan.args import load_config
from reportgen.plan.model import build_causal_lm, real_batch
from reportgen.plan.policies import SAVE_OPS, SDPA_OPS, by_name

pytestmark = pytest.mark.hf

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "conf/examples/hf_causal_lm"


def _docs_example(out: Path) -> list[str]:
    """The words of docs/planning.md's ``python -m reportgen.plan ... attn=eager ... out=PLAN_DIR`` line."""
    line = next(
        line
        for line in (ROOT / "docs/planning.md").read_text().splitlines()
        if line.startswith("python -m reportgen.plan conf/examples/hf_causal_lm attn=eager")
    )
    words = shlex.split(line.replace("PLAN_DIR", str(out)))[3:]
    return [str(ROOT / words[0]), *words[1:]]


class _Calls(TorchDispatchMode):
    """Counts the aten overloads dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen[func] += 1
        return func(*args, **(kwargs or {}))


def _calls(attn: str) -> Counter:
    """Aten overloads one forward of the example model (2 layers, fp32, batch 2, seq 16) calls under ``attn``."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = build_causal_lm(load_config(EXAMPLE / "config.json"), torch.float32, attn)
    with _Calls() as calls:
        model(**real_batch(2, 16)[0])
    return calls.seen


def _called(name: str, seen: Counter) -> int:
    packet = getattr(torch.ops.aten, name.removeprefix("aten."))
    return sum(n for op, n in seen.items() if op.overloadpacket is packet)


@pytest.fixture(scope="module")
def docs_plan(tmp_path_factory) -> Path:
    """The plan folder docs/planning.md's eager example writes, planned once (two tests read it, none changes it)."""
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("docs-example") / "plan"
    assert plan.main(_docs_example(out)) == 0
    return out


def test_the_docs_eager_example_writes_a_save_list_without_sdpa_kernels(docs_plan):
    """The tester's flow: docs/planning.md's example plans with attn=eager and chooses a selective policy;
    its planned.yaml saved the sdpa kernels, which eager attention never calls (one WARN each in the main run)."""
    text = (docs_plan / "recompute" / "planned.yaml").read_text()
    planned = OmegaConf.create(text)
    assert planned.mode == "selective" and planned.planned.policy.startswith("selective_")  # not a vacuous pass
    assert list(planned.save_ops) == ["aten.mm"] and not set(planned.save_ops) & set(SDPA_OPS)
    assert "model.attn_implementation=eager recompute=planned" in text  # the command in its header runs eager
    assert "attn=eager never calls sdpa's attention kernels" in text


@pytest.mark.parametrize("policy", ["selective_op", "selective_mm"])
def test_every_saved_op_is_called_under_the_chosen_attention(policy):
    """Eager: every op of the save list is called and no sdpa kernel is; sdpa keeps torchtitan's whole list
    (its CUDA kernels for the GPU the plan is for), of which a CPU forward calls the CPU flash kernel."""
    eager, sdpa = by_name(policy).for_attn("eager"), by_name(policy).for_attn("sdpa")
    assert sdpa.save_ops == tuple(SAVE_OPS) and eager.save_ops == ("aten.mm",)
    assert eager.save_period == by_name(policy).save_period
    seen = _calls("eager")
    assert all(_called(op, seen) > 0 for op in eager.save_ops)
    assert all(_called(op, seen) == 0 for op in SDPA_OPS)
    assert _called("aten._scaled_dot_product_flash_attention_for_cpu", _calls("sdpa")) == 2  # one per layer


def test_a_save_op_never_called_is_a_warn_that_says_so_on_the_console(compose_cfg):
    """The main run's console line for the first WARN of the check keeps the finding and the fix: it used to be
    cut to "aten._scaled_dot_product_flash_attention: …; the other entries ..." with the finding hidden."""
    from reportgen.checks.policy import selective_policy
    from reportgen.commands.run import prepare
    from reportgen.errors import clip_keeping_advice, console_text

    sdpa = "aten._scaled_dot_product_flash_attention"
    cfg = compose_cfg(
        "+model=dropout_rng", "recompute=selective", f"recompute.save_ops=[aten.addmm,{sdpa}]", user_conf=True
    )
    rows = {r.item: r for r in selective_policy(Run(prepare(cfg)))}
    assert rows["aten.addmm"].status == "PASS" and rows[sdpa].status == "WARN" and rows[sdpa].value == 0
    line = clip_keeping_advice(console_text(f"{sdpa}: {rows[sdpa].detail}"))  # as reportgen.commands.run prints it
    assert line.startswith(f"{sdpa}: never called under this model: {sdpa}, so this entry saves nothing; ")
    assert line.endswith("; remove it from recompute.save_ops") and len(line) <= 200
    assert "aten.addmm ×4" in rows[sdpa].detail and "aten.addmm.default" in rows[sdpa].detail  # the report's row


@pytest.mark.slow
def test_the_docs_eager_example_runs_through_the_main_command_with_no_selective_policy_warn(docs_plan, tmp_path):
    """The tester's whole flow: the planned selective file through ``python -m reportgen``; every entry of its
    save list matches calls in the wrapped layers (the sdpa kernels used to be one WARN each)."""
    from conftest import run_pipeline

    from reportgen.config import SELECTIVE_POLICY

    out = docs_plan
    (tmp_path / "run").mkdir()
    code, frame = run_pipeline(
        tmp_path / "run",
        f"hydra.searchpath=[file://{out}]",
        "+model=hf_causal_lm",
        f"model.config={EXAMPLE / 'config.json'}",
        "model.attn_implementation=eager",
        "recompute=planned",
    )
    assert code == 0, frame[frame.status != "PASS"].to_string() if frame is not None else code
    rows = frame[frame.check == SELECTIVE_POLICY]
    assert list(rows.item) == ["aten.mm"] and (rows.status == "PASS").all() and (rows.value > 0).all()
