"""Fixtures that compose the real config with small overrides (lightning-hydra-template style)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import subprocess
import tempfile
from pathlib import Path

import forked_cli
import pytest
import torch
from hydra import compose, initialize_config_dir
from rows import allclose_row, fact_row, judged_row

from reportgen.commands.run import write_results
from reportgen.config import MEMORY, TIME, register_configs
from reportgen.paths import conf_dir
from reportgen.report.render import render_report
from reportgen.results import Role, claim_verdict, to_frame
from reportgen.trust import keys
from reportgen.trust.keys import load_signing_key, signature_label
from reportgen.trust.signing import sign_run

#: One intra-op thread in tests: the models here are tiny, and on a shared 2-core machine torch's
#: OpenMP threads wait for each other at every op (measured: the same 8-step training took 4.6 s
#: with 2 threads under load and 0.05 s with 1). Subprocesses get OMP_NUM_THREADS=1 (cli_env).
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # threads=auto reads it: in-process pipeline runs keep 1 thread too

#: The plain-twin cache's HMAC secret for this session and its subprocesses (reportgen/cache.py),
#: so that tests never make or read ~/.config/reportgen/cache-secret.
os.environ["REPORTGEN_CACHE_SECRET"] = str(Path(tempfile.mkdtemp(prefix="reportgen-tests-")) / "cache-secret")

#: Sharded tests that are not about how ranks start add :data:`FORKSERVER`: their 2 ranks fork from
#: a server process that imported torch and reportgen once per test worker, instead of each rank
#: importing both again (``spawn``, the product's default: ~4 s CPU per rank, most of a tiny
#: launch). The rank runs the same code from the same pickled config; ``spawn`` keeps its own tests
#: (tests/distributed/test_distributed.py: the pipeline run, whose rows the fsdp2 parity test reads;
#: tests/distributed/test_distributed_wrapping.py: the SIGTERM test's command).
FORKSERVER = "distributed.start_method=forkserver"
#: A sharded run of the parity, rank-memory and rank-sync parts alone (no budgets, timing, single-process memory
#: check or controls), unsigned and without a PDF: what the meta-build and per-rank memory tests measure.
SHARDED_PARTS_ONLY = (
    FORKSERVER,
    "budget.enabled=false",
    "larger_batch.enabled=false",
    "timing.enabled=false",
    "timing.warmup_steps=0",
    "timing.measured_steps=1",
    "memory.enabled=false",  # the single-process memory check: the ranks' own memory part still runs
    "controls.enabled=false",
    "parity.steps=1",
    "report.sign=false",
    "report.pdf=false",
    "run.max_estimated_minutes=null",
)
multiprocessing.set_forkserver_preload(forked_cli.PRELOAD)  # the CLI commands fork from it too (forked_cli.py)

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
USER_CONF = TESTS / "user_conf"


#: Small budgets for end-to-end runs whose subject is not training length or timing: one seed,
#: 32 accepted examples, 3 timing rounds, 3 trajectory steps, no larger-batch search, no PDF.
SMALL = (
    "budget.examples=32",
    "budget.batch_size=8",
    "budget.seeds=[0]",
    "budget.eval_every=16",
    "larger_batch.enabled=false",
    "timing.measured_steps=3",
    "timing.warmup_steps=1",
    "timing.target_ci_half_width_pp=null",
    "timing.max_measure_seconds=1",
    "parity.steps=3",
    "report.sign=false",
    "report.pdf=false",
)


def compose_config(*overrides: str, user_conf: bool = False):
    """Compose ``conf/config.yaml`` with ``overrides``; ``user_conf`` adds tests/user_conf to
    the search path, as a user's ``--config-dir`` would."""
    register_configs()
    extra = [f"hydra.searchpath=[file://{USER_CONF}]"] if user_conf else []
    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir())):
        return compose("config", overrides=[*extra, *overrides])


def small_setup(*overrides: str, user_conf: bool = False):
    """A :class:`reportgen.twins.setup.Setup` from the real config with :data:`SMALL` budgets."""
    from reportgen.commands.run import prepare

    return prepare(compose_config(*SMALL, *overrides, user_conf=user_conf))


def small_run(*overrides: str, user_conf: bool = False):
    """A :class:`reportgen.checks.base.run.Run` (the setup with its composed config, for checks that spawn ranks)."""
    from reportgen.checks.base.run import Run
    from reportgen.commands.run import prepare

    cfg = compose_config(*SMALL, *overrides, user_conf=user_conf)
    return Run(prepare(cfg), cfg)


@pytest.fixture
def setup():
    """``setup(*overrides, user_conf=False) -> Setup`` with small budgets (:func:`small_setup`)."""
    return small_setup


def run_pipeline(out_dir: Path, *overrides: str, user_conf: bool = False):
    """``(exit code, results frame)`` of the whole pipeline (``reportgen.commands.run.run``) with
    :data:`SMALL` budgets and ``overrides``, written into ``out_dir``."""
    from reportgen.commands import run as pipeline
    from reportgen.results import frame_from_json

    code = pipeline.run(compose_config(*SMALL, *overrides, user_conf=user_conf), out_dir)
    results = out_dir / "results.json"
    return code, frame_from_json(results.read_text()) if results.exists() else None


@pytest.fixture
def compose_cfg():
    """``compose_cfg(*overrides, user_conf=False) -> DictConfig``."""
    return compose_config


def checks_of(*pairs):
    """A check registry from ``(name, fn)`` pairs: one :class:`reportgen.checks.Check` each,
    shown with the generic rows table (its real record when the name is a registered one)."""
    from reportgen.checks import Check, Section, section

    return [Check(fn, (section(name) or Section(name, f"{name} (test check)"),)) for name, fn in pairs]


@pytest.fixture
def use_checks(monkeypatch):
    """``use_checks((name, fn), ...)``: the pipeline runs exactly these checks in this test."""
    from reportgen.commands import run as pipeline

    def use(*pairs):
        monkeypatch.setattr(pipeline, "REGISTRY", checks_of(*pairs))

    return use


# --------------------------------------------------------------------------- the command line
def reportgen(tmp_path: Path, *args: str, pythonpath: str = "") -> subprocess.CompletedProcess:
    """Run ``python -m reportgen ARGS`` in ``tmp_path`` (outputs land there)."""
    return run_cli(tmp_path, *args, pythonpath=pythonpath)


def run_dirs(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir())


# --------------------------------------------------------------------------- tiny signed runs
REQUIRED = ["gradient parity", "state parity"]


def tiny_frame(failing: bool = False):
    """A results frame as the parity checks would write it (checks with no section template of
    their own, so the test does not depend on how other sections render)."""
    tol = {"threshold": "atol=1e-05, rtol=1.3e-06", "seconds": 0.01}
    same, near = {"max_rel_err": 0.0, "bitwise_equal": True}, {"max_rel_err": 1e-6, "bitwise_equal": False}
    grad, excess = (0.5, 0.49) if failing else (3e-7, -9.7e-6)
    rows = [
        allclose_row("gradient parity", "loss", 0.0, -1e-5, role=Role.LOSS, detail="bitwise equal", extra=same, **tol),
        allclose_row("gradient parity", "blocks.0.lin.weight.grad", grad, excess, extra=near, **tol),
        judged_row(
            "state parity", "RNG torch.get_rng_state()", "bytes_differing", 0, "==", 0.0, role=Role.RNG, extra=same
        ),
    ]
    return to_frame(rows)


#: The memory check's advisory saving row: WARN, never FAIL, below 5 % of the plain twin's bytes.
SAVING_WARN = {"threshold": ">= 0.05 of plain", "on_miss": "WARN", "role": Role.SAVING}


def cost_rows():
    """Rows of the memory and time checks, as the predicate's ``costs`` reads them."""
    plain, recompute = 4 * 2**20, 2**20
    saving = {"plain_bytes": plain, "recompute_bytes": recompute, "saving_bytes": plain - recompute}
    total = {"item": "saved activations (total)", "metric": "saved_activation_bytes", "role": Role.SAVED_TOTAL}
    ci = {"ci_low": 1.2, "ci_high": 1.3}
    return [
        fact_row(MEMORY, value=plain, variant="plain", seconds=0.2, **total),
        fact_row(MEMORY, value=recompute, variant="recompute", seconds=0.2, **total),
        judged_row(MEMORY, "saving", "saving_share", 0.75, ">=", 0.05, detail="saves 75%", extra=saving, **SAVING_WARN),
        fact_row(TIME, "overhead", "overhead_ratio", 1.27, seconds=1.5, role=Role.OVERHEAD, extra=ci),
    ]


def tiny_meta(out_dir: Path, signature: str = "") -> dict:
    """Run metadata with the keys the template reads (what ``run_metadata`` returns)."""
    return {
        "title": "Activation recomputation report",
        "created": "2024-01-02T03:04:05+00:00",
        "claim": {
            "model": "tests.tiny.build",
            "task": "tests.tiny.task",
            "mode": "non_reentrant",
            "targets": ["Block"],
            "wrapped": [{"path": "blocks.0", "cls": "Block"}],
            "preserve_rng_state": True,
            "determinism_check": "default",
            "save_ops": [],
            "precision": "float32",
            "device": "cpu",
        },
        "tolerances": {"rtol": 1.3e-6, "atol": 1e-5, "source": "torch.testing.assert_close defaults for float32"},
        "environment": {
            "python": "3.11",
            "torch": "2.x",
            "reportgen": "0.1.0",
            "platform": "test",
            "device": "cpu",
            "seed": 0,
            "forward_seed": 0,
            "user_code_commit": "abc123",
        },
        "command": "python -m reportgen +model=tiny",
        "config_yaml": "seed: 0\n",
        "out_dir": str(out_dir),
        "signature": signature,
    }


def make_key(folder: Path, name: str = "signing-key.pem") -> tuple[Path, Path]:
    """A fresh key pair in ``folder``."""
    return keys.generate_key(folder / name)


def signed_run(
    out_dir: Path,
    key_path: Path | None,
    failing: bool = False,
    verdict: str | None = None,
    pdf: bool = True,
    frame=None,
) -> Path:
    """A complete run folder: Hydra's files, results, report, then the signing stage.

    ``verdict`` overrides the computed verdict (to sign a statement that lies); ``frame``
    replaces :func:`tiny_frame` (e.g. a frame whose statuses lie).
    """
    out_dir.mkdir(parents=True)
    (out_dir / ".hydra").mkdir()
    (out_dir / ".hydra" / "config.yaml").write_text("seed: 0\nreport:\n  sign: true\n")
    (out_dir / ".hydra" / "overrides.yaml").write_text("- +model=tiny\n")
    (out_dir / "__main__.log").write_text("[reportgen][INFO] - check: gradient parity\n")
    (out_dir / "plots").mkdir()
    (out_dir / "plots" / "memory.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>\n")
    key = load_signing_key(key_path is not None, str(key_path) if key_path else None)
    frame = tiny_frame(failing) if frame is None else frame
    meta = tiny_meta(out_dir, signature_label(key))
    verdict = verdict or claim_verdict(frame, REQUIRED)
    write_results(frame, out_dir)
    render_report(frame, meta, verdict, out_dir, pdf=pdf, required=REQUIRED)
    sign_run(frame, meta, verdict, out_dir, key, required=REQUIRED)
    return out_dir


#: The test files that take longest, longest first (52 s down to 8 s in one worker on a quiet
#: 2-core machine, 2026-12-02). With ``--no-loadscope-reorder`` (pyproject.toml) xdist hands whole
#: files to the workers in collection order, which :func:`pytest_collection_modifyitems` makes this
#: order, then the rest as collected: longest-processing-time-first scheduling, so no worker is left
#: alone with a long file at the end (xdist's own reorder puts files with many tests first, and these
#: have few). Only the order depends on it: a stale entry costs time, never a result
#: (tests/test_suite_harness.py checks the files exist).
LONGEST_FIRST = (
    "tests/distributed/test_distributed.py",
    "tests/distributed/test_distributed_wrapping.py",
    "tests/sweep/test_sweep.py",
    "tests/twins/test_real_models.py",
    "tests/plan/test_plan.py",
    "tests/commands/test_integrity.py",
    "tests/ci/test_ci_example.py",
    "tests/commands/test_limits.py",
    "tests/results/test_rounding.py",
    "tests/checks/test_verdict_truth.py",
    "tests/compare/test_compare.py",
    "tests/training/test_cache.py",
    "tests/memory/test_peak.py",
    "tests/memory/test_estimate.py",
    "tests/twins/test_recompute_hazards.py",
)


def pytest_collection_modifyitems(config, items):
    """Order the files :data:`LONGEST_FIRST`; skip ``gpu``-marked tests where torch sees no CUDA device
    and ``hf``-marked tests where transformers (the ``hf`` extra) is not installed."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest as collected
    missing = {
        "gpu": None if torch.cuda.is_available() else "needs CUDA",
        "hf": None if importlib.util.find_spec("transformers") else 'needs the hf extra: pip install -e ".[hf]"',
    }
    for marker, reason in missing.items():
        if reason:
            for item in items:
                if marker in item.keywords:
                    item.add_marker(pytest.mark.skip(reason=reason))


# --- end-to-end runs through the command line (tests/commands/test_integrity.py, test_overrides_property.py)
#: Overrides that make a built-in ffn run take seconds, not minutes (the checks all still run).
SMALL_RUN = ("+model=ffn", *(o for o in SMALL if not o.startswith("report.")))
#: Every exit code docs/exit-codes.md and DESIGN.md document for ``python -m reportgen``.
DOCUMENTED_EXIT_CODES = {0, 1, 2, 3, 70, 130, 143}


def cli_env(pythonpath: str = "") -> dict:
    """The environment of a ``python -m reportgen`` subprocess: this checkout first on PYTHONPATH."""
    import os

    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), pythonpath) if p),
    }


def run_cli(cwd: Path, *args: str, module: str = "reportgen", pythonpath: str = "", timeout: float = 600):
    """Run ``python -m MODULE ARGS`` in ``cwd`` and wait: a ``subprocess.CompletedProcess`` (text).
    Forked from the worker's pre-imported fork server (tests/forked_cli.py)."""
    return forked_cli.run(cwd, module, list(args), cli_env(pythonpath), timeout)


@pytest.fixture(scope="session")
def signing_key_pair(tmp_path_factory) -> tuple[Path, Path]:
    """``(private, public)`` key files made by ``reportgen.trust.keys.generate_key`` (private mode 0600)."""
    from reportgen.trust.keys import generate_key

    return generate_key(tmp_path_factory.mktemp("keys") / "signing-key.pem")


# --------------------------------------------------------------------------- sweeps and comparisons

#: A tiny job (+model=ffn, slow checks cut to the bone): a few seconds each on 2 cores.
TINY_JOB = list(SMALL_RUN)


def reportgen_cli(cwd: Path, *args: str, module: str = "reportgen", env: dict | None = None):
    """Run ``python -m MODULE ARGS`` in ``cwd`` with the clone on PYTHONPATH; the CompletedProcess
    (forked from the pre-imported fork server: tests/forked_cli.py)."""
    return forked_cli.run(cwd, module, list(args), {**cli_env(), **(env or {})}, 900)


def job_cost_rows(
    plain_bytes: float = 1000.0,
    recompute_bytes: float = 250.0,
    ratio: float = 1.3,
    ci: tuple[float, float] = (1.2, 1.4),
    metric_diff: float = 0.0,
    parity: str = "PASS",
    metric: str = "accuracy",
) -> list:
    """Result rows of one job whose headline costs are known, tagged with the roles that
    ``reportgen.report.render.headline_costs`` reads: the saving (plain vs recompute saved-activation
    bytes), the overhead ratio with its CI, the per-seed task-metric difference, and a
    gradient-parity row that passes or fails as ``parity`` says (judged, like a real row)."""
    share = (plain_bytes - recompute_bytes) / plain_bytes
    saving = dict(saving_bytes=plain_bytes - recompute_bytes, plain_bytes=plain_bytes, recompute_bytes=recompute_bytes)
    ci_columns = {"ci_low": ci[0], "ci_high": ci[1]}
    return [
        judged_row(
            "gradient parity", "loss", "max_abs_err", 0.0 if parity == "PASS" else 1.0, "<=", 1e-5, role=Role.LOSS
        ),
        judged_row(MEMORY, "saving", "saving_share", share, ">=", 0.05, unit="share", extra=saving, **SAVING_WARN),
        fact_row(TIME, "overhead", "overhead_ratio", ratio, role=Role.OVERHEAD, unit="ratio", extra=ci_columns),
        judged_row("task metrics", "seed 0", f"abs_diff_{metric}", metric_diff, "<=", 1e-4, role=Role.METRIC_DIFF),
    ]


def write_job(
    folder: Path,
    job: int,
    overrides: list[str],
    exit_code: int | None,
    rows: list | None,
    error: str | None = None,
    required: tuple[str, ...] = ("gradient parity", "warm-step memory", "warm-step time", "task metrics"),
) -> Path:
    """A job folder as a finished multirun job leaves it: ``job.json`` (unless ``exit_code`` is
    None: a killed job), ``results.json`` (unless ``rows`` is None), ``.hydra/`` with the
    overrides and ``verdict.required``, and a stub report.html when there are results."""
    import json

    from omegaconf import OmegaConf

    from reportgen.results import frame_to_json, to_frame
    from reportgen.sweep import VERDICT_BY_CODE

    folder.mkdir(parents=True)
    (folder / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create(list(overrides)), folder / ".hydra" / "overrides.yaml")
    OmegaConf.save(OmegaConf.create({"verdict": {"required": list(required)}}), folder / ".hydra" / "config.yaml")
    if rows is not None:
        (folder / "results.json").write_text(frame_to_json(to_frame(rows)))
        (folder / "report.html").write_text("<html></html>")
    if exit_code is not None:
        record = {
            "job": job,
            "job_id": str(job),
            "overrides": list(overrides),
            "exit_code": exit_code,
            "verdict": VERDICT_BY_CODE.get(exit_code, "CRASHED"),
            "error": error,
            "seconds": 1.0,
        }
        (folder / "job.json").write_text(json.dumps(record))
    return folder


def measured(setup, recompute: bool):
    """Saved-activation bytes of one twin of ``setup`` on its fixed batch, per wrapped module
    (``reportgen.memory.saved.saved_activation_bytes``)."""
    from reportgen.memory.saved import saved_activation_bytes

    model = setup.build(recompute)
    return saved_activation_bytes(
        model, setup.batch, setup.training_step, setup.config.forward_seed, [w.path for w in setup.wrapped]
    )


def write_launch(sweep_dir: Path, task: list[str]) -> Path:
    """Hydra's launch record (``multirun.yaml``) of a basic-sweeper multirun with command-line
    overrides ``task`` (e.g. ``["+model=ffn", "recompute=a,b"]``: jobs 0 and 1)."""
    from omegaconf import OmegaConf

    from reportgen.trust.launch import BASIC_SWEEPER, LAUNCH_FILE

    sweep_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "hydra": {
            "sweeper": {"_target_": BASIC_SWEEPER, "max_batch_size": None, "params": None},
            "sweep": {"dir": str(sweep_dir), "subdir": "${hydra.job.num}"},
            "overrides": {"hydra": [], "task": list(task)},
        }
    }
    OmegaConf.save(OmegaConf.create(record), sweep_dir / LAUNCH_FILE)
    return sweep_dir / LAUNCH_FILE


def job_sweep(sweep_dir: Path, job: int, overrides: list[str]) -> dict:
    """What a sweep job's statement signs about its launch (``reportgen.trust.launch.job_launch``)."""
    from reportgen.files import sha256_file

    return {"job": job, "overrides": list(overrides), "launch_sha256": sha256_file(sweep_dir / "multirun.yaml")}


def sign_folder(folder: Path, key: Path, required: list[str], sweep: dict | None = None) -> Path:
    """Sign a folder made by :func:`write_job` as its run would have: results written again, then
    ``sign_run`` over them (``job.json`` is written after, as a job writes it after signing).
    ``sweep``: what the job's statement signs about its launch (:func:`job_sweep`)."""
    from reportgen.results import frame_from_json

    frame = frame_from_json((folder / "results.json").read_text())
    (folder / "results.json").unlink()
    record = folder / "job.json"
    text = record.read_text() if record.exists() else None
    record.unlink(missing_ok=True)
    signing = load_signing_key(True, str(key))
    write_results(frame, folder)
    meta = tiny_meta(folder, signature_label(signing)) | ({"sweep": sweep} if sweep else {})
    sign_run(frame, meta, claim_verdict(frame, required), folder, signing, required=required)
    if text is not None:
        record.write_text(text)
    return folder
