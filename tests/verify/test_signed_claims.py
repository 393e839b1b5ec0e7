"""Nothing signed says more than was verified: sweeps, comparisons, INCONCLUSIVE runs, empty claims.

Each attack from issue 17 is performed here and must fail verification or be refused.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import (
    REQUIRED,
    job_cost_rows,
    job_sweep,
    make_key,
    sign_folder,
    signed_run,
    tiny_frame,
    tiny_meta,
    write_job,
    write_launch,
)
from rows import fact_row, judged_row

from reportgen import verify as verifier
from reportgen.checks.controls.rows import STALE, control_row
from reportgen.commands import compare
from reportgen.commands.run import write_results
from reportgen.config import TIME
from reportgen.report.render import render_report
from reportgen.results import Role, Row, Status, claim_verdict, frame_to_json, to_frame
from reportgen.sweep import summary
from reportgen.sweep.callback import main
from reportgen.sweep.summary import INCOMPLETE_MARK, summarize
from reportgen.sweep.table import summary_frame
from reportgen.trust.keys import SigningError, load_public_key, load_signing_key, signature_label
from reportgen.trust.signing import sign_run


def failed(checks) -> list[str]:
    return [c.line for c in checks if c.status == "FAIL"]


#: What the sweep jobs below require (their rows: ``conftest.job_cost_rows``).
JOB_REQUIRED = ["gradient parity", "warm-step memory"]


def signed_job(folder: Path, job: int, overrides: list[str], exit_code: int, rows: list, key: Path) -> Path:
    """A sweep job as a signed multirun leaves it: job.json, .hydra/, results.json and a signed statement."""
    write_job(folder, job, overrides, exit_code, rows, required=tuple(JOB_REQUIRED))
    return sign_folder(folder, key, JOB_REQUIRED, job_sweep(folder.parent, job, overrides))


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """``((private, public), (other private, other public))``, made once: no test changes a key file."""
    folder = tmp_path_factory.mktemp("keys")
    return make_key(folder / "keys"), make_key(folder / "other", "other.pem")


@pytest.fixture(scope="module")
def pristine_sweep(tmp_path_factory, keys) -> Path:
    """Three jobs: 0 holds, 1 fails gradient parity, 2 could not start; summary signed, no PDF (made once)."""
    (private, _), _ = keys
    root = tmp_path_factory.mktemp("pristine") / "sweep"
    write_launch(root, ["+model=ffn", "recompute=non_reentrant,reentrant,broken"])
    signed_job(root / "0", 0, ["+model=ffn", "recompute=non_reentrant"], 0, job_cost_rows(), private)
    signed_job(root / "1", 1, ["+model=ffn", "recompute=reentrant"], 1, job_cost_rows(parity="FAIL"), private)
    write_job(root / "2", 2, ["+model=ffn", "recompute=broken"], 2, None, error="targets match nothing")
    summarize(root, sign=True, key_path=str(private), pdf=False)
    return root


@pytest.fixture
def signed_sweep(pristine_sweep, tmp_path) -> Path:
    """A private copy of :func:`pristine_sweep` (tests edit, move and add files in it); the summary and the
    statements name the jobs relative to the sweep folder, so the copy verifies as the original does."""
    return Path(shutil.copytree(pristine_sweep, tmp_path / "sweep", symlinks=True))


def verify_dir(target: Path, public: Path):
    return verifier.verify_target(target, load_public_key(public))


# --------------------------------------------------------------------------- sweeps


def test_a_genuine_signed_sweep_verifies_and_says_it_is_a_sweep(signed_sweep, keys, capsys):
    (_, public), _ = keys
    outcome = verify_dir(signed_sweep, public)
    assert failed(outcome.checks) == [] and outcome.kind == "sweep folder"
    lines = {c.name: c for c in outcome.checks}
    assert lines["job 0 (0/)"].status == "PASS" and "claim PASS" in lines["job 0 (0/)"].detail
    assert "claim FAIL" in lines["job 1 (1/)"].detail and "not signed" in lines["job 2 (2/)"].detail
    assert lines["summary from jobs"].status == "PASS"
    assert verifier.main([str(signed_sweep), "--key", str(public)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("checking a sweep folder") and "VERIFIED (sweep folder)" in out


def test_an_edited_summary_file_fails_naming_it(signed_sweep, keys):
    (_, public), _ = keys
    csv = signed_sweep / "summary.csv"
    csv.write_text(csv.read_text().replace("FAIL", "PASS"))
    assert any(line.startswith("FAIL subject summary.csv") for line in failed(verify_dir(signed_sweep, public).checks))


def test_swapped_job_folders_fail_naming_the_jobs(signed_sweep, keys):
    (_, public), _ = keys
    (signed_sweep / "0").rename(signed_sweep / "tmp")
    (signed_sweep / "1").rename(signed_sweep / "0")
    (signed_sweep / "tmp").rename(signed_sweep / "1")
    lines = failed(verify_dir(signed_sweep, public).checks)
    assert any(line.startswith("FAIL job 0 (0/)") for line in lines)
    assert any(line.startswith("FAIL subject 0/statement.dsse.json") for line in lines)


def test_a_job_signed_by_another_key_fails_naming_it(signed_sweep, keys, tmp_path):
    (_, public), (other, _) = keys
    folder = signed_sweep / "0"
    shutil.rmtree(folder)
    signed_job(folder, 0, ["+model=ffn", "recompute=non_reentrant"], 0, job_cost_rows(), other)
    lines = failed(verify_dir(signed_sweep, public).checks)
    assert any(line.startswith("FAIL job 0 (0/): its run does not verify") for line in lines)


def test_a_summary_that_does_not_follow_from_its_jobs_fails(tmp_path, keys, monkeypatch):
    """The signer's own summary lies (a failing job shown as PASS): the re-derivation catches it."""
    (private, public), _ = keys
    root = tmp_path / "lying"
    write_launch(root, ["+model=ffn"])
    signed_job(root / "0", 0, ["+model=ffn"], 1, job_cost_rows(parity="FAIL"), private)
    honest = summary_frame

    def lying(jobs):
        frame = honest(jobs)
        frame["status"] = "PASS"
        return frame

    monkeypatch.setattr(summary, "summary_frame", lying)
    summarize(root, sign=True, key_path=str(private), pdf=False)
    monkeypatch.setattr(summary, "summary_frame", honest)
    lines = failed(verify_dir(root, public).checks)
    assert lines == [
        "FAIL summary from jobs: summary.json does not follow from the jobs' signed files "
        "(a job's outcome or results differ from what the summary states)"
    ]


def test_an_added_job_folder_fails(signed_sweep, keys):
    (private, public), _ = keys
    signed_job(signed_sweep / "3", 3, ["+model=ffn", "recompute=selective"], 0, job_cost_rows(), private)
    assert any(
        "job folder(s) 3 are not in the signed summary" in line
        for line in failed(verify_dir(signed_sweep, public).checks)
    )


def test_an_interrupted_summary_is_marked_and_summarize_writes_it_again(signed_sweep, keys, capsys):
    (private, public), _ = keys
    (signed_sweep / INCOMPLETE_MARK).write_text("interrupted\n")
    assert any(line.startswith("FAIL summary complete") for line in failed(verify_dir(signed_sweep, public).checks))
    assert main(["summarize", str(signed_sweep), "--key", str(private), "--no-pdf"]) == 2  # worst job: exit 2
    assert not (signed_sweep / INCOMPLETE_MARK).exists()
    assert failed(verify_dir(signed_sweep, public).checks) == []
    assert main(["summarize", str(signed_sweep / "nothing")]) == 2
    assert "holds no sweep jobs" in capsys.readouterr().err


def test_a_summary_that_cannot_be_written_names_the_path(signed_sweep, keys, capsys, monkeypatch):
    import errno
    import tempfile

    (private, _), _ = keys
    real = tempfile.mkstemp

    def full_disk(*args, **kwargs):
        if "summary" in str(kwargs.get("prefix", "")):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", full_disk)
    assert main(["summarize", str(signed_sweep), "--key", str(private), "--no-pdf"]) == 2
    err = capsys.readouterr().err
    assert "could not write" in err and "disk is full" in err and "bug" not in err


def refused_summary(sweep_dir: Path, private: Path, capsys) -> str:
    """``sweep summarize`` (the repair command) on ``sweep_dir``: it must refuse; its message."""
    before = (sweep_dir / "summary.dsse.json").read_bytes()
    assert main(["summarize", str(sweep_dir), "--key", str(private), "--no-pdf"]) == 2
    assert (sweep_dir / "summary.dsse.json").read_bytes() == before  # nothing re-signed
    return capsys.readouterr().err


def test_summarize_refuses_a_sweep_whose_failing_job_was_deleted(signed_sweep, keys, capsys):
    (private, _), _ = keys
    shutil.rmtree(signed_sweep / "1")
    err = refused_summary(signed_sweep, private, capsys)
    assert "job 1 is missing: the launch made it (+model=ffn recompute=reentrant), no folder holds it" in err


def test_summarize_refuses_a_passing_job_copied_in_from_another_sweep(signed_sweep, keys, tmp_path, capsys):
    """Another sweep's PASS job 1 (same number, same overrides) in place of the failing job 1."""
    (private, _), _ = keys
    other = tmp_path / "other-sweep"
    write_launch(other, ["+model=ffn", "recompute=non_reentrant,reentrant"])
    signed_job(other / "1", 1, ["+model=ffn", "recompute=reentrant"], 0, job_cost_rows(), private)
    shutil.rmtree(signed_sweep / "1")
    shutil.copytree(other / "1", signed_sweep / "1")
    err = refused_summary(signed_sweep, private, capsys)
    assert "job 1 (1/) was signed in another sweep (its statement names launch sha256:" in err


def test_summarize_refuses_a_duplicated_job_number(signed_sweep, keys, capsys):
    """A PASS job copied beside the failing one: two jobs numbered 0."""
    (private, _), _ = keys
    shutil.copytree(signed_sweep / "0", signed_sweep / "0-copy")
    err = refused_summary(signed_sweep, private, capsys)
    assert "job 0 appears 2 times (0/, 0-copy/): a launch numbers each job once" in err


def test_summarize_refuses_a_job_json_edited_to_pass(signed_sweep, keys, capsys):
    (private, public), _ = keys
    record = signed_sweep / "1" / "job.json"
    record.write_text(record.read_text().replace('"exit_code": 1', '"exit_code": 0').replace('"FAIL"', '"PASS"'))
    err = refused_summary(signed_sweep, private, capsys)
    assert "job 1 (1/): job.json says PASS (exit code 0), its signed run says FAIL" in err
    assert any(line.startswith("FAIL subject 1/job.json") for line in failed(verify_dir(signed_sweep, public).checks))


def test_a_signed_summary_over_jobs_the_launch_did_not_make_fails(tmp_path, keys, monkeypatch):
    """A signer whose summarize skipped the launch check (an older reportgen): verify re-derives the
    jobs from the signed multirun.yaml and names the missing one."""
    (private, public), _ = keys
    root = tmp_path / "short"
    write_launch(root, ["+model=ffn", "recompute=non_reentrant,reentrant"])
    signed_job(root / "0", 0, ["+model=ffn", "recompute=non_reentrant"], 0, job_cost_rows(), private)
    real = summary.job_problems
    monkeypatch.setattr(summary, "job_problems", lambda *a: (real(*a)[0], []))
    summarize(root, sign=True, key_path=str(private), pdf=False)
    lines = failed(verify_dir(root, public).checks)
    assert lines == [
        "FAIL launch: job 1 is missing: the launch made it (+model=ffn recompute=reentrant), no folder holds it"
    ]


# --------------------------------------------------------------------------- what verify is told to expect


def test_a_run_folder_with_a_genuine_sweeps_files_copied_in_fails_as_mixed(signed_sweep, keys, tmp_path, capsys):
    """An edited run plus a copied genuine sweep summary: never "VERIFIED (sweep folder)"."""
    (private, public), _ = keys
    run = signed_run(tmp_path / "run", private, failing=True, pdf=False)
    results = run / "results.json"
    results.write_text(results.read_text().replace('"status":"FAIL"', '"status":"PASS"'))
    for name in ("summary.dsse.json", "summary.json", "summary.csv", "summary.html", "multirun.yaml"):
        shutil.copy(signed_sweep / name, run / name)
    assert verifier.main([str(run), "--key", str(public)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith(
        "FAIL kind: this folder holds the files of a run (statement.dsse.json, results.json) "
        "and of a sweep (summary.dsse.json, summary.json)"
    )
    assert out[-1].startswith("NOT VERIFIED (mixed folder)")


@pytest.fixture
def summary_pdf(signed_sweep, keys) -> Path:
    """The signed sweep's summary.pdf (rendered and signed again with a PDF)."""
    (private, _), _ = keys
    assert main(["summarize", str(signed_sweep), "--key", str(private)]) == 2  # worst job: exit 2
    return signed_sweep / "summary.pdf"


def test_a_summary_pdf_renamed_report_pdf_fails_expect_run(summary_pdf, keys, tmp_path, capsys):
    (_, public), _ = keys
    renamed = tmp_path / "report.pdf"
    shutil.copy(summary_pdf, renamed)
    assert verifier.main([str(renamed), "--key", str(public), "--expect", "run"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("checking a sweep PDF") and out[-1].startswith("NOT VERIFIED (sweep PDF)")
    assert any(line.startswith("FAIL expected kind: --expect run, and this is a sweep PDF") for line in out)
    assert verifier.main([str(renamed), "--key", str(public), "--expect", "sweep"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("VERIFIED (sweep PDF)")  # the kind on the last line too


def test_verify_refuses_devices_and_fifos_in_one_line(signed_sweep, keys, tmp_path, capsys):
    (private, public), _ = keys
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for argv in (
        ["/dev/zero", "--key", str(public)],
        [str(fifo), "--key", str(public)],
        [str(signed_sweep), "--key", "/dev/zero"],
        [str(signed_sweep), "--key", str(fifo)],
    ):
        assert verifier.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "not a regular file" in err or "not a key file" in err
        assert "\n" not in err
    with pytest.raises(SigningError, match="is a character device, not a key file"):
        load_signing_key(True, "/dev/zero")


# --------------------------------------------------------------------------- a run signs only what it wrote


def test_a_folder_holding_unrelated_files_is_refused_at_start(tmp_path, capsys):
    from reportgen.commands.rundir import FolderLock, StartRefused

    folder = tmp_path / "run"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine\n")
    (folder / "sub" / "mine.txt").write_text("mine too\n")
    with pytest.raises(StartRefused):
        FolderLock(folder)
    out = capsys.readouterr().out
    assert "holds files that are not a run's (notes.txt, sub/)" in out and "new or empty folder" in out
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "sub"]  # nothing written


def test_a_file_dropped_into_a_running_run_is_not_signed(tmp_path, keys):
    """Files that appear in the folder while the run writes (not by the run) are no subjects."""
    from reportgen.trust.manifest import start_manifest

    (private, public), _ = keys
    out = tmp_path / "run"
    (out / ".hydra").mkdir(parents=True)
    (out / ".hydra" / "config.yaml").write_text("seed: 0\n")
    start_manifest(out)
    (out / "notes.txt").write_text("not the run's\n")
    (out / "sub").mkdir()
    (out / "sub" / "mine.txt").write_text("not the run's either\n")
    frame = tiny_frame()
    signing = load_signing_key(True, str(private))
    write_results(frame, out)
    render_report(frame, tiny_meta(out, signature_label(signing)), "PASS", out, pdf=False, required=REQUIRED)
    sign_run(frame, tiny_meta(out, signature_label(signing)), "PASS", out, signing, required=REQUIRED)
    checks = verify_dir(out, public).checks
    subjects = sorted(c.name.removeprefix("subject ") for c in checks if c.name.startswith("subject "))
    assert subjects == [".hydra/config.yaml", "report.html", "results.csv", "results.json"]
    notes = [c.name for c in checks if c.status == "NOTE"]
    assert "not covered: notes.txt" in notes and "not covered: sub/mine.txt" in notes


# --------------------------------------------------------------------------- comparisons


@pytest.fixture
def signed_pair(tmp_path, keys):
    (private, _), _ = keys
    # no PDFs: the comparison is made and verified from the runs' signed statements and results (--no-pdf)
    return signed_run(tmp_path / "base", private, pdf=False), signed_run(tmp_path / "new", private, pdf=False)


def test_a_signed_comparison_verifies_and_is_rederived(signed_pair, keys, tmp_path, capsys):
    (private, public), _ = keys
    out = tmp_path / "cmp"
    assert (
        compare.main(
            [*map(str, signed_pair), "--key", str(public), "--signing-key", str(private), "--no-pdf", "--out", str(out)]
        )
        == 0
    )
    outcome = verify_dir(out, public)
    assert failed(outcome.checks) == [] and outcome.kind == "comparison folder"
    names = [c.name for c in outcome.checks if c.status == "PASS"]
    assert {"BASE run", "NEW run", "comparison from runs"} <= set(names)
    table = out / "compare.json"
    table.write_text(table.read_text().replace("PASS", "FAIL"))
    assert any(line.startswith("FAIL subject compare.json") for line in failed(verify_dir(out, public).checks))


def test_a_comparison_whose_copied_run_was_edited_fails(signed_pair, keys, tmp_path):
    (private, public), _ = keys
    out = tmp_path / "cmp"
    compare.main(
        [*map(str, signed_pair), "--key", str(public), "--signing-key", str(private), "--no-pdf", "--out", str(out)]
    )
    results = out / "inputs" / "new" / "results.json"
    results.write_text(results.read_text().replace("0.0", "0.5", 1))
    lines = failed(verify_dir(out, public).checks)
    assert any(line.startswith("FAIL subject inputs/new/results.json") for line in lines)
    assert any(
        line.startswith("FAIL NEW run: its results.json is not the one its statement vouches for") for line in lines
    )


def test_compare_refuses_to_sign_a_run_whose_rows_were_edited(signed_pair, keys, tmp_path, capsys):
    """FAIL rows edited to PASS in NEW's results.json, no --key: exit 1, the comparison UNSIGNED."""
    (private, _), _ = keys
    base, new = signed_pair
    shutil.rmtree(new)
    signed_run(new, private, failing=True, pdf=False)
    results = new / "results.json"
    results.write_text(results.read_text().replace('"status":"FAIL"', '"status":"PASS"'))
    out = tmp_path / "cmp"
    assert compare.main([str(base), str(new), "--signing-key", str(private), "--no-pdf", "--out", str(out)]) == 3
    said = capsys.readouterr().out
    assert "NEW NOT VERIFIED" in said and "says PASS" in said and "UNSIGNED" in said
    assert not (out / "compare.dsse.json").exists() and "UNSIGNED" in (out / "compare.html").read_text()


def noisy_timing(ratio: float, ci: tuple[float, float]) -> list:
    """A job whose overhead CI missed its width target (timing too noisy to trust)."""
    width = {"threshold": "<= 5 pp", "on_miss": "WARN", "role": Role.OVERHEAD_CI, "unit": "pp"}
    return [
        *job_cost_rows(ratio=ratio, ci=ci),
        judged_row(TIME, "overhead confidence", "ci_half_width_pp", 12.0, "<=", 5.0, **width),
    ]


def signed_folder(folder: Path, rows: list, key: Path) -> Path:
    return sign_folder(write_job(folder, 0, [], 0, rows), key, JOB_REQUIRED)


def test_noise_is_not_called_a_regression(tmp_path, keys, capsys):
    (private, public), _ = keys
    base = signed_folder(tmp_path / "base", noisy_timing(1.30, (1.10, 1.55)), private)
    new = signed_folder(tmp_path / "new", noisy_timing(1.43, (1.20, 1.70)), private)
    key = ["--key", str(public), "--no-sign", "--no-pdf"]
    assert compare.main([str(base), str(new), *key, "--out", str(tmp_path / "c")]) == 3
    out = capsys.readouterr().out
    assert "CANNOT TELL: overhead ratio rose by 13.0 pp" in out and "REGRESSED" not in out
    separated = signed_folder(tmp_path / "far", noisy_timing(1.90, (1.80, 2.00)), private)
    assert compare.main([str(base), str(separated), *key, "--out", str(tmp_path / "d")]) == 1


def test_compare_of_a_run_that_does_not_verify_is_cannot_tell(tmp_path, keys, capsys):
    """No --key and no default key, or an edited row that also sets on_miss: never OK (exit 0)."""
    (private, public), _ = keys
    base = signed_folder(tmp_path / "base", job_cost_rows(), private)
    unsigned = write_job(tmp_path / "unsigned", 0, [], 0, job_cost_rows())
    assert (
        compare.main(
            [str(base), str(unsigned), "--key", str(public), "--no-sign", "--no-pdf", "--out", str(tmp_path / "c")]
        )
        == 3
    )
    assert "CANNOT TELL: NEW does not verify" in capsys.readouterr().out
    edited = signed_folder(tmp_path / "edited", job_cost_rows(parity="FAIL"), private)
    results = edited / "results.json"
    results.write_text(
        results.read_text()
        .replace('"status":"FAIL","detail"', '"status":"WARN","detail"')
        .replace('"on_miss":"FAIL"', '"on_miss":"WARN"', 1)
    )
    assert (
        compare.main(
            [str(base), str(edited), "--key", str(public), "--no-sign", "--no-pdf", "--out", str(tmp_path / "d")]
        )
        == 3
    )
    out = capsys.readouterr().out
    assert "NEW NOT VERIFIED" in out and "OK:" not in out
    assert "says on_miss 'WARN'; its check misses as FAIL" in out  # re-judged as the check configures it


def test_a_parity_row_signed_with_a_lenient_on_miss_never_verifies(tmp_path, keys):
    """A signer whose results say a missed gradient is only WARN (on_miss edited before signing)."""
    (private, public), _ = keys
    frame = tiny_frame(failing=True)
    frame.loc[1, ["on_miss", "status"]] = ["WARN", "WARN"]
    run = signed_run(tmp_path / "run", private, frame=frame, pdf=False)
    lines = failed(verify_dir(run, public).checks)
    assert any(
        "blocks.0.lin.weight.grad / recompute / max_abs_err says on_miss 'WARN'; its check misses as FAIL" in line
        for line in lines
    )


def test_compare_out_onto_an_existing_folder_is_one_line_exit_2(tmp_path, capsys):
    base = write_job(tmp_path / "base", 0, [], 0, job_cost_rows())
    (tmp_path / "taken").mkdir()
    assert compare.main([str(base), str(base), "--no-sign", "--out", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err.strip()
    assert "exists already" in err and "\n" not in err and "Traceback" not in err


def test_compare_writes_under_outputs_comparisons_by_default(tmp_path, keys, monkeypatch):
    (private, public), _ = keys
    base = signed_folder(tmp_path / "base", job_cost_rows(), private)
    monkeypatch.chdir(tmp_path)
    assert compare.main([str(base), str(base), "--key", str(public), "--no-sign", "--no-pdf"]) == 0
    assert len(list((tmp_path / "outputs" / "comparisons").glob("*/*/compare.html"))) == 1
    assert not (tmp_path / "comparisons").exists()


# --------------------------------------------------------------------------- runs


def frame_rows(frame) -> list[Row]:
    """The rows of a results frame, as :class:`Row` again (columns that are not fields back in ``extra``)."""
    fields = Row.__dataclass_fields__
    return [
        Row(
            **{k: v for k, v in r.items() if k in fields},
            extra={k: v for k, v in r.items() if k not in fields and v == v},
        )
        for r in frame.to_dict("records")
    ]


def test_an_honest_inconclusive_run_verifies_with_exit_3(tmp_path, keys, capsys):
    (private, public), _ = keys
    not_reproduced = {"status": Status.INCONCLUSIVE, "detail": "the plain twin does not reproduce itself"}
    aa = fact_row(
        "gradient parity", "plain vs plain (A/A)", "max_abs_err", variant="aa", role=Role.LOSS, **not_reproduced
    )
    frame = to_frame(frame_rows(tiny_frame()) + [aa])
    run = signed_run(tmp_path / "run", private, frame=frame, pdf=False)  # the run folder is verified, not a PDF
    assert claim_verdict(frame, REQUIRED) == Status.INCONCLUSIVE
    assert verifier.main([str(run), "--key", str(public)]) == 3
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("VERIFIED (run folder): the signed claim is INCONCLUSIVE (honestly signed")
    (run / "results.json").write_text((run / "results.json").read_text().replace("INCONCLUSIVE", "PASS"))
    assert verifier.main([str(run), "--key", str(public)]) == 1


def test_a_forged_detector_control_never_verifies(tmp_path, keys, capsys):
    """A control that was not caught (INCONCLUSIVE, exit 3), forged as caught with its status made to agree:
    edited in the signed folder, re-signed with another key, or signed with a lenient on_miss."""
    (private, public), (other, _) = keys
    blind = control_row(STALE, False, "not caught: the tolerance is too wide", size="another example")
    frame = to_frame([*frame_rows(tiny_frame()), blind])
    run = signed_run(tmp_path / "run", private, frame=frame, pdf=False)
    assert verifier.main([str(run), "--key", str(public)]) == 3  # honest: the claim cannot be judged
    forged = frame.copy()
    forged.loc[forged.item == STALE, ["value", "status"]] = [1.0, Status.PASS]
    assert claim_verdict(forged, REQUIRED) != Status.INCONCLUSIVE  # what the forger is after
    (run / "results.json").write_text(frame_to_json(forged))
    assert verifier.main([str(run), "--key", str(public)]) == 1
    resigned = signed_run(tmp_path / "resigned", other, frame=forged, pdf=False)
    assert verifier.main([str(resigned), "--key", str(public)]) == 1
    lenient = frame.copy()
    lenient.loc[lenient.item == STALE, ["on_miss", "status"]] = [Status.WARN, Status.WARN]
    lines = failed(verify_dir(signed_run(tmp_path / "lenient", private, frame=lenient, pdf=False), public).checks)
    assert any(f"{STALE} / recompute / caught says on_miss 'WARN'" in line for line in lines)
    capsys.readouterr()


@pytest.mark.parametrize(
    "failing, claim, code", [(True, "the signed claim FAILS", 0), (False, "the signed claim HOLDS", 0)]
)
def test_the_last_line_gives_the_signed_claims_verdict(tmp_path, keys, capsys, failing, claim, code):
    """A reviewer reading only the last line sees the verdict: a failing signed run verifies (exit 0,
    docs/exit-codes.md), and its last line says the claim it verified FAILS."""
    (private, public), _ = keys
    run = signed_run(tmp_path / "run", private, failing=failing)
    assert verifier.main([str(run), "--key", str(public)]) == code
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"VERIFIED (run folder): {claim}; all ") and "checks hold (key sha256:" in last
    assert verifier.main([str(run / "report.pdf"), "--key", str(public)]) == code
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"VERIFIED (run PDF): {claim}; ")


def test_an_empty_claim_is_refused_before_anything_runs(compose_cfg):
    from reportgen.commands.validation import config_problems

    problem = config_problems(compose_cfg("+model=ffn", "verdict.required=[]"))
    assert "names no parity check" in problem and "an empty claim" in problem
    assert "no parity check" in config_problems(compose_cfg("+model=ffn", "verdict.required=[warm-step memory]"))
    assert config_problems(compose_cfg("+model=ffn", "verdict.required=[gradient parity]")) == ""


def test_a_signed_empty_claim_never_verifies(tmp_path, keys):
    """A statement signed with required=[] (as an older reportgen could): verify fails it."""
    (private, public), _ = keys
    out = tmp_path / "empty"
    out.mkdir()
    frame = tiny_frame(failing=True)
    signing = load_signing_key(True, str(private))
    write_results(frame, out)
    render_report(frame, tiny_meta(out, signature_label(signing)), "PASS", out, pdf=False, required=[])
    sign_run(frame, tiny_meta(out, signature_label(signing)), "PASS", out, signing, required=[])
    lines = failed(verifier.verify(out, load_public_key(public)))
    assert any("an empty claim" in line for line in lines)


def test_a_full_disk_is_named_not_called_a_bug(tmp_path, monkeypatch):
    import errno
    import os

    from reportgen.files import OutputWriteError, atomic_write

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OutputWriteError) as raised:
        atomic_write(tmp_path / "results.csv", "a,b\n")
    assert str(raised.value).startswith(f"could not write {tmp_path / 'results.csv'}: No space left on device")
    assert "disk is full" in str(raised.value) and list(tmp_path.iterdir()) == []


def test_a_read_only_output_folder_is_named_not_called_another_run(tmp_path, monkeypatch, capsys):
    import errno
    import os

    from reportgen.commands.rundir import FolderLock, StartRefused

    real = os.open

    def read_only(path, flags, *args):
        if str(path).endswith(".reportgen.lock") and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system")
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(StartRefused) as refused:
        FolderLock(tmp_path / "run")
    out = capsys.readouterr().out
    assert refused.value.code == 2 and "could not write" in out and "read-only" in out
    assert "another reportgen run" not in out


def test_a_write_failure_during_a_run_exits_2_naming_the_file(tmp_path, monkeypatch, capsys):
    import errno

    import reportgen.commands.run as pipeline
    from reportgen.commands import cli
    from reportgen.files import write_failure

    def disk_full(cfg, out_dir):
        raise write_failure(out_dir / "report.pdf", OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(pipeline, "run", disk_full)
    assert cli._guarded_run(None, tmp_path, None) == 2
    out = capsys.readouterr().out
    assert f"could not write {tmp_path / 'report.pdf'}" in out and "bug" not in out


# --------------------------------------------------------------------------- a finished run signed later


def test_sigterm_during_signing_then_reportgen_sign_completes_and_verifies(tmp_path, keys, monkeypatch, capsys):
    """A real SIGTERM while the statement is signed: exit 143, the console says every check finished
    and the report was not signed, the folder is marked; ``python -m reportgen.sign`` re-judges,
    renders, signs, and the run then verifies as a run."""
    import signal

    from conftest import SMALL, compose_config
    from omegaconf import OmegaConf

    from reportgen.commands import cli, sign
    from reportgen.trust import signing
    from reportgen.trust.manifest import PENDING_NAME

    (private, public), _ = keys
    overrides = [o for o in SMALL if not o.startswith("report.")]
    cfg = compose_config("+model=ffn", *overrides, "report.pdf=false", f"report.key_path={private}")
    out = tmp_path / "run"
    (out / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, out / ".hydra" / "config.yaml")  # what Hydra writes before the job
    real = signing.sign_statement

    def terminated_while_signing(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(signing, "sign_statement", terminated_while_signing)
    assert cli._guarded_run(cfg, out, None) == 143
    monkeypatch.setattr(signing, "sign_statement", real)
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert said.startswith("reportgen: interrupted (SIGTERM): all checks finished; the report was not signed")
    assert f"python -m reportgen.sign {out}" in said and (out / PENDING_NAME).is_file()
    assert verifier.main([str(out), "--key", str(public)]) == 1
    assert "finished its checks but was interrupted before it was signed" in capsys.readouterr().out
    code = sign.main([str(out), "--key", str(private)])
    assert code in (0, 1, 3) and "every row re-judged" in capsys.readouterr().out
    assert not (out / PENDING_NAME).exists()
    assert verifier.main([str(out), "--key", str(public), "--expect", "run"]) == code
    assert capsys.readouterr().out.splitlines()[-1].startswith("VERIFIED (run folder)")


def test_reportgen_sign_refuses_edited_rows_and_folders_not_waiting(tmp_path, keys, capsys):
    """Only what the run measured is signed later: the mark is sealed (signed) when the checks finish, and
    an edit to results.json made consistent with its own numbers (FAIL rows turned into bitwise-equal PASS
    rows, the break-it attack) is refused, as is a mark without a seal."""
    from reportgen.commands import sign
    from reportgen.trust.keys import load_private_key
    from reportgen.trust.manifest import mark_pending

    (private, _), _ = keys
    out = tmp_path / "run"
    out.mkdir()
    frame = tiny_frame(failing=True)
    write_results(frame, out)
    assert sign.main([str(out), "--key", str(private)]) == 2
    assert "not a finished run waiting to be signed" in capsys.readouterr().err
    mark_pending(out, tiny_meta(out), REQUIRED, pdf=False, sign=True)  # no seal
    assert sign.main([str(out), "--key", str(private)]) == 2
    assert "carries no seal" in capsys.readouterr().err
    (out / "report.pending.json").unlink()
    mark_pending(out, tiny_meta(out), REQUIRED, pdf=False, sign=True, private_key=load_private_key(private))
    honest = frame[frame.status != "FAIL"]  # what an attacker writes: only rows whose numbers give their status
    for name in ("results.json", "results.csv"):
        (out / name).unlink()
    write_results(honest, out)
    assert sign.main([str(out), "--key", str(private)]) == 2
    assert "changed after the checks finished" in capsys.readouterr().err
    assert not (out / "statement.dsse.json").exists()


def _sealed_pending_run(out, private):
    """A finished, unsigned run folder as a run leaves it (results, Hydra's files, manifest, sealed mark)."""
    from reportgen.trust.keys import load_private_key
    from reportgen.trust.manifest import mark_pending, start_manifest

    (out / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "overrides.yaml", "hydra.yaml"):
        (out / ".hydra" / name).write_text("{}\n")
    start_manifest(out)
    write_results(tiny_frame(failing=True), out)
    mark_pending(out, tiny_meta(out), REQUIRED, pdf=False, sign=True, private_key=load_private_key(private))


@pytest.mark.parametrize(
    "doctor, says",
    [
        ("csv", "changed after the checks finished"),  # every FAIL row of results.csv edited to PASS
        ("hydra", "changed after the checks finished"),  # an edited .hydra/hydra.yaml
        ("planted", "entered the run's manifest after its checks finished"),  # a file appended to the manifest
    ],
)
def test_reportgen_sign_refuses_a_doctored_pending_folder(tmp_path, keys, capsys, doctor, says):
    """Sign re-derives what it signs (issue 36, item 1): a pending folder whose results.csv says PASS where
    results.json says FAIL, whose Hydra file was edited, or whose manifest lists a planted file is refused in
    one line, exit 2, and nothing is signed; the same folder undoctored is signed."""
    from reportgen.commands import sign
    from reportgen.trust.manifest import MANIFEST_NAME

    (private, _), _ = keys
    out = tmp_path / "run"
    _sealed_pending_run(out, private)
    if doctor == "csv":
        (out / "results.csv").write_text((out / "results.csv").read_text().replace("FAIL", "PASS"))
    elif doctor == "hydra":
        (out / ".hydra" / "hydra.yaml").write_text("hydra: {edited: true}\n")
    else:
        (out / "notes.txt").write_text("trust me\n")
        with open(out / MANIFEST_NAME, "a") as manifest:
            manifest.write("notes.txt\n")
    assert sign.main([str(out), "--key", str(private)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and not (out / "statement.dsse.json").exists()


def test_reportgen_sign_signs_the_same_folder_undoctored_and_verify_checks_its_csv(tmp_path, keys, capsys):
    from reportgen.commands import sign

    (private, public), _ = keys
    out = tmp_path / "run"
    _sealed_pending_run(out, private)
    assert sign.main([str(out), "--key", str(private)]) == 1  # the tiny failing frame: the claim fails
    checks = {c.name: c for c in verify_dir(out, public).checks}
    assert checks["results.csv"].status == "PASS"
    csv = out / "results.csv"
    csv.chmod(0o644)
    csv.write_text(csv.read_text().replace("FAIL", "PASS"))
    checks = {c.name: c for c in verify_dir(out, public).checks}
    assert checks["results.csv"].status == "FAIL" and "not the rows of results.json" in checks["results.csv"].detail


def test_reportgen_sign_on_a_full_disk_is_one_line_exit_2_and_keeps_what_was_measured(
    tmp_path, keys, capsys, monkeypatch
):
    """Every failure of writing is a usage-level exit (issue 36, item 4), at signing too: one line naming the
    file and the fix, exit 2 (never 1, the claim's code), results.json and the mark kept, so the same
    command signs once there is space."""
    import errno

    from reportgen.commands import sign
    from reportgen.trust.manifest import PENDING_NAME

    (private, _), _ = keys
    out = tmp_path / "run"
    _sealed_pending_run(out, private)
    measured = (out / "results.json").read_bytes()
    real = os.replace

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert sign.main([str(out), "--key", str(private)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not write" in err[0] and "the disk is full" in err[0]
    assert (out / "results.json").read_bytes() == measured and (out / PENDING_NAME).is_file()
    monkeypatch.setattr(os, "replace", real)
    assert sign.main([str(out), "--key", str(private)]) == 1


def test_a_statement_deleted_beside_its_signed_pdf_is_named(tmp_path, keys):
    (private, public), _ = keys
    run = signed_run(tmp_path / "run", private)
    (run / "statement.dsse.json").unlink()
    lines = failed(verify_dir(run, public).checks)
    assert lines[0].startswith("FAIL envelope signature: no statement.dsse.json in") and "it was deleted" in lines[0]


# --------------------------------------------------------------------------- the smaller items


def test_a_subject_that_is_a_symlink_out_of_the_folder_is_refused(tmp_path, keys):
    (private, public), _ = keys
    run = signed_run(tmp_path / "run", private, pdf=False)
    outside = tmp_path / "outside.csv"
    shutil.copy(run / "results.csv", outside)  # same bytes, same digest: only the link is wrong
    (run / "results.csv").unlink()
    (run / "results.csv").symlink_to(outside)
    assert any(
        line.startswith("FAIL subject results.csv: a symbolic link leaving the folder")
        for line in failed(verify_dir(run, public).checks)
    )


def test_an_interrupted_summary_is_named_not_checked_as_a_run(signed_sweep, keys):
    (_, public), _ = keys
    (signed_sweep / "summary.dsse.json").unlink()
    (signed_sweep / INCOMPLETE_MARK).write_text("interrupted\n")
    outcome = verify_dir(signed_sweep, public)
    assert outcome.kind == "sweep folder" and failed(outcome.checks) == [
        "FAIL summary complete: summary.incomplete is present and there is no summary.dsse.json: the summary was "
        f"interrupted; write it again with python -m reportgen.sweep summarize {signed_sweep}"
    ]


def test_sweep_verify_lists_what_it_did_not_cover(signed_sweep, keys):
    (_, public), _ = keys
    (signed_sweep / "notes.txt").write_text("mine\n")
    (signed_sweep / "extra").mkdir()
    (signed_sweep / "extra" / "a.txt").write_text("a\n")
    (signed_sweep / "0" / "scratch.txt").write_text("b\n")
    checks = verify_dir(signed_sweep, public).checks
    notes = {c.name: c.detail for c in checks if c.status == "NOTE"}
    assert "not covered: notes.txt" in notes and notes["not covered: extra/"].startswith("1 files")
    assert "0/: not covered: scratch.txt" in notes
    assert failed(checks) == []


def test_the_signed_summary_pdf_links_its_jobs_relatively(summary_pdf):
    from pyhanko.pdf_utils.reader import PdfFileReader

    reader = PdfFileReader(open(summary_pdf, "rb"), strict=False)
    uris = [
        str(a.get_object()["/A"]["/URI"])
        for page in reader.root["/Pages"]["/Kids"]
        for a in page.get_object().get("/Annots", [])
        if "/URI" in a.get_object().get("/A", {})
    ]
    assert "0/report.pdf" in uris and "1/report.pdf" in uris
    assert not any(u.startswith("file:") for u in uris) and b"file://" not in summary_pdf.read_bytes()


def test_the_configured_on_miss_reads_a_flattened_config_as_compare_holds_it():
    """compare's flattened config holds values as JSON text ('"WARN"'): a genuine WARN peak row agrees."""
    from reportgen.verify.run import configured_on_miss

    peak = {"role": Role.PEAK_SAVING, "variant": "recompute", "on_miss": "WARN"}
    assert configured_on_miss(peak, {"memory.peak_on_miss": '"WARN"'}) == "WARN"
    assert configured_on_miss(peak, {"memory.peak_on_miss": "FAIL"}) == "FAIL"
    assert configured_on_miss({"role": Role.PARAM_GRAD, "variant": "recompute"}, None) == "FAIL"
    assert configured_on_miss({"role": Role.PARAM_GRAD, "variant": "aa"}, None) is None
