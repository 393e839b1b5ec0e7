"""Nothing clipped in the PDF (issue 28 item 3): a failing report with long item names, a name with no
dot to break at, a long unbroken path in a detail and a long command lays out with every text box
inside the page's content box. WeasyPrint's own layout boxes are read (no poppler needed)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import tiny_meta

from reportgen.checks import required_names
from reportgen.paths import templates_dir
from reportgen.report.render import render_pages
from reportgen.results import Role, Status, claim_verdict, frame_from_json, to_frame
from reportgen.results.compared import tensor_row

DATA = Path(__file__).resolve().parents[1] / "data" / "mlp_passing_results.json.gz"


def failing_frame() -> pd.DataFrame:
    """The real passing mlp frame with its gradient-parity rows replaced by 14 failing rows of long names."""
    with gzip.open(DATA, "rt") as f:
        base = frame_from_json(f.read())
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(14):
        plain = torch.randn(64, generator=g)
        name = (
            f"model.decoder.layers.{i}.self_attention_with_rotary_embeddings.query_key_value_projection.weight.grad"
            if i % 3
            else "x" * 40 + f"_a_parameter_name_without_any_dot_at_all_{i}_" + "y" * 60
        )
        rows.append(
            tensor_row("gradient parity", name, plain, plain + 1e-3 * (i + 1), None, None, role=Role.PARAM_GRAD)
        )
    rows[-1].detail += "; see /a/long/path/without/spaces/" + "segment/" * 20
    return pd.concat([base[base.check != "gradient parity"], to_frame(rows)], ignore_index=True)


def text_outside(document) -> list[tuple[int, float, str]]:
    """``(page, points past the edge, text)`` of every text box not inside its page's content box (a
    margin box's text, the footer: not inside the sheet)."""
    from weasyprint.formatting_structure import boxes

    out = []
    for number, page in enumerate(document.pages, 1):
        box = page._page_box
        content = (
            box.content_box_x(),
            box.content_box_y(),
            box.content_box_x() + box.width,
            box.content_box_y() + box.height,
        )
        for child in box.children:  # the footer lives in the margin: it must stay inside the sheet
            edges = (0, 0, page.width, page.height) if isinstance(child, boxes.MarginBox) else content
            for text in (b for b in child.descendants() if isinstance(b, boxes.TextBox)):
                x0, y0 = text.position_x, text.position_y
                past = max(edges[0] - x0, x0 + text.width - edges[2], edges[1] - y0, y0 + text.height - edges[3])
                if past > 0.5:
                    out.append((number, round(past, 1), text.text[:60]))
    return out


@pytest.mark.slow
def test_a_failing_report_with_long_names_keeps_every_text_box_inside_the_page(tmp_path):
    from weasyprint import HTML

    frame = failing_frame()
    assert (frame[frame.check == "gradient parity"].status == Status.FAIL).all()
    meta = tiny_meta(tmp_path)
    meta["command"] = "python -m reportgen " + " ".join(f"a.long.override.key_{i}=" + "v" * 50 for i in range(4))
    required = required_names(None)
    _, pdf_html = render_pages(frame, meta, claim_verdict(frame, required), required)
    document = HTML(string=pdf_html, base_url=str(templates_dir())).render()
    assert text_outside(document) == []  # before the fix: 34 boxes, up to 185 pt past the right edge
    words = " ".join(b.text for p in document.pages for b in p._page_box.descendants() if hasattr(b, "text"))
    words = words.replace("\u200b", "")  # the <wbr> break points
    assert "segment/" in words and "a_parameter_name_without_any_dot_at_all_12" in words.replace(" ", "")
