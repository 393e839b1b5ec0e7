"""Keys, the signed statement and the signed PDF (issue 5), on a tiny run folder.

The run folder is made from hand-written result rows rendered with ``render_report`` (no
model is trained), so these tests take seconds. ``signed_run`` and friends live in conftest.py.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import REQUIRED, cost_rows, make_key, signed_run, tiny_meta
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from reportgen.config import MEMORY, TIME
from reportgen.results import Status, claim_verdict, frame_from_json, to_frame
from reportgen.trust import keys
from reportgen.trust.documents import ENVELOPE_NAME, PREDICATE_TYPE
from reportgen.trust.keys import SigningError, load_signing_key, signature_label
from reportgen.trust.statement import claim_predicate, decimal_string, run_files


@pytest.fixture(scope="module")
def key_pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_key(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, key_pair) -> Path:
    return signed_run(tmp_path_factory.mktemp("runs") / "run", key_pair[0])


def statement_of(run: Path) -> dict:
    """The statement inside a run's envelope (payload decoded, not verified)."""
    envelope = json.loads((run / ENVELOPE_NAME).read_bytes())
    return json.loads(base64.b64decode(envelope["payload"]))


# --------------------------------------------------------------------------- keys


def test_generate_writes_private_0600_and_public_beside_it_and_never_overwrites(tmp_path):
    private, public = keys.generate_key(tmp_path / "team" / "signing-key.pem")
    assert public == tmp_path / "team" / "signing-key.pub.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in private.read_bytes() and b"PUBLIC KEY" in public.read_bytes()
    key = keys.load_public_key(public)
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert keys.fingerprint(key) == hashlib.sha256(der).hexdigest()
    assert isinstance(key.curve, ec.SECP256R1)
    before = private.read_bytes()
    with pytest.raises(FileExistsError):
        keys.generate_key(private)
    assert keys.main(["generate", "--out", str(private)]) == 1
    assert private.read_bytes() == before


def test_generate_command_uses_env_path_and_prints_fingerprint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(keys.KEY_ENV, str(tmp_path / "k.pem"))
    assert keys.main(["generate"]) == 0
    out = capsys.readouterr().out
    fp = keys.fingerprint(keys.load_public_key(tmp_path / "k.pub.pem"))
    assert f"sha256:{fp}" in out and "mode 0600" in out
    assert keys.main(["fingerprint", str(tmp_path / "k.pub.pem")]) == 0
    assert capsys.readouterr().out.strip() == f"sha256:{fp}"


def test_key_lookup_config_then_env_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(keys.KEY_ENV, raising=False)
    assert keys.default_key_path(None) == (tmp_path / "home/.config/reportgen/signing-key.pem", "default location")
    monkeypatch.setenv(keys.KEY_ENV, str(tmp_path / "env.pem"))
    assert keys.default_key_path(None)[0] == tmp_path / "env.pem"
    assert keys.default_key_path(str(tmp_path / "cfg.pem"))[0] == tmp_path / "cfg.pem"


def test_signing_off_needs_no_key(tmp_path):
    assert load_signing_key(False, str(tmp_path / "nothing.pem")) is None
    assert signature_label(None) == ""


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no private key at"),
        (b"not a key\n", "not a PEM private key"),
        ("p384", "unsupported key"),
    ],
)
def test_unusable_key_is_one_line_naming_the_fixes(tmp_path, content, message):
    path = tmp_path / "key.pem"
    if content == "p384":
        content = ec.generate_private_key(ec.SECP384R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SigningError) as err:
        load_signing_key(True, str(path))
    text = str(err.value)
    assert message in text and "report.sign=false" in text and "\n" not in text
    if content is None:
        assert "python -m reportgen.keys generate" in text


def test_run_without_key_exits_2_before_any_model_work(compose_cfg, tmp_path, monkeypatch, capsys):
    import reportgen.commands.run as pipeline

    def no_model_work(cfg, **kwargs):
        raise AssertionError("the model was built although the key is missing")

    monkeypatch.setattr(pipeline, "prepare_twins", no_model_work)
    cfg = compose_cfg("+model=ffn", f"report.key_path={tmp_path / 'missing.pem'}")
    assert pipeline.run(cfg, tmp_path) == 2
    out = capsys.readouterr().out
    assert "python -m reportgen.keys generate" in out and "report.sign=false" in out
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- statement and PDF


def test_signed_run_folder_layout_and_subjects(run_dir):
    names = {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()}
    assert {"report.pdf", "report.unsigned.pdf", ENVELOPE_NAME, "report.html", "results.csv", "results.json"} <= names
    statement = statement_of(run_dir)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == PREDICATE_TYPE
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert set(subjects) == {
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
        "plots/memory.svg",
        "report.html",
        "report.unsigned.pdf",
        "results.csv",
        "results.json",
    }
    assert set(subjects) == set(run_files(run_dir))  # not the log, not the signed outputs
    for name, digest in subjects.items():
        assert hashlib.sha256((run_dir / name).read_bytes()).hexdigest() == digest
    signed, unsigned = (run_dir / "report.pdf").read_bytes(), (run_dir / "report.unsigned.pdf").read_bytes()
    assert signed.startswith(unsigned) and len(signed) > len(unsigned)  # one incremental update


def test_private_key_never_lands_in_outputs(run_dir, key_pair):
    pem = key_pair[0].read_bytes()
    body = b"".join(line for line in pem.splitlines() if not line.startswith(b"-----"))
    scalar = keys.load_private_key(key_pair[0]).private_numbers().private_value.to_bytes(32, "big")
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert body[:40] not in data and scalar not in data, path


def test_predicate_holds_claim_with_decimal_tolerances_and_recomputable_verdict(run_dir, key_pair):
    predicate = statement_of(run_dir)["predicate"]
    results = frame_from_json((run_dir / "results.json").read_text())
    assert predicate["verdict"] == claim_verdict(results, predicate["required"]) == Status.PASS
    assert predicate["required"] == REQUIRED
    assert predicate["tolerances"]["rtol"] == "0.0000013" and predicate["tolerances"]["atol"] == "0.00001"
    assert {"check": "gradient parity", "metric": "max_abs_err", "threshold": "atol=1e-05, rtol=1.3e-06"} in predicate[
        "tolerances"
    ]["thresholds"]
    checks = {c["check"]: c for c in predicate["checks"]}
    assert checks["gradient parity"]["status"] == Status.PASS and checks["gradient parity"]["seconds"] == "0.02"
    assert predicate["environment"]["torch"] == "2.x" and predicate["claim"]["targets"] == ["Block"]
    assert predicate["signer"]["publicKeySha256"] == keys.fingerprint(keys.load_public_key(key_pair[1]))


def test_predicate_costs_are_the_memory_and_time_rows_as_decimal_strings(tmp_path):
    frame = to_frame(cost_rows())
    predicate = claim_predicate(frame, tiny_meta(tmp_path), Status.FAIL, [MEMORY])
    costs = {(c["check"], c["variant"], c["metric"]): c["value"] for c in predicate["costs"]}
    assert costs == {
        (MEMORY, "plain", "saved_activation_bytes"): "4194304",
        (MEMORY, "recompute", "saved_activation_bytes"): "1048576",
        (MEMORY, "recompute", "saving_share"): "0.75",
        (TIME, "recompute", "overhead_ratio"): "1.27",
    }


def test_failing_claim_is_signed_as_fail(tmp_path, key_pair):
    run = signed_run(tmp_path / "run", key_pair[0], failing=True)
    assert statement_of(run)["predicate"]["verdict"] == Status.FAIL


def test_decimal_strings_are_exact_and_exponent_free():
    assert [decimal_string(v) for v in (1e-05, 1.3e-6, 0.1, 3, 2.0**40, float("nan"), float("inf"), None)] == [
        "0.00001",
        "0.0000013",
        "0.1",
        "3",
        "1099511627776",
        None,
        "inf",
        None,
    ]


def test_signed_pdf_validates_with_pyhanko_and_carries_both_attachments(run_dir, key_pair):
    from pyhanko.pdf_utils.reader import PdfFileReader
    from pyhanko.sign.validation import validate_pdf_signature
    from pyhanko.sign.validation.status import SignatureCoverageLevel
    from pyhanko_certvalidator import ValidationContext

    reader = PdfFileReader(io.BytesIO((run_dir / "report.pdf").read_bytes()))
    (signature,) = reader.embedded_signatures
    status = validate_pdf_signature(signature, ValidationContext(trust_roots=[signature.signer_cert]))
    assert status.intact and status.valid and status.trusted and status.bottom_line
    assert status.coverage == SignatureCoverageLevel.ENTIRE_FILE
    names = reader.root["/Names"]["/EmbeddedFiles"]["/Names"]
    files = {str(names[i]): names[i + 1]["/EF"]["/F"].data for i in range(0, len(names), 2)}
    assert files["results.json"] == (run_dir / "results.json").read_bytes()
    assert files[ENVELOPE_NAME] == (run_dir / ENVELOPE_NAME).read_bytes()
    relationships = {str(names[i]): str(names[i + 1]["/AFRelationship"]) for i in range(0, len(names), 2)}
    assert relationships == {"results.json": "/Data", ENVELOPE_NAME: "/Supplement"}
    info = reader.trailer["/Info"]
    assert str(info["/Producer"]).startswith("pyHanko")  # equal to XMP pdf:Producer (PDF/A)


@pytest.mark.skipif(shutil.which("pdftoppm") is None, reason="needs poppler's pdftoppm")
def test_signed_pdf_opens_and_page_one_shows_the_fingerprint(run_dir, key_pair, tmp_path):
    subprocess.run(
        ["pdftoppm", "-png", "-r", "30", "-f", "1", "-l", "1", str(run_dir / "report.pdf"), str(tmp_path / "page")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert (tmp_path / "page-1.png").stat().st_size > 1000
    if shutil.which("pdftotext"):
        text = subprocess.run(
            ["pdftotext", "-f", "1", "-l", "1", str(run_dir / "report.pdf"), "-"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        fp = keys.fingerprint(keys.load_public_key(key_pair[1]))
        assert fp[:16] in "".join(text.split())


def test_unsigned_report_says_unsigned_and_has_no_statement(tmp_path):
    run = signed_run(tmp_path / "run", None)
    assert not (run / ENVELOPE_NAME).exists() and not (run / "report.unsigned.pdf").exists()
    html = (run / "report.html").read_text()
    assert 'class="unsigned">UNSIGNED<' in html
    assert b"/ByteRange" not in (run / "report.pdf").read_bytes()


def test_private_key_file_mode_survives_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        private, _ = keys.generate_key(tmp_path / "k.pem")
    finally:
        os.umask(old)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
