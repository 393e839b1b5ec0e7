"""results.csv/json carry a schema version and a written schema (docs/results-schema.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_pipeline

from reportgen.results import SCHEMA_VERSION, Row, SchemaVersionError, frame_from_json, frame_to_json, to_frame

DOC = Path(__file__).resolve().parents[2] / "docs" / "results-schema.md"


def documented_columns() -> set[str]:
    """Every `column` named in the first cell of a table row of docs/results-schema.md."""
    cells = [line.split("|")[1] for line in DOC.read_text().splitlines() if line.startswith("| `")]
    return {name for cell in cells for name in re.findall(r"`([a-z_0-9]+)`", cell)}


def test_every_row_carries_the_schema_version_and_it_round_trips():
    frame = to_frame(
        [Row(check="c", item="i", variant="recompute", metric="m", value=1.0, threshold_value=2.0, comparator="<=")]
    )
    assert frame.schema_version.tolist() == [SCHEMA_VERSION] == [2]
    assert frame_from_json(frame_to_json(frame)).schema_version.tolist() == [2]


def test_a_file_without_the_column_is_version_1_and_an_unknown_version_is_refused():
    assert frame_from_json(json.dumps([{"check": "c", "status": "INFO"}])).schema_version.tolist() == [1]
    with pytest.raises(SchemaVersionError, match="schema version 9; this reportgen reads versions 1, 2"):
        frame_from_json(json.dumps([{"check": "c", "status": "INFO", "schema_version": 9}]))


def test_the_doc_states_the_version_it_describes():
    assert f"**Schema version: {SCHEMA_VERSION}**" in DOC.read_text()


@pytest.mark.slow
def test_every_column_a_run_writes_is_documented(tmp_path):
    code, frame = run_pipeline(tmp_path, "+model=mlp")
    assert code in (0, 1) and frame is not None
    assert sorted(set(frame.columns) - documented_columns()) == []
