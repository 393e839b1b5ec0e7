"""Every output leaf is accounted for: cache objects, None, numbers (issue 16 item 2)."""

from __future__ import annotations

from pathlib import Path

import torch

from reportgen.checks.parity.gradient import compare
from reportgen.structure import named_tensors, other_leaves
from reportgen.twins.forward import StepOutput


class KVCache:
    """A cache object like transformers 4.x's DynamicCache: one key and value tensor per layer."""

    def __init__(self, layers: int = 2):
        self.key_cache = [torch.full((1, 2), float(i)) for i in range(layers)]
        self.value_cache = [torch.full((1, 2), float(-i)) for i in range(layers)]


def step(output) -> StepOutput:
    return StepOutput(
        torch.tensor(1.0), dict(named_tensors(output, "output")), {}, {}, {}, other_leaves(output, "output")
    )


def rows_by_item(plain_out, recompute_out):
    plain, recompute = step(plain_out), step(recompute_out)
    return {r.item: r for r in compare(plain, recompute, 1e-6, 1e-6, plain)}


def test_a_cache_objects_tensors_are_named_and_compared_when_both_twins_return_it():
    out = {"logits": torch.ones(2), "past_key_values": KVCache()}
    assert [name for name, _ in named_tensors(out, "output")] == [
        'output["logits"]',
        'output["past_key_values"].key_cache[0]',
        'output["past_key_values"].key_cache[1]',
        'output["past_key_values"].value_cache[0]',
        'output["past_key_values"].value_cache[1]',
    ]
    rows = rows_by_item(out, {"logits": torch.ones(2), "past_key_values": KVCache()})
    assert rows['output["past_key_values"].key_cache[1]'].status == "PASS"
    assert rows['output["past_key_values"]'].status == "INFO"  # the object itself: stated


def test_a_cache_only_the_plain_twin_returns_is_stated_not_failed():
    rows = rows_by_item(
        {"logits": torch.ones(2), "past_key_values": KVCache()}, {"logits": torch.ones(2), "past_key_values": None}
    )
    cache = rows['output["past_key_values"]']
    assert cache.status == "INFO" and "plain returned cache KVCache, 4 tensors, recompute returned None" in cache.detail
    assert not any("key_cache" in item for item in rows)  # its tensors are not failures of the recompute twin
    assert rows['output["logits"]'].status == "PASS"


def test_python_scalars_are_compared_and_a_difference_fails():
    rows = rows_by_item((torch.ones(1), 3, None, "a"), (torch.ones(1), 4, None, "a"))
    assert (
        rows["output[1]"].status == "FAIL"
        and "plain returned int 3, recompute returned int 4" in rows["output[1]"].detail
    )
    assert rows["output[2]"].status == "INFO" and rows["output[3]"].status == "PASS"


def test_names_wrap_after_dots_never_mid_word():
    from reportgen.report.render import fmt_name

    assert str(fmt_name("model.embed_tokens.weight.grad")) == "model.<wbr>embed_tokens.<wbr>weight.<wbr>grad"
    assert str(fmt_name('output["<x>"]')) == "output<wbr>[&#34;&lt;x&gt;&#34;]"  # still escaped
    css = (Path(__file__).resolve().parents[2] / "templates" / "report.css").read_text()
    assert "code.name { overflow-wrap: normal; word-break: normal; }" in css
    long = "x" * 30 + "_a_name_without_dots_" + "y" * 50  # no dot to break at: after each _, else every 24
    assert str(fmt_name(long)).split("<wbr>") == [
        "x" * 24,
        "x" * 6 + "_",
        "a_",
        "name_",
        "without_",
        "dots_",
        "y" * 24,
        "y" * 24,
        "y" * 2,
    ]
