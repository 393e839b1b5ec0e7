"""Run integrity and bad input (issue 11): folders, locks, exit codes, validation, contract,
signals, console, keys, verify NOTEs, the URL fetcher, file modes."""

from __future__ import annotations

import dataclasses
import http.server
import io
import json
import logging
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import SMALL_RUN, TESTS, cli_env, compose_config, run_cli
from omegaconf import OmegaConf

from reportgen.commands import cli
from reportgen.commands.rundir import LOCK_NAME, FolderLock, run_markers
from reportgen.commands.validation import config_problems
from reportgen.files import atomic_write, output_file_mode
from reportgen.report.fetcher import LocalOnlyFetcher, RefusedURL
from reportgen.results import frame_from_json
from reportgen.tasks import FunctionTask
from reportgen.trust.keys import KeyFileError, SigningError, generate_key, load_private_key, load_signing_key
from reportgen.twins.contract import TaskContractError, check_task_contract
from reportgen.verify.common import unlisted_files

INTEGRITY_CONF = TESTS / "integrity_conf"


# --------------------------------------------------------------------------- 5: values


@pytest.mark.parametrize(
    "override, expected",
    [
        ("timing.max_overhead_ratio=nan", "timing.max_overhead_ratio=nan must be a finite number > 0"),
        ("timing.max_step_time_ms=-5", "timing.max_step_time_ms=-5 must be > 0"),
        ("timing.max_overhead_ratio=0", "timing.max_overhead_ratio=0 must be > 0"),
        ("parity.rtol=-1e-3", "parity.rtol=-0.001 must be >= 0"),
        ("parity.atol=inf", "parity.atol=inf must be a finite number >= 0"),
        ("budget.metric_tolerance=nan", "budget.metric_tolerance=nan must be a finite number >= 0"),
        ("timing.max_measure_seconds=0", "timing.max_measure_seconds=0 must be > 0"),
        ("dtype=float8", "dtype='float8' must be one of float32, float64, bfloat16, float16"),
        ("device=foo", "device='foo' must be one of auto, cpu, cuda, cuda:N"),
        ("recompute.determinism_check=strict", "recompute.determinism_check='strict' must be one of default, none"),
        ("larger_batch.lr_scaling=cubic", "larger_batch.lr_scaling='cubic' must be one of none, linear, sqrt"),
        ("verdict.required=[gradient parity,typo]", "verdict.required names unknown check(s) 'typo'"),
        ("verdict.required=[larger-batch experiment]", "FLAGGED and never counts toward the verdict"),
    ],
)
def test_bad_values_are_refused_naming_setting_and_rule(override, expected):
    problems = config_problems(compose_config("+model=ffn", override))
    assert expected in problems
    assert problems.count(";") == 0  # exactly this one problem


@pytest.mark.parametrize("model", ["ffn", "mlp", "gpt"])
def test_shipped_configs_and_good_edge_values_pass(model):
    assert config_problems(compose_config(f"+model={model}")) == ""
    assert (
        config_problems(
            compose_config(
                f"+model={model}",
                "parity.rtol=0",
                "parity.atol=0",
                "device=cuda:1",
                "timing.max_overhead_ratio=1.5",
                "verdict.required=[gradient parity, selective policy]",
                "dtype=bfloat16",
                "larger_batch.lr_scaling=sqrt",
            )
        )
        == ""
    )


def test_every_problem_is_listed_in_one_paragraph():
    problems = config_problems(compose_config("+model=ffn", "parity.rtol=nan", "parity.atol=-1", "device=tpu"))
    assert problems.count(";") == 2 and "\n" not in problems and problems.endswith("in docs/configuration.md).")


def test_check_names_allowed_in_verdict_required_are_the_checks_names():
    from reportgen.checks import default_required
    from reportgen.commands.validation import check_names
    from reportgen.config import SELECTIVE_POLICY

    assert SELECTIVE_POLICY in check_names() and set(default_required()) <= set(check_names())
    assert "larger-batch experiment" not in check_names()


# --------------------------------------------------------------------------- 1, 2: folder and lock


def test_folder_with_a_run_is_refused_before_anything_is_written(tmp_path, capsys):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / "results.json").write_text("[]")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SystemExit) as refused:
        FolderLock(tmp_path)
    assert refused.value.code == 2
    out = capsys.readouterr().out
    assert str(tmp_path) in out and ".hydra, results.json" in out and "hydra.run.dir" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no lock left behind


def test_second_lock_on_a_folder_is_refused_until_the_first_is_released(tmp_path, capsys):
    first = FolderLock(tmp_path / "run")
    assert (tmp_path / "run" / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with pytest.raises(SystemExit) as refused:
        FolderLock(tmp_path / "run")
    assert refused.value.code == 2 and "another reportgen run is writing into" in capsys.readouterr().out
    first.release()
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    assert run_markers(tmp_path / "run") == []


def test_sweep_folder_is_refused_when_one_of_its_jobs_holds_a_run(tmp_path):
    (tmp_path / "3" / ".hydra").mkdir(parents=True)
    assert run_markers(tmp_path) == [] and run_markers(tmp_path, depth=1) == ["3/.hydra"]
    with pytest.raises(SystemExit):
        FolderLock(tmp_path, depth=1)


# --------------------------------------------------------------------------- 12: file modes


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_follow_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        assert output_file_mode() == mode
        path = atomic_write(tmp_path / "results.csv", "a,b\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode


# --------------------------------------------------------------------------- 9: keys


def test_private_key_readable_by_others_is_refused_with_the_chmod(tmp_path):
    private, _ = generate_key(tmp_path / "k.pem")
    load_private_key(private)  # 0600: fine
    private.chmod(0o644)
    with pytest.raises(KeyFileError, match=r"mode 0644.*chmod 600 " + str(private)):
        load_private_key(private)
    with pytest.raises(SigningError) as err:
        load_signing_key(True, str(private))
    assert f"chmod 600 {private}" in str(err.value) and "\n" not in str(err.value)
    private.chmod(0o640)  # group-readable is refused too, as ssh does
    with pytest.raises(KeyFileError, match="mode 0640"):
        load_private_key(private)


# --------------------------------------------------------------------------- 10: verify NOTEs


def test_unlisted_files_name_logs_dotfiles_and_links(tmp_path):
    for name in (
        "results.json",
        "__main__.log",
        ".hidden",
        ".hydra/config.yaml",
        ".hydra/.extra",
        "report.pdf",
        "statement.dsse.json",
        "plots/a.svg",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "link").symlink_to("/etc/hostname")
    (tmp_path / "linkdir").symlink_to(tmp_path / "plots")
    found = unlisted_files(tmp_path, {"results.json", ".hydra/config.yaml"})
    assert found == [
        (".hidden", ""),
        (".hydra/.extra", ""),
        ("__main__.log", ""),
        ("link", "a symbolic link, "),
        ("linkdir", "a symbolic link, "),
        ("plots/a.svg", ""),
    ]


# --------------------------------------------------------------------------- 11: URL fetcher


class _Hits(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # http.server's name
        _Hits.hits.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hits)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Hits.hits = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_fetcher_serves_only_files_under_its_roots(tmp_path):
    (tmp_path / "style.css").write_text("p { color: red }")
    fetcher = LocalOnlyFetcher([tmp_path])
    assert fetcher((tmp_path / "style.css").as_uri()).read() == b"p { color: red }"
    assert fetcher("data:text/plain,hi").read() == b"hi"
    for url in (
        "file:///etc/hostname",
        (tmp_path / ".." / "x").as_uri(),
        "https://example.com/a.png",
        "ftp://example.com/x",
        "file://otherhost/etc/passwd",
    ):
        with pytest.raises(RefusedURL):
            fetcher(url)


def test_pdf_render_contacts_no_server_and_reads_no_outside_file(http_server, tmp_path, caplog):
    from weasyprint import HTML

    from reportgen.report.pdf import write_pdf

    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-CONTENT")
    html = (
        f'<html><head><link rel="stylesheet" href="{http_server}/style.css"></head><body>'
        f'<img src="{http_server}/pixel.png"><img src="{secret.as_uri()}"><p>report</p></body></html>'
    )
    pdf = write_pdf(html, "2024-01-02T03:04:05+00:00")
    assert pdf.startswith(b"%PDF") and _Hits.hits == []
    HTML(string=html).write_pdf()  # control: WeasyPrint's own fetcher does contact the server
    assert sorted(_Hits.hits) == ["/pixel.png", "/style.css"]


# --------------------------------------------------------------------------- 6: task contract


@pytest.fixture(scope="module")
def contract_setup():
    from reportgen.commands.run import prepare

    return prepare(compose_config("+model=ffn"))


@pytest.mark.parametrize(
    "make_batch, loss, expected",
    [
        ("make_batch_global_rng", "loss", "make_batch ignores its generator"),
        (
            "make_batch_ints",
            "loss",
            "the plain model raised RuntimeError on the integer inputs from make_batch (a torch.int64",
        ),
        ("make_batch_fixed_size", "loss", "shape [3, 8], whose leading size is not the batch size 2"),
        (
            "make_batch",
            "loss_per_example",
            "returned a torch.float32 tensor of shape [2], not a scalar floating tensor",
        ),
    ],
)
def test_task_contract_breach_stops_with_one_paragraph(contract_setup, make_batch, loss, expected, monkeypatch):
    from reportgen.twins.template import Template

    monkeypatch.syspath_prepend(str(TESTS))
    from user_models import integrity

    setup = dataclasses.replace(
        contract_setup,
        config=OmegaConf.to_object(
            compose_config("+model=ffn", "model._target_=user_models.integrity.build", "recompute.targets=[Block]")
        ),
        task=FunctionTask(getattr(integrity, make_batch), getattr(integrity, loss)),
        template=Template(integrity.build(), 0, torch.get_rng_state()),
    )
    with pytest.raises(TaskContractError) as err:
        check_task_contract(setup)
    text = str(err.value)
    assert expected in text and "the task contract (docs/own-model.md, 'The task object')" in text and "\n" not in text


def test_task_contract_kept_leaves_every_rng_as_it_was(contract_setup):
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    check_task_contract(contract_setup)
    after = (torch.rand(1).item(), random.random(), np.random.rand())
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    assert after == (torch.rand(1).item(), random.random(), np.random.rand())


# --------------------------------------------------------------------------- 4, 7, 8: exit codes and console


def test_console_shows_one_line_and_the_log_file_keeps_the_traceback(tmp_path):
    log_path = tmp_path / "job.log"
    console_stream = io.StringIO()
    console, file = logging.StreamHandler(console_stream), logging.FileHandler(log_path)
    for handler in (console, file):
        handler.setFormatter(logging.Formatter("[%(name)s][%(levelname)s] - %(message)s"))
    console.setFormatter(cli.OneLineExceptions(console.formatter, log_path))
    logger = logging.getLogger("reportgen.test_console")
    logger.propagate = False
    for handler in (console, file):
        logger.addHandler(handler)
    try:
        raise ValueError("first line\nsecond line")
    except ValueError:
        logger.exception("check %s raised", "task metrics")
    finally:
        file.close()
    assert console_stream.getvalue() == (
        f"[reportgen.test_console][ERROR] - check task metrics raised: ValueError: "
        f"first line (full traceback in {log_path})\n"
    )
    logged = log_path.read_text()
    assert "Traceback (most recent call last)" in logged and "second line" in logged


def _job(monkeypatch, tmp_path, **patches):
    """``cli.run_job`` on a composed ffn config, with ``reportgen.commands.run`` functions patched."""
    import reportgen.commands.run as pipeline

    for name, fn in patches.items():
        monkeypatch.setattr(pipeline, name, fn)
    cfg = compose_config("+model=ffn", "report.sign=false", "report.pdf=false")
    return cli.run_job(cfg, str(tmp_path))


def test_ctrl_c_before_the_checks_is_one_line_exit_130(monkeypatch, tmp_path, capsys):
    def interrupted(cfg, **kwargs):
        raise KeyboardInterrupt

    assert _job(monkeypatch, tmp_path, prepare_twins=interrupted) == 130
    out = capsys.readouterr()
    assert out.out == "reportgen: interrupted (Ctrl-C) before any check finished\n" and out.err == ""


def test_reportgen_bug_exits_70_with_log_path_and_keeps_results(monkeypatch, tmp_path, capsys):
    log_path = tmp_path / "__main__.log"
    handler = logging.FileHandler(log_path)
    logging.getLogger().addHandler(handler)

    def broken_render(*args, **kwargs):
        raise RuntimeError("template exploded\nwith details")

    try:
        code = _job(monkeypatch, tmp_path, render_report=broken_render, run_checks=lambda setup, out: [])
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert code == 70
    out = capsys.readouterr().out
    assert "internal error, a bug in reportgen, not in your config: RuntimeError: template exploded." in out
    assert f"Full traceback: {log_path}" in out and str(tmp_path / "results.json") in out
    assert "Traceback" not in out and "with details" not in out
    assert "Traceback (most recent call last)" in log_path.read_text()
    assert (tmp_path / "results.csv").exists()


def test_sigterm_handler_raises_a_keyboard_interrupt_and_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with cli.sigterm_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert cli._terminated and signal.getsignal(signal.SIGTERM) == before


# --------------------------------------------------------------------------- 3: rendering with values missing


@pytest.mark.slow
def test_every_section_renders_with_every_optional_value_missing(signed_run):
    from reportgen.report.render import render_html, view_model

    run_dir, _, _ = signed_run
    frame = frame_from_json((run_dir / "results.json").read_text())
    meta = _meta(run_dir)
    optional = [c for c in frame.columns if c not in ("check", "item", "variant", "role", "metric", "status", "detail")]
    assert {"value", "ci_low", "saving_bytes", "seed", "threshold_value", "excess"} <= set(optional)
    checks = list(frame.check.unique())
    assert len(checks) >= 7
    for check in checks:
        emptied = frame[frame.check == check].copy()
        emptied[optional] = None
        html = render_html(emptied, meta, "FAIL", ["gradient parity"])
        (section,) = view_model(emptied, meta, "FAIL", [])["sections"]
        assert f'id="{section["anchor"]}"' in html
        for row in emptied.itertuples():
            if section["template"] != "sections/rows.html.j2":  # own layouts summarise; the rows table lists all
                break
            assert str(row.item).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in html.replace(
                "<wbr>", ""
            )
        assert "saved activations not measured" in html and "step time not measured" in html


def _statement(run_dir: Path) -> str:
    import base64

    envelope = json.loads((run_dir / "statement.dsse.json").read_text())
    return base64.b64decode(envelope["payload"]).decode()


def _meta(run_dir: Path) -> dict:
    """Run metadata as ``run_metadata`` returns it, rebuilt from the signed statement's predicate."""
    predicate = json.loads(_statement(run_dir))["predicate"]
    return {
        "title": "Activation recomputation report",
        "created": predicate["created"],
        "claim": predicate["claim"],
        "tolerances": {"rtol": 1e-5, "atol": 1e-6, "source": "test"},
        "environment": predicate["environment"],
        "command": predicate["command"],
        "config_yaml": "",
        "out_dir": str(run_dir),
        "signature": "",
    }


# --------------------------------------------------------------------------- end to end (slow)


@pytest.fixture(scope="module")
def signed_run(tmp_path_factory, signing_key_pair):
    """One signed small ffn run into a named folder: ``(run folder, completed process, second)``.

    While it runs (once it holds the folder's lock) a second run into the same folder is started
    and must not start: ``second`` is its completed process
    (test_two_runs_into_one_folder_at_once_the_second_does_not_start)."""
    cwd = tmp_path_factory.mktemp("signed")
    run_dir = cwd / "the-run"
    args = [*SMALL_RUN, f"report.key_path={signing_key_pair[0]}", f"hydra.run.dir={run_dir}"]
    command = [sys.executable, "-m", "reportgen", *args]
    first = subprocess.Popen(command, cwd=cwd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / LOCK_NAME).exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first run never took the lock"
            time.sleep(0.05)
        second = run_cli(cwd, *args, "report.title=second")
    finally:
        out, err = first.communicate(timeout=600)
    proc = subprocess.CompletedProcess(command, first.returncode, out, err)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir, proc, second


def _verify(run_dir: Path, public: Path) -> subprocess.CompletedProcess:
    return run_cli(run_dir.parent, str(run_dir), "--key", str(public), module="reportgen.verify")


@pytest.mark.slow
def test_rerun_into_a_folder_with_a_run_exits_2_and_the_earlier_run_still_verifies(signed_run, signing_key_pair):
    run_dir, _, _ = signed_run
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    proc = run_cli(run_dir.parent, *SMALL_RUN, f"report.key_path={signing_key_pair[0]}", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2
    assert f"the output folder {run_dir} already holds a run" in proc.stdout and "Traceback" not in proc.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    verified = _verify(run_dir, signing_key_pair[1])
    assert verified.returncode == 0, verified.stdout
    assert "NOTE not covered: __main__.log" in verified.stdout and "VERIFIED" in verified.stdout


@pytest.mark.slow
def test_outputs_have_the_modes_hydra_files_have(signed_run):
    from reportgen.files import current_umask

    run_dir, _, _ = signed_run
    expected = 0o666 & ~current_umask()  # the subprocess inherited this process's umask
    for name in (
        "results.csv",
        "results.json",
        "report.html",
        "report.pdf",
        "report.unsigned.pdf",
        "statement.dsse.json",
        ".hydra/config.yaml",
    ):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == expected, name
    assert not (run_dir / LOCK_NAME).exists()


@pytest.mark.slow
def test_two_runs_into_one_folder_at_once_the_second_does_not_start(signed_run):
    """The second run started while the first held the folder's lock (the :func:`signed_run` fixture)."""
    run_dir, first, second = signed_run
    assert second.returncode == 2 and str(run_dir) in second.stdout, second.stdout + second.stderr
    assert first.returncode == 0
    config = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "report.key_path=" in config and "report.title=second" not in config  # the first run's, untouched
    assert len(list(run_dir.parent.glob("**/.hydra"))) == 1


@pytest.mark.slow
def test_sigterm_during_the_checks_keeps_not_run_rows_and_exits_143(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "reportgen",
        *(o for o in SMALL_RUN if not o.startswith("budget.")),  # short parity and timing: the test is about the kill
        "budget.examples=100000",
        "budget.seeds=[0]",
        "report.sign=false",
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    partial = run_dir / "results.partial.json"
    deadline = time.monotonic() + 300
    while not partial.exists() or "check: task metrics" not in _tail_log(run_dir):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    assert "Traceback" not in out + err
    assert out.strip().splitlines()[-1] == f"reportgen: interrupted; what was measured is in {partial}"
    frame = frame_from_json(partial.read_text())
    not_run = frame[frame.status == "NOT_RUN"]
    assert list(not_run.check) == ["task metrics", "larger-batch experiment", "detector controls"]
    assert (frame[frame.check == "gradient parity"].status == "PASS").all()


def _tail_log(run_dir: Path) -> str:
    log = run_dir / "__main__.log"
    return log.read_text() if log.exists() else ""


@pytest.mark.slow
def test_user_code_error_row_is_one_console_line_with_the_traceback_in_the_log(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        tmp_path,
        "--config-dir",
        str(INTEGRITY_CONF),
        *SMALL_RUN[1:],
        "+model=exploding_eval",
        "report.sign=false",
        "report.pdf=false",
        f"hydra.run.dir={run_dir}",
        pythonpath=str(TESTS),
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr  # the plain twin's evaluation raised too: cannot be judged
    lines = [line for line in proc.stdout.splitlines() if "ValueError" in line]
    assert lines and all(
        f"ValueError: evaluation exploded on purpose (full traceback in {run_dir / '__main__.log'})" in line
        for line in lines
    )
    assert "Traceback" not in proc.stdout + proc.stderr and "second line" not in proc.stdout
    log = (run_dir / "__main__.log").read_text()
    assert "Traceback (most recent call last)" in log and "second line that the console must not show" in log
    frame = pd.read_csv(run_dir / "results.csv")
    assert "ERROR" in set(frame[frame.check == "task metrics"].status)


@pytest.mark.slow
def test_task_contract_breach_exits_2_before_any_folder_content(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        tmp_path,
        "--config-dir",
        str(INTEGRITY_CONF),
        "+model=global_rng_batch",
        "report.sign=false",
        f"hydra.run.dir={run_dir}",
        pythonpath=str(TESTS),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "make_batch ignores its generator" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    assert not (run_dir / "results.partial.json").exists() and not (run_dir / "results.json").exists()


@pytest.mark.slow
def test_bad_value_exits_2_before_the_folder_exists(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(tmp_path, "+model=ffn", "device=foo", "timing.max_overhead_ratio=nan", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2
    assert "device='foo' must be one of auto, cpu, cuda, cuda:N" in proc.stdout
    assert "timing.max_overhead_ratio=nan must be a finite number > 0" in proc.stdout
    assert not run_dir.exists() and "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_help_lists_the_exit_codes(tmp_path):
    proc = run_cli(tmp_path, "--help")
    assert proc.returncode == 0 and "70 reportgen's own bug" in proc.stdout and "143 SIGTERM" in proc.stdout


@pytest.mark.slow
def test_no_model_prints_usage_and_writes_no_folder(tmp_path):
    proc = run_cli(tmp_path, f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and "python -m reportgen +model=ffn" in proc.stdout
    assert "ffn, gpt, hf_causal_lm, hf_gpt2, hf_llama, hf_masked_lm, mlp" in proc.stdout  # the models to pick from
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "outputs").exists()
