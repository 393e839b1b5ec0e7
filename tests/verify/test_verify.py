"""``python -m reportgen.verify``: a signed run verifies; any changed byte, another key, a
lying verdict or a swapped statement does not (issue 5, "What I will check")."""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import REQUIRED, make_key, run_cli, signed_run, tiny_frame

from reportgen.results import Role, claim_verdict
from reportgen.trust.documents import ENVELOPE_NAME
from reportgen.trust.keys import fingerprint, load_public_key, load_signing_key
from reportgen.trust.statement import sign_statement
from reportgen.verify import main, verify
from reportgen.verify.outcome import FAIL, NOTE, PASS
from reportgen.verify.run import verify_run_pdf

#: Every file a signed run folder vouches for, and the two signed outputs themselves.
SIGNED_ARTIFACTS = [
    "report.pdf",
    ENVELOPE_NAME,
    "report.unsigned.pdf",
    "results.json",
    "results.csv",
    "report.html",
    ".hydra/config.yaml",
    ".hydra/overrides.yaml",
    "plots/memory.svg",
]
#: XOR masks, taken in turn: lowest bit, ASCII case bit (hex digits, JSON, base64), top bit.
MASKS = (0x01, 0x20, 0x80)


@pytest.fixture(scope="module")
def keys_and_run(tmp_path_factory):
    """(private key, public key, another public key, signed run folder), made once."""
    folder = tmp_path_factory.mktemp("verify")
    private, public = make_key(folder / "keys")
    _, other = make_key(folder / "keys", "other-key.pem")
    return private, public, other, signed_run(folder / "run", private)


@pytest.fixture
def run(keys_and_run, tmp_path) -> Path:
    """A private copy of the signed run folder (tests change bytes in it)."""
    return Path(shutil.copytree(keys_and_run[3], tmp_path / "run"))


@pytest.fixture
def public(keys_and_run):
    return load_public_key(keys_and_run[1])


def failed(checks) -> list[str]:
    """Lines of the failed checks."""
    return [c.line for c in checks if c.status == FAIL]


def spread(length: int, count: int = 25) -> list[int]:
    """``count`` evenly spaced byte positions, plus the first and the last byte."""
    return sorted({0, length - 1, *(round(i * (length - 1) / (count - 1)) for i in range(count))})


def contents_gap(pdf: bytes) -> tuple[int, int]:
    """``(start, end)`` of the signature's ``<hex>`` /Contents: the only bytes its digest skips."""
    _, length1, start2, _ = map(int, re.findall(rb"/ByteRange \[(\d+) (\d+) (\d+) (\d+)", pdf)[-1])
    return length1, start2


def test_signed_run_and_lone_pdf_verify(run, public, capsys):
    checks = verify(run, public)
    assert not failed(checks), failed(checks)
    names = [c.name for c in checks if c.status == PASS]
    for expected in (
        "PDF signature",
        "PDF signer",
        "envelope signature",
        "statement",
        "verdict",
        "rendered pages",
        f"{ENVELOPE_NAME} on disk",
        "subject results.csv",
        "subject .hydra/config.yaml",
        "subject report.unsigned.pdf",
    ):
        assert expected in names
    assert not failed(verify(run / "report.pdf", public))
    assert main([str(run / "report.pdf"), "--key", str(run.parent.parent / "missing")]) == 2  # usage: no such key
    capsys.readouterr()


@pytest.mark.slow
def test_cli_exit_codes_and_one_line_per_check(keys_and_run, run, tmp_path):
    _, public, other, _ = keys_and_run

    def cli(*args):  # conftest's run_cli: however the suite starts its command-line processes
        return run_cli(tmp_path, *map(str, args), module="reportgen.verify", timeout=120)

    ok = cli(run, "--key", public)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0] == f"checking a run folder: {run}"
    assert all(line.split()[0] in (PASS, NOTE) for line in lines[1:-1]) and lines[-1].startswith(
        "VERIFIED (run folder)"
    )
    fp = fingerprint(load_public_key(public))
    assert f"PASS envelope signature (DSSE, key sha256:{fp})" in lines
    assert cli(run / "report.pdf", "--key", public).returncode == 0
    wrong = cli(run / "report.pdf", "--key", other)
    assert wrong.returncode == 1 and wrong.stdout.splitlines()[-1].startswith("NOT VERIFIED")
    assert "FAIL envelope signature: no valid signature by key" in wrong.stdout
    for args in (
        (run / "nope.pdf", "--key", public),
        (run, "--key", run / "results.json"),
        (run, "--key", keys_and_run[0]),
    ):  # no such target; not a key; a private key
        usage = cli(*args)
        assert usage.returncode == 2 and "Traceback" not in usage.stderr and len(usage.stderr.splitlines()) == 1


def test_another_key_fails_everything_it_signed(keys_and_run, run):
    other = load_public_key(keys_and_run[2])
    for target in (run, run / "report.pdf"):
        lines = failed(verify(target, other))
        assert any(line.startswith("FAIL envelope signature") for line in lines)
        assert any(line.startswith("FAIL PDF signer") for line in lines)


@pytest.mark.parametrize("name", SIGNED_ARTIFACTS)
def test_flipping_one_byte_anywhere_in_a_signed_artifact_fails(run, public, name):
    path = run / name
    original = path.read_bytes()
    positions = spread(len(original))
    for i, position in enumerate(positions):
        flipped = bytearray(original)
        flipped[position] ^= MASKS[i % len(MASKS)]
        path.write_bytes(bytes(flipped))
        assert failed(verify(run, public)), f"{name}: byte {position} changed, run folder still verifies"
        if name == "report.pdf":
            assert failed(verify_run_pdf(bytes(flipped), public).checks), f"byte {position} changed, PDF still verifies"
    path.write_bytes(original)
    assert not failed(verify(run, public))


def test_flips_inside_the_signature_contents_fail(run, public):
    """The /Contents hex is the one region the PDF digest skips: case, padding, certificate, versions."""
    pdf = (run / "report.pdf").read_bytes()
    start, end = contents_gap(pdf)
    hex_text = pdf[start + 1 : end - 1]
    letter = next(i for i, c in enumerate(hex_text) if chr(c) in "ABCDEF")
    padding = len(hex_text.rstrip(b"0")) + 10
    edits = {
        "lower-case a hex letter": (start + 1 + letter, 0x20),
        "a padding zero becomes 1": (start + 1 + padding, 0x01),
        "SignedData version 1 becomes 0": (start + 1 + hex_text.index(b"020101") + 5, 0x01),
        "a byte of the embedded certificate": (start + 1 + 2 * 200, 0x01),
        "the opening <": (start, 0x01),
        "the closing >": (end - 1, 0x01),
    }
    edits |= {f"gap position {p}": (p, 0x01) for p in spread(end - start, 40)}
    for what, (position, mask) in edits.items():
        flipped = bytearray(pdf)
        flipped[position] ^= mask
        assert failed(verify_run_pdf(bytes(flipped), public).checks), what


def test_bytes_appended_after_the_signature_fail(run, public):
    pdf = (run / "report.pdf").read_bytes()
    for tail in (b"\n", b"%%EOF\n", b"\x00"):
        assert any("PDF signature" in line for line in failed(verify_run_pdf(pdf + tail, public).checks))


def test_a_signed_statement_whose_verdict_does_not_follow_from_its_numbers_fails(keys_and_run, tmp_path, public):
    lying = signed_run(tmp_path / "lying", keys_and_run[0], failing=True, verdict="PASS")
    for target in (lying, lying / "report.pdf"):
        lines = failed(verify(target, public))
        assert lines == ["FAIL verdict: the statement says PASS, results.json gives FAIL"]


def test_a_signed_row_whose_status_contradicts_its_value_fails_naming_the_row(keys_and_run, tmp_path, public):
    """Right key, consistent verdict, but one row says PASS where its own numbers give FAIL."""
    frame = tiny_frame(failing=True)
    lie = frame["item"] == "blocks.0.lin.weight.grad"
    frame.loc[lie, "status"] = "PASS"
    assert claim_verdict(frame, REQUIRED) == "PASS"
    lying = signed_run(tmp_path / "lying-row", keys_and_run[0], frame=frame)
    for target in (lying, lying / "report.pdf"):
        (line,) = failed(verify(target, public))
        assert line.startswith(
            "FAIL verdict: row gradient parity / blocks.0.lin.weight.grad / recompute / max_abs_err says PASS"
        ) and line.endswith("gives FAIL")


def test_pass_without_a_comparison_or_flagged_outside_the_experiment_fails(keys_and_run, tmp_path, public):
    frame = tiny_frame()
    frame.loc[frame["item"] == "loss", ["comparator", "status"]] = ["", "PASS"]
    frame.loc[frame["item"] == "RNG torch.get_rng_state()", "status"] = "FLAGGED"
    frame.loc[frame["item"] == "RNG torch.get_rng_state()", "comparator"] = ""
    lines = failed(verify(signed_run(tmp_path / "bare", keys_and_run[0], frame=frame), public))
    assert len(lines) == 1 and "loss / recompute / max_abs_err says PASS without a comparison" in lines[0]
    assert "RNG torch.get_rng_state() / recompute / bytes_differing says FLAGGED" in lines[0]


def test_statement_tolerances_are_the_parity_rows_and_an_edited_one_fails(keys_and_run, tmp_path, public):
    """Issue 34, item 4: the statement lists the rtol/atol its parity rows used; re-signed with the same key
    after its tolerances were edited, it fails naming them; untouched, it verifies."""
    frame = tiny_frame()
    parity = frame.role.isin([Role.LOSS, Role.PARAM_GRAD])
    frame.loc[parity, "rtol"], frame.loc[parity, "atol"] = 1.3e-6, 1e-5
    run = signed_run(tmp_path / "tolerances", keys_and_run[0], pdf=False, frame=frame)
    checks = verify(run, public)
    assert not failed(checks) and "tolerances" in [c.name for c in checks if c.status == PASS]
    statement = json.loads(base64.b64decode(json.loads((run / ENVELOPE_NAME).read_text())["payload"]))
    assert statement["predicate"]["tolerances"]["used"] == [{"rtol": "0.0000013", "atol": "0.00001", "rows": 2}]
    key = load_signing_key(True, str(keys_and_run[0]))
    for where, expected in (
        (
            "used",
            "tolerances.used: the statement says atol=0.00001 rows=2 rtol=0, results.json atol=0.00001 rows=2 "
            "rtol=0.0000013",
        ),
        ("rtol", "the statement's atol=0.00001 rtol=0 is no pair the parity rows used"),
    ):
        edited = copy.deepcopy(statement)
        tolerances = edited["predicate"]["tolerances"]
        (tolerances["used"][0] if where == "used" else tolerances)["rtol"] = "0"
        (run / ENVELOPE_NAME).write_bytes(sign_statement(edited, key))
        assert failed(verify(run, public)) == [f"FAIL tolerances: {expected}"]


def test_a_statement_from_another_run_fails(keys_and_run, run, tmp_path, public):
    other_run = signed_run(tmp_path / "other", keys_and_run[0], failing=True)
    shutil.copy(other_run / ENVELOPE_NAME, run / ENVELOPE_NAME)
    lines = failed(verify(run, public))
    assert f"FAIL {ENVELOPE_NAME} on disk: differs from the envelope attached in report.pdf" in lines
    assert any(line.startswith("FAIL subject results.json") for line in lines)


def test_unsigned_run_and_unlisted_files(keys_and_run, run, tmp_path, public):
    unsigned = signed_run(tmp_path / "unsigned", None)
    assert failed(verify(unsigned, public)) and failed(verify(unsigned / "report.pdf", public))
    (run / "notes.txt").write_text("added after signing\n")
    checks = verify(run, public)
    assert not failed(checks)
    # issue 11, item 10: every unlisted file is named, Hydra's job log included
    assert [c.name for c in checks if c.status == NOTE] == ["not covered: __main__.log", "not covered: notes.txt"]


def test_envelope_is_canonical_json(run, public):
    """Re-indented JSON carries the same signed payload, yet it is a changed file: it fails."""
    path = run / ENVELOPE_NAME
    path.write_text(json.dumps(json.loads(path.read_text()), indent=4, sort_keys=True) + "\n")
    assert any("canonical layout" in line for line in failed(verify(run, public)))


def test_signed_run_without_pdf_verifies_from_the_folder(keys_and_run, tmp_path, public):
    run = signed_run(tmp_path / "nopdf", keys_and_run[0], pdf=False)
    checks = verify(run, public)
    assert not failed(checks) and "verdict" in [c.name for c in checks if c.status == PASS]
    notes = [c.line for c in checks if c.status == NOTE]
    assert notes == [
        "NOTE report.pdf (none in this run, made with report.pdf=false)",
        "NOTE not covered: __main__.log (not in the statement; nothing vouches for it)",
    ]
    (run / "results.json").write_text((run / "results.json").read_text().replace('"PASS"', '"FAIL"', 1))
    assert failed(verify(run, public))


def test_malformed_predicates_fail_with_their_line_not_a_type_error():
    """What a predicate must state is checked by type before it is used: a sweep whose ``jobs`` is
    not a list, or a comparison whose ``inputs`` is missing, names what is wrong (the helpers that
    let mypy follow those checks: ``present`` and ``of_type``)."""
    from reportgen.verify.comparison import check_comparison_predicate
    from reportgen.verify.outcome import VerifyError, of_type, present
    from reportgen.verify.sweep import check_sweep_predicate

    for jobs in ({"dir": "0"}, "0/", [], None):
        with pytest.raises(VerifyError, match="^the predicate lists no jobs$"):
            check_sweep_predicate({"jobs": jobs, "launch": {}})
    for inputs in (None, {"BASE": {}}, [{"label": "NEW"}, {"label": "BASE"}]):
        with pytest.raises(VerifyError, match="^the predicate does not name a BASE and a NEW run$"):
            check_comparison_predicate({"inputs": inputs, "outcome": "holds"})
    assert present({"a": 1}, "unused") == {"a": 1} and present(0, "unused") == 0  # falsy but present
    with pytest.raises(VerifyError, match="^no statement$"):
        present(None, "no statement")
    assert of_type([1], list, "unused") == [1]
    with pytest.raises(VerifyError, match="^not a list$"):
        of_type((1,), list, "not a list")
