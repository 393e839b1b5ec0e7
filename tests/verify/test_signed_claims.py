"""Nothing signed says more than was verified: sweeps, comparisons, INCONCLUSIVE runs, empty claims.

Each attack from issue 17 is performed here and must fail verification or be refused.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import REQUIRED, job_cost_rows, make_key, signed_run, tiny_frame, tiny_meta, write_job
from reportgen.compare import command as compare
from reportgen import sweep
from reportgen import verify as verifier
from reportgen.trust.keys import load_public_key
from reportgen.report.render import render_report
from reportgen.config import TIME
from reportgen.results import INCONCLUSIVE, Role, Row, claim_verdict, frame_from_json, to_frame
from reportgen.run import write_results
from reportgen.trust.signing import load_signing_key, sign_run, signature_label


def failed(checks) -> list[str]:
    return [c.line for c in checks if c.status == "FAIL"]


#: What the sweep jobs below require (their rows: ``conftest.job_cost_rows``).
JOB_REQUIRED = ["gradient parity", "warm-step memory"]


def signed_job(folder: Path, job: int, overrides: list[str], exit_code: int, rows: list, key: Path) -> Path:
    """A sweep job as a signed multirun leaves it: job.json, .hydra/, results.json and a signed statement."""
    write_job(folder, job, overrides, exit_code, rows, required=tuple(JOB_REQUIRED))
    frame = frame_from_json((folder / "results.json").read_text())
    (folder / "results.json").unlink()
    signing = load_signing_key(True, str(key))
    verdict = claim_verdict(frame, JOB_REQUIRED)
    write_results(frame, folder)
    sign_run(frame, tiny_meta(folder, signature_label(signing)), verdict, folder, signing, required=JOB_REQUIRED)
    return folder


@pytest.fixture
def keys(tmp_path):
    return make_key(tmp_path / "keys"), make_key(tmp_path / "other", "other.pem")


@pytest.fixture
def signed_sweep(tmp_path, keys):
    """Three jobs: 0 holds, 1 fails gradient parity, 2 could not start; summary signed, no PDF."""
    (private, _), _ = keys
    root = tmp_path / "sweep"
    root.mkdir()
    signed_job(root / "0", 0, ["+model=ffn", "recompute=non_reentrant"], 0, job_cost_rows(), private)
    signed_job(root / "1", 1, ["+model=ffn", "recompute=reentrant"], 1, job_cost_rows(parity="FAIL"), private)
    write_job(root / "2", 2, ["+model=ffn", "recompute=broken"], 2, None, error="targets match nothing")
    (root / "multirun.yaml").write_text("hydra: {}\n")
    sweep.summarize(root, sign=True, key_path=str(private), pdf=False)
    return root


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
    root.mkdir()
    signed_job(root / "0", 0, ["+model=ffn"], 1, job_cost_rows(parity="FAIL"), private)
    honest = sweep.summary_frame

    def lying(jobs):
        frame = honest(jobs)
        frame["status"] = "PASS"
        return frame

    monkeypatch.setattr(sweep, "summary_frame", lying)
    sweep.summarize(root, sign=True, key_path=str(private), pdf=False)
    monkeypatch.setattr(sweep, "summary_frame", honest)
    lines = failed(verify_dir(root, public).checks)
    assert lines == ["FAIL summary from jobs: summary.json does not follow from the jobs' signed files "
                     "(a job's outcome or results differ from what the summary states)"]


def test_an_added_job_folder_fails(signed_sweep, keys):
    (private, public), _ = keys
    signed_job(signed_sweep / "3", 3, ["+model=ffn", "recompute=selective"], 0, job_cost_rows(), private)
    assert any("job folder(s) 3 are not in the signed summary" in line
               for line in failed(verify_dir(signed_sweep, public).checks))


def test_an_interrupted_summary_is_marked_and_summarize_writes_it_again(signed_sweep, keys, capsys):
    (private, public), _ = keys
    (signed_sweep / sweep.INCOMPLETE_MARK).write_text("interrupted\n")
    assert any(line.startswith("FAIL summary complete") for line in failed(verify_dir(signed_sweep, public).checks))
    assert sweep.main(["summarize", str(signed_sweep), "--key", str(private), "--no-pdf"]) == 2  # worst job: exit 2
    assert not (signed_sweep / sweep.INCOMPLETE_MARK).exists()
    assert failed(verify_dir(signed_sweep, public).checks) == []
    assert sweep.main(["summarize", str(signed_sweep / "nothing")]) == 2
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
    assert sweep.main(["summarize", str(signed_sweep), "--key", str(private), "--no-pdf"]) == 2
    err = capsys.readouterr().err
    assert "could not write" in err and "disk is full" in err and "bug" not in err


# --------------------------------------------------------------------------- comparisons


@pytest.fixture
def signed_pair(tmp_path, keys):
    (private, _), _ = keys
    return signed_run(tmp_path / "base", private), signed_run(tmp_path / "new", private)


def test_a_signed_comparison_verifies_and_is_rederived(signed_pair, keys, tmp_path, capsys):
    (private, public), _ = keys
    out = tmp_path / "cmp"
    assert compare.main([*map(str, signed_pair), "--key", str(public), "--signing-key", str(private), "--no-pdf",
                         "--out", str(out)]) == 0
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
    compare.main([*map(str, signed_pair), "--key", str(public), "--signing-key", str(private), "--no-pdf",
                  "--out", str(out)])
    results = out / "inputs" / "new" / "results.json"
    results.write_text(results.read_text().replace("0.0", "0.5", 1))
    lines = failed(verify_dir(out, public).checks)
    assert any(line.startswith("FAIL subject inputs/new/results.json") for line in lines)
    assert any(line.startswith("FAIL NEW run: its results.json is not the one its statement vouches for")
               for line in lines)


def test_compare_refuses_to_sign_a_run_whose_rows_were_edited(signed_pair, keys, tmp_path, capsys):
    """FAIL rows edited to PASS in NEW's results.json, no --key: exit 1, the comparison UNSIGNED."""
    (private, _), _ = keys
    base, new = signed_pair
    shutil.rmtree(new)
    signed_run(new, private, failing=True)
    results = new / "results.json"
    results.write_text(results.read_text().replace('"status":"FAIL"', '"status":"PASS"'))
    out = tmp_path / "cmp"
    assert compare.main([str(base), str(new), "--signing-key", str(private), "--no-pdf", "--out", str(out)]) == 1
    said = capsys.readouterr().out
    assert "NEW NOT VERIFIED" in said and "says PASS" in said and "UNSIGNED" in said
    assert not (out / "compare.dsse.json").exists() and "UNSIGNED" in (out / "compare.html").read_text()


def noisy_timing(ratio: float, ci: tuple[float, float]) -> list:
    """A job whose overhead CI missed its width target (timing too noisy to trust)."""
    return [*job_cost_rows(ratio=ratio, ci=ci),
            Row(check=TIME, item="overhead confidence", variant="recompute", metric="ci_half_width_pp", value=12.0, threshold="<= 5 pp", comparator="<=",
                role=Role.OVERHEAD_CI, unit="pp", threshold_value=5.0, on_miss="WARN")]


def test_noise_is_not_called_a_regression(tmp_path, capsys):
    base = write_job(tmp_path / "base", 0, [], 0, noisy_timing(1.30, (1.10, 1.55)))
    new = write_job(tmp_path / "new", 0, [], 0, noisy_timing(1.43, (1.20, 1.70)))
    assert compare.main([str(base), str(new), "--no-sign", "--no-pdf", "--out", str(tmp_path / "c")]) == 3
    out = capsys.readouterr().out
    assert "CANNOT TELL: overhead ratio rose by 13.0 pp" in out and "REGRESSED" not in out
    separated = write_job(tmp_path / "far", 0, [], 0, noisy_timing(1.90, (1.80, 2.00)))
    assert compare.main([str(base), str(separated), "--no-sign", "--no-pdf", "--out", str(tmp_path / "d")]) == 1


def test_compare_out_onto_an_existing_folder_is_one_line_exit_2(tmp_path, capsys):
    base = write_job(tmp_path / "base", 0, [], 0, job_cost_rows())
    (tmp_path / "taken").mkdir()
    assert compare.main([str(base), str(base), "--no-sign", "--out", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err.strip()
    assert "exists already" in err and "\n" not in err and "Traceback" not in err


def test_compare_writes_under_outputs_comparisons_by_default(tmp_path, monkeypatch):
    base = write_job(tmp_path / "base", 0, [], 0, job_cost_rows())
    monkeypatch.chdir(tmp_path)
    assert compare.main([str(base), str(base), "--no-sign", "--no-pdf"]) == 0
    assert len(list((tmp_path / "outputs" / "comparisons").glob("*/*/compare.html"))) == 1
    assert not (tmp_path / "comparisons").exists()


# --------------------------------------------------------------------------- runs


def test_an_honest_inconclusive_run_verifies_with_exit_3(tmp_path, keys, capsys):
    (private, public), _ = keys
    rows = [*tiny_frame().to_dict("records")]
    frame = to_frame([Row(**{k: v for k, v in r.items() if k in Row.__dataclass_fields__}) for r in rows] +
                     [Row(check="gradient parity", item="plain vs plain (A/A)", variant="aa", metric="max_abs_err", status=INCONCLUSIVE,
                          role=Role.LOSS, detail="the plain twin does not reproduce itself")])
    run = signed_run(tmp_path / "run", private, frame=frame)
    assert claim_verdict(frame, REQUIRED) == INCONCLUSIVE
    assert verifier.main([str(run), "--key", str(public)]) == 3
    out = capsys.readouterr().out
    assert "VERIFIED (run folder)" in out and "INCONCLUSIVE" in out
    (run / "results.json").write_text((run / "results.json").read_text().replace("INCONCLUSIVE", "PASS"))
    assert verifier.main([str(run), "--key", str(public)]) == 1


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

    import reportgen.run as pipeline
    from reportgen import cli
    from reportgen.files import write_failure

    def disk_full(cfg, out_dir):
        raise write_failure(out_dir / "report.pdf", OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(pipeline, "run", disk_full)
    assert cli._guarded_run(None, tmp_path, None) == 2
    out = capsys.readouterr().out
    assert f"could not write {tmp_path / 'report.pdf'}" in out and "bug" not in out
