"""A new check of the parity kind, added the way a developer adds one: a function, its record with
the roles its rows use, and one registry entry. Nothing else is edited: the pipeline renders it,
judges it, signs it and the verifier re-judges it, reading what its rows mean from their roles
(issue "One name, one config, one owner", item 5)."""

from __future__ import annotations

import base64
import functools
import json

import pytest
from conftest import SMALL, compose_config

from reportgen import checks
from reportgen.checks import Check, Section, declared_roles, roles_of, sections
from reportgen.checks.base.run import Run
from reportgen.commands import run as pipeline
from reportgen.results import Kind, Role, Row, Status, frame_from_json
from reportgen.results.compared import tensor_row
from reportgen.trust.documents import ENVELOPE_NAME
from reportgen.twins.forward import forward_backward
from reportgen.verify.run import status_mismatches

NAME = "twin output parity"
INTRO = "The loss and every output tensor of one forward and backward, recompute twin vs plain twin."


def twin_output_parity(run: Run, shift: float = 0.0) -> list[Row]:
    """One forward and backward of the plain and the recompute twin on the fixed batch; the loss and
    every output leaf compared (``allclose`` at the run's tolerances). ``shift`` is added to the
    recompute twin's values: a fault, so a test can see the verdict flip."""
    setup = run.setup
    rtol, atol = setup.tolerance()
    plain, recompute = (forward_backward(setup.twin(r), setup.batch, setup.config.forward_seed) for r in (False, True))
    rows = [tensor_row(NAME, "loss", plain.loss, recompute.loss + shift, rtol, atol, Role.LOSS)]
    for leaf, tensor in plain.output.items():
        rows.append(tensor_row(NAME, leaf, tensor, recompute.output[leaf] + shift, rtol, atol, Role.OUTPUT))
    return rows


#: The check's record: the section it writes and the roles its rows carry (both of kind PARITY).
CHECK = Check(twin_output_parity, (Section(NAME, INTRO, roles=(Role.LOSS, Role.OUTPUT)),))


@pytest.fixture
def register():
    """``register(check)``: append one entry to the real registry for this test (the list every
    reader shares, the pipeline's own name for it included), then remove it."""
    added = []

    def add(check: Check) -> None:
        checks.REGISTRY.append(check)
        added.append(check)

    yield add
    for check in added:
        checks.REGISTRY.remove(check)


def _section(html: str) -> str:
    """The new check's section of the report (its ``div`` up to the next section's)."""
    start = html.index(f'<div class="section" id="{NAME.replace(" ", "-")}">')
    end = html.find('<div class="section"', start + 1)
    return html[start : end if end > 0 else len(html)]


def _statement(run) -> dict:
    """The statement inside the run's envelope (decoded; :func:`reportgen.verify.verify` checks it)."""
    envelope = json.loads((run / ENVELOPE_NAME).read_bytes())
    return json.loads(base64.b64decode(envelope["payload"]))


def _run(tmp_path, private):
    """The whole pipeline on the built-in ``ffn`` model, signed, no PDF: ``(exit code, frame, html)``."""
    cfg = compose_config("+model=ffn", *SMALL, "report.pdf=false", "report.sign=true", f"report.key_path={private}")
    code = pipeline.run(cfg, tmp_path)
    frame = frame_from_json((tmp_path / "results.json").read_text())
    return code, frame, (tmp_path / "report.html").read_text()


def _verified(tmp_path, public) -> list[str]:
    """The verifier's failing lines for the run folder (empty: verified)."""
    from reportgen.trust.keys import load_public_key
    from reportgen.verify import verify

    return [str(c) for c in verify(tmp_path, load_public_key(public)) if c.status == "FAIL"]


def test_the_record_declares_parity_roles_the_registry_then_reads(register):
    assert all(role.kind is Kind.PARITY for role in CHECK.sections[0].roles)
    assert NAME not in [s.name for s in sections()]
    register(CHECK)
    assert NAME in [s.name for s in sections()]
    assert {Role.LOSS, Role.OUTPUT} <= roles_of(Kind.PARITY)
    assert declared_roles(NAME) >= {Role.LOSS, Role.OUTPUT, Role.EXCEPTION, Role.DISABLED}


def test_a_new_parity_check_renders_judges_signs_and_verifies(register, tmp_path, signing_key_pair):
    private, public = signing_key_pair
    register(CHECK)
    code, frame, html = _run(tmp_path, private)
    rows = frame[frame.check == NAME]
    assert len(rows) >= 2 and set(rows.role) == {Role.LOSS, Role.OUTPUT}
    assert set(rows.status) == {Status.PASS}  # judged by results.judge from the allclose comparator
    shown = _section(html)  # the generic rows table: one group per role, collapsed when it passes
    assert (
        INTRO in shown
        and '<code class="name">loss</code>' in shown
        and '<span class="status PASS">PASS</span>' in shown
    )
    predicate = _statement(tmp_path)["predicate"]
    signed = {c["check"]: c for c in predicate["checks"]}
    assert NAME in predicate["required"] and signed[NAME]["status"] == Status.PASS
    assert signed[NAME]["rows"] == len(rows)
    assert code == 0 and predicate["verdict"] == Status.PASS
    assert _verified(tmp_path, public) == []  # signed, and every status re-judged from results.json
    # Every row of the run carries a role its check declares (or one the pipeline gives any check).
    registered = {s.name for s in sections()}
    undeclared = {
        (check, role)
        for check, role in zip(frame.check, frame.role)
        if check in registered and role not in declared_roles(check)
    }
    assert undeclared == set()
    # The verifier reads the record: a parity row may not say it is advisory.
    edited = frame.copy()
    edited.loc[edited.check == NAME, "on_miss"] = Status.WARN
    assert any(f"row {NAME} / loss" in line and "misses as FAIL" in line for line in status_mismatches(edited))


def test_a_failing_variant_flips_the_verdict_and_still_verifies(register, tmp_path, signing_key_pair):
    private, public = signing_key_pair
    register(Check(functools.partial(twin_output_parity, shift=1.0), CHECK.sections))
    code, frame, html = _run(tmp_path, private)
    rows = frame[(frame.check == NAME) & (frame.role != Role.DIAGNOSIS)]
    assert set(rows.role) == {Role.LOSS, Role.OUTPUT} and set(rows.status) == {Status.FAIL}
    predicate = _statement(tmp_path)["predicate"]
    assert {c["check"]: c["status"] for c in predicate["checks"]}[NAME] == Status.FAIL
    assert code == 1 and predicate["verdict"] == Status.FAIL
    assert len(frame[(frame.check == NAME) & (frame.role == Role.DIAGNOSIS)]) == 1  # the report explains it
    shown = _section(html)
    assert '<code class="name">loss</code>' in shown and '<span class="status FAIL">FAIL</span>' in shown
    assert _verified(tmp_path, public) == []  # a signed FAIL verifies: the verdict is the one its numbers give
