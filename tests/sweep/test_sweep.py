"""Sweeps: each job's job.json, the on_multirun_end summary, and the worst job's exit code."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_JOB, job_cost_rows, reportgen_cli, write_job, write_launch
from omegaconf import OmegaConf

from reportgen.checks.controls.rows import STALE, control_row
from reportgen.config import CONTROLS, TIME
from reportgen.errors import ExitCode
from reportgen.sweep.callback import SweepSummary, main, sweep_exit_code
from reportgen.sweep.jobs import MISSING, load_jobs
from reportgen.sweep.record import recorded_job
from reportgen.sweep.summary import SweepMismatch, summarize
from reportgen.sweep.table import console_table, pareto_front, summary_frame, worst_code
from reportgen.trust.keys import generate_key


@pytest.fixture
def fake_sweep(tmp_path) -> Path:
    """Four jobs: 0 holds (75% saved, x1.30), 1 holds but is dominated (50%, x1.50),
    2 fails gradient parity, 3 could not start (exit 2, no results), and a killed job 4."""
    root = tmp_path / "sweep"
    root.mkdir()
    write_job(root / "0", 0, ["+model=mlp", "recompute=non_reentrant"], 0, job_cost_rows(1000, 250, 1.3, (1.2, 1.4)))
    write_job(root / "1", 1, ["+model=mlp", "recompute=reentrant"], 0, job_cost_rows(1000, 500, 1.5, (1.4, 1.6)))
    write_job(
        root / "2",
        2,
        ["+model=mlp", "recompute=selective"],
        1,
        job_cost_rows(1000, 100, 1.1, (1.0, 1.2), metric_diff=0.02, parity="FAIL"),
    )
    write_job(
        root / "3",
        3,
        ["+model=mlp", "recompute=broken"],
        2,
        None,
        error="recompute.targets ['Nothing'] match no module; the model has: Block, Linear",
    )
    write_job(root / "4", 4, ["+model=mlp", "recompute=killed"], None, None)
    write_launch(root, ["+model=mlp", "recompute=non_reentrant,reentrant,selective,broken,killed"])
    return root


def test_summary_frame_one_row_per_job_and_check_with_costs(fake_sweep):
    jobs = load_jobs(fake_sweep)
    frame = summary_frame(jobs)
    assert [j["job"] for j in jobs] == [0, 1, 2, 3, 4]
    assert list(frame.columns[:3]) == ["job", "recompute", "overrides"]  # +model is not swept: no column
    job0 = frame[frame.job == 0]
    assert sorted(job0.check) == ["gradient parity", "task metrics", "warm-step memory", "warm-step time"]
    assert job0.saved_activation_share.unique().tolist() == [0.75]  # (1000 - 250) / 1000
    assert job0.overhead_ratio.unique().tolist() == [1.3]
    assert (job0.overhead_ci_low.iloc[0], job0.overhead_ci_high.iloc[0]) == (1.2, 1.4)
    job2 = frame[frame.job == 2]
    assert job2.metric_abs_diff.iloc[0] == pytest.approx(0.02) and job2.metric.iloc[0] == "accuracy"
    assert job2.error.iloc[0] == "claim fails: gradient parity FAIL, task metrics FAIL"
    assert job2[job2.check == "gradient parity"].status.item() == "FAIL"


def test_failures_are_listed_not_lost(fake_sweep):
    frame = summary_frame(load_jobs(fake_sweep))
    broken = frame[frame.job == 3]
    assert len(broken) == 1 and broken.check.isna().item()
    assert broken.verdict.item() == "NOT_STARTED" and broken.exit_code.item() == 2
    assert "match no module" in broken.error.item() and broken.recompute.item() == "broken"
    killed = frame[frame.job == 4]
    assert killed.verdict.item() == MISSING and killed.exit_code.item() == ExitCode.BUG
    assert "no job.json" in killed.error.item() and killed.recompute.item() == "killed"


def test_worst_code_is_the_largest_job_code(fake_sweep):
    jobs = load_jobs(fake_sweep)
    assert worst_code(jobs) == 70
    assert worst_code([j for j in jobs if j["job"] < 4]) == 2
    assert worst_code([j for j in jobs if j["job"] < 2]) == 0
    assert worst_code([]) == 0


def test_pareto_front_keeps_only_undominated_configurations_that_hold():
    jobs = pd.DataFrame(
        {
            "job": [0, 1, 2, 3, 4],
            "verdict": ["PASS", "PASS", "FAIL", "PASS", "PASS"],
            "saved_activation_share": [0.75, 0.5, 0.9, 0.8, math.nan],
            "overhead_ratio": [1.3, 1.5, 1.0, 1.6, 1.0],
        }
    )
    front = pareto_front(jobs)
    # 1 is dominated by 0; 2 fails (however cheap); 4 has no saving measured.
    assert front.job.tolist() == [0, 3]


def test_recorded_job_writes_outcome_and_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("reportgen.sweep.record._job_identity", lambda: {"job": 7, "job_id": "7", "overrides": ["a=1"]})

    def cannot_start() -> int:
        print("reportgen: cannot start: recompute.targets match nothing")
        return 2

    (tmp_path / "a").mkdir()
    assert recorded_job(tmp_path / "a", cannot_start) == 2
    record = json.loads((tmp_path / "a" / "job.json").read_text())
    assert record["job"] == 7 and record["overrides"] == ["a=1"] and record["verdict"] == "NOT_STARTED"
    assert record["error"] == "cannot start: recompute.targets match nothing"
    assert "cannot start" in capsys.readouterr().out  # the line still reaches the console

    (tmp_path / "b").mkdir()

    def crashes() -> int:
        raise ZeroDivisionError("boom")

    assert recorded_job(tmp_path / "b", crashes) == 70
    record = json.loads((tmp_path / "b" / "job.json").read_text())
    assert record["verdict"] == "CRASHED" and record["error"] == "ZeroDivisionError: boom"


def test_single_run_writes_no_job_file(tmp_path):
    assert recorded_job(tmp_path, lambda: 1) == 1  # no Hydra multirun here
    assert not (tmp_path / "job.json").exists()


def test_summarize_writes_csv_html_pdf_with_matrix_scatter_and_links(fake_sweep):
    frame, code = summarize(fake_sweep, pdf=True, command="python -m reportgen -m ...")
    assert code == 70
    csv = pd.read_csv(fake_sweep / "summary.csv")
    assert len(csv) == len(frame) == 4 + 4 + 4 + 1 + 1
    html = (fake_sweep / "summary.html").read_text()
    assert "3 of 5" not in html and "2 of 5 configurations hold" in html
    assert 'href="0/report.html"' in html and 'href="3/report.html"' not in html
    assert "<svg" in html and "Pareto front" in html and "UNSIGNED" in html
    assert "match no module" in html and "no job.json" in html
    assert html.count('class="cell FAIL"') == 2  # job 2: gradient parity and task metrics
    assert (fake_sweep / "summary.pdf").read_bytes().startswith(b"%PDF")


def test_signing_refuses_jobs_whose_outcome_no_signed_run_vouches_for(fake_sweep, tmp_path):
    """job.json files that claim a verdict (exit 0 or 1) without a signed run, and a stand-in
    statement: nothing is signed, and each job is named (issue 27)."""
    (fake_sweep / "0" / "statement.dsse.json").write_text('{"stand-in": "job 0 envelope"}\n')
    private, _ = generate_key(tmp_path / "keys" / "k.pem")
    with pytest.raises(SweepMismatch) as refused:
        summarize(fake_sweep, sign=True, key_path=str(private), pdf=True)
    problems = refused.value.problems
    assert problems[0] == "job 0 (0/): its statement does not verify with this key (KeyError)"
    assert problems[1:] == [
        f"job {n} ({n}/): job.json says exit code {c} ({v}), which only a signed run gives, and "
        "the folder holds no signed statement"
        for n, c, v in [(1, 0, "PASS"), (2, 1, "FAIL")]
    ]
    assert not (fake_sweep / "summary.dsse.json").exists() and not (fake_sweep / "summary.csv").exists()


def test_the_detector_controls_are_carried_and_a_job_they_leave_inconclusive_says_why(tmp_path):
    """Issue 35: each job's controls are a column of the verdict matrix, and a job a missed control leaves
    INCONCLUSIVE (exit 3) names it in the summary, not an empty error."""
    caught = control_row(STALE, True, "caught", size="another example", caught_by="w.grad")
    blind = control_row(STALE, False, "not caught: the tolerance is too wide", size="another example")
    root = tmp_path / "sweep"
    write_job(root / "0", 0, ["+model=ffn", "recompute=non_reentrant"], 0, [*job_cost_rows(), caught])
    write_job(root / "1", 1, ["+model=ffn", "recompute=reentrant"], 3, [*job_cost_rows(), blind])
    write_launch(root, ["+model=ffn", "recompute=non_reentrant,reentrant"])
    frame, code = summarize(root, pdf=False)
    assert code == 3 and frame[frame.check == CONTROLS].status.tolist() == ["PASS", "INCONCLUSIVE"]
    said = "cannot be judged: detector controls INCONCLUSIVE"
    assert frame[frame.job == 1].error.iloc[0] == said
    html = (root / "summary.html").read_text()
    assert said in html and f"<th>{CONTROLS}</th>" in html and 'class="cell INCONCLUSIVE"' in html


@pytest.mark.parametrize("pdf", [False, True])
def test_callback_sets_the_exit_code_from_the_files(fake_sweep, capsys, pdf):
    """The callback reads the sweep's report settings: ``report.pdf`` decides summary.pdf (the real
    sweep below runs without PDFs, so the PDF side of the callback is checked here)."""
    cfg = OmegaConf.create(
        {
            "hydra": {"sweep": {"dir": str(fake_sweep)}},
            "report": {"sign": False, "key_path": None, "pdf": pdf, "title": "T"},
        }
    )
    SweepSummary().on_multirun_end(cfg)
    assert sweep_exit_code() == 70
    out = capsys.readouterr().out
    assert "2 of 5 jobs hold; exit code 70" in out and "recompute=broken" in out
    assert (fake_sweep / "summary.csv").exists()
    assert (fake_sweep / "summary.pdf").exists() == pdf
    if pdf:
        assert (fake_sweep / "summary.pdf").read_bytes().startswith(b"%PDF")


def test_launcher_configs_compose(compose_cfg):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    from hydra import compose, initialize_config_dir

    from reportgen.config import register_configs
    from reportgen.paths import conf_dir

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir())):
        slurm = compose(
            "config",
            overrides=[
                "+model=ffn",
                "hydra/launcher=slurm",
                "hydra.launcher.partition=gpu",
                "hydra.launcher.gpus_per_node=2",
            ],
            return_hydra_config=True,
        )
        parallel = compose("config", overrides=["+model=ffn", "hydra/launcher=parallel"], return_hydra_config=True)
    assert slurm.hydra.launcher._target_.endswith("SlurmLauncher")
    assert (slurm.hydra.launcher.partition, slurm.hydra.launcher.gpus_per_node) == ("gpu", 2)
    assert slurm.hydra.job.env_set.OMP_NUM_THREADS == str(slurm.hydra.launcher.cpus_per_task)
    assert parallel.hydra.launcher._target_.endswith("JoblibLauncher")
    assert int(parallel.hydra.launcher.n_jobs) * int(parallel.hydra.job.env_set.OMP_NUM_THREADS) <= 2


test_launcher_configs_compose = pytest.mark.cluster(test_launcher_configs_compose)


# --------------------------------------------------------------------------- end to end

#: 4 jobs: 0 holds, 1 fails gradient parity (dropout RNG not replayed), 2 and 3 cannot start
#: (targets match nothing): the sweep exits 2. No PDFs (the callback's summary.pdf:
#: test_callback_sets_the_exit_code_from_the_files; a job's report.pdf: the single-run tests).
SWEEP = [
    *TINY_JOB,
    "recompute.targets=[FeedForwardBlock],[Nothing]",
    "recompute.preserve_rng_state=true,false",
    "report.sign=false",
    "report.pdf=false",
]
#: Columns that are measured times and may differ between two sweeps of the same configurations.
TIMED = ["overhead_ratio", "overhead_ci_low", "overhead_ci_high"]


#: Jobs 0 and 2 of :data:`SWEEP` alone (one holds, one cannot start): what the other launchers
#: run. Each launcher runs a whole job and a refused one in its own worker processes; job 1's
#: FAIL is judged by the same code as job 0's PASS, so it is left to the basic launcher.
TWO_JOBS = [
    *TINY_JOB,
    "recompute.targets=[FeedForwardBlock],[Nothing]",
    "recompute.preserve_rng_state=true",
    "report.sign=false",
    "report.pdf=false",
]
#: :data:`SWEEP`'s job number of each :data:`TWO_JOBS` job.
TWO_JOBS_IN_SWEEP = {0: 0, 1: 2}
#: Summary columns that follow from the jobs' outcomes (not timings, not the swept-key columns).
OUTCOME = ["job", "verdict", "exit_code", "check", "status", "required"]


def run_sweep(tmp_path: Path, *launcher: str, overrides: list[str] = SWEEP):
    """Run ``python -m reportgen -m`` into ``tmp_path/sweep``; the plain-twin cache is the sweep's own
    (``<sweep dir>/.reportgen-cache``, whatever ``$REPORTGEN_CACHE_DIR`` says outside)."""
    proc = reportgen_cli(
        tmp_path,
        "-m",
        *launcher,
        *overrides,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        env={"REPORTGEN_CACHE_DIR": ""},
    )
    return proc, tmp_path / "sweep"


@pytest.fixture(scope="module")
def basic_sweep(tmp_path_factory):
    """:data:`SWEEP` through Hydra's basic launcher, once for every test that reads it."""
    return run_sweep(tmp_path_factory.mktemp("basic"))


def comparable(folder: Path) -> pd.DataFrame:
    frame = pd.read_csv(folder / "summary.csv")
    return frame.drop(columns=TIMED).sort_values(["job", "check"], na_position="first").reset_index(drop=True)


@pytest.mark.slow
def test_basic_launcher_sweep_summary(basic_sweep):
    proc, folder = basic_sweep
    assert proc.returncode == 2, proc.stdout + proc.stderr
    frame = pd.read_csv(folder / "summary.csv")
    verdicts = frame.drop_duplicates("job").set_index("job").verdict.to_dict()
    assert verdicts == {0: "PASS", 1: "FAIL", 2: "NOT_STARTED", 3: "NOT_STARTED"}
    not_started = frame[frame.job == 2]
    assert "FeedForwardBlock" in not_started.error.item()  # the message names the model's classes
    assert frame[frame.job == 0].saved_activation_share.iloc[0] > 0
    html = (folder / "summary.html").read_text()
    assert "Verdict matrix" in html and "<svg" in html and "Pareto front" in html and 'href="0/report.html"' in html
    assert not (folder / "summary.pdf").exists()  # report.pdf=false reaches the callback
    assert "1 of 4 jobs hold; exit code 2" in proc.stdout


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("launcher", ["parallel", "subprocess"])
def test_other_launchers_give_the_same_summary(basic_sweep, tmp_path, launcher):
    pytest.importorskip(
        "hydra_plugins.hydra_joblib_launcher" if launcher == "parallel" else "hydra_plugins.hydra_submitit_launcher"
    )
    proc, folder = run_sweep(tmp_path, f"hydra/launcher={launcher}", overrides=TWO_JOBS)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    basic = comparable(basic_sweep[1])
    basic = basic[basic.job.isin(TWO_JOBS_IN_SWEEP.values())].copy()
    basic["job"] = basic.job.map({v: k for k, v in TWO_JOBS_IN_SWEEP.items()})
    measured = comparable(folder)  # step times (and so the timing check's WARN) differ between any two runs
    assert set(measured.verdict) == {"PASS", "NOT_STARTED"}
    pd.testing.assert_frame_equal(
        measured[measured.check != TIME][OUTCOME].reset_index(drop=True),
        basic[basic.check != TIME][OUTCOME].reset_index(drop=True),
        check_dtype=False,
    )
    assert "1 of 2 jobs hold; exit code 2" in proc.stdout


# --------------------------------------------------------------------------- the plain twin's cache


def test_plain_budget_run_comes_from_the_cache_the_second_time(compose_cfg, tmp_path, monkeypatch, caplog):
    from reportgen.commands.run import prepare
    from reportgen.training.train import BudgetRuns

    monkeypatch.setenv("REPORTGEN_CACHE_DIR", str(tmp_path / "cache"))
    setup = prepare(compose_cfg("+model=ffn", "budget.examples=32", "report.sign=false"))
    caplog.set_level("INFO", logger="reportgen")
    first = BudgetRuns().get(setup, False, 0, 8)
    assert "from cache" not in caplog.text and first.cache_key is None
    second = BudgetRuns().get(setup, False, 0, 8)  # a later job: a fresh per-run cache
    assert "from cache" in caplog.text and len(second.cache_key) == 64
    assert second.metrics == first.metrics and second.curve == first.curve
    assert second.accepted_examples == first.accepted_examples == 32
    recompute = BudgetRuns().get(setup, True, 0, 8)  # the recompute twin is never cached
    assert getattr(recompute, "cache_key", None) is None
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 1


# the key's inputs, entry digests and the attacks on the cache: tests/training/test_cache.py


@pytest.mark.slow
def test_sweep_over_recompute_settings_trains_the_plain_twin_once(basic_sweep):
    """:data:`SWEEP`'s jobs 0 and 1 differ in a recompute setting (preserve_rng_state): job 0 trains
    the plain twin, job 1 loads it (which recompute settings the key leaves out, all of them:
    tests/training/test_cache.py); jobs 2 and 3 never start, so they train nothing."""
    proc, folder = basic_sweep
    out = proc.stdout + proc.stderr
    assert out.count("training plain twin") == 1  # job 0 trains it ...
    assert out.count("plain twin, seed 0, batch") == 1 and out.count("from cache") == 1  # ... job 1 loads it
    assert len(list((folder / ".reportgen-cache").glob("*.pt"))) == 1
    pages = {job: (folder / job / "report.html").read_text() for job in ("0", "1")}
    assert "From the plain-twin cache" not in pages["0"]  # job 0 trained it
    assert "From the plain-twin cache" in pages["1"] and "task metrics, seed 0 (key <code>sha256:" in pages["1"]


@pytest.mark.slow
def test_a_real_sweeps_jobs_are_its_launchs_and_a_deleted_one_is_refused(basic_sweep, tmp_path, capsys):
    """Hydra's own multirun.yaml re-derives exactly the jobs it launched (numbers and overrides);
    after a job folder is deleted the repair command refuses, naming it (issue 27)."""
    import shutil

    from reportgen.trust.launch import launch_record

    folder = Path(shutil.copytree(basic_sweep[1], tmp_path / "copy"))
    launch = launch_record(folder)
    jobs = load_jobs(folder)
    assert launch["job_count"] == 4 and [j["overrides"] for j in jobs] == [j["overrides"] for j in launch["jobs"]]
    assert launch["swept"]["recompute.preserve_rng_state"] == ["True", "False"]  # as Hydra writes them
    shutil.rmtree(folder / "1")
    assert main(["summarize", str(folder), "--no-sign", "--no-pdf"]) == 2
    assert "job 1 is missing: the launch made it" in capsys.readouterr().err


def test_a_job_without_detector_controls_is_marked_not_proven_in_the_summary(fake_sweep):
    """Issue 43: "controls off" is stated wherever a verdict is, the sweep summary too (and its console line)."""
    jobs = load_jobs(fake_sweep)
    ran = jobs[1]["frame"]
    jobs[1]["frame"] = pd.concat([ran, ran.iloc[[0]].assign(check=CONTROLS, status="PASS", detail="caught")])
    frame = summary_frame(jobs)
    said = frame.drop_duplicates("job").set_index("job").detectors
    assert said[0].startswith("detectors not proven: the run has no detector controls")
    assert said[1] == "" and said[3] == ""  # controls ran; a job that never started has no verdict to qualify
    table = console_table(frame, 0, fake_sweep)
    assert "[detectors not proven]" in table.splitlines()[2] and "[detectors not proven]" not in table.splitlines()[3]
