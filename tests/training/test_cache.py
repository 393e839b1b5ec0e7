"""The plain-twin cache cannot lie: each test performs one attack from issue 17 and checks that
it is a cache miss, or a WARN row and a fresh training run (never a hit, never an exception)."""

from __future__ import annotations

import io
import json
import pickle
import sys
from pathlib import Path

import pytest
import torch
from conftest import compose_config, small_setup
from omegaconf import OmegaConf

from reportgen.checks.base.run import Run
from reportgen.files import sha256_file
from reportgen.results import Role, Status
from reportgen.training import cache, cache_key, cache_secret
from reportgen.training.train import BudgetRuns

#: A recompute target class in a user module: GELU, edited to Tanh by the attacks.
BLOCK = """from torch import nn
{import_line}

class FeedForwardBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.act, self.lin2 = nn.Linear(12, 24), {activation}, nn.Linear(24, 12)

    def forward(self, x):  # [batch, 12] -> [batch, 12]
        return self.lin2(self.act(self.lin1(x)))


def build():
    return nn.Sequential(FeedForwardBlock())
"""


@pytest.fixture
def cache_folder(tmp_path, monkeypatch) -> Path:
    """``$REPORTGEN_CACHE_DIR`` for this test only."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache.ENV, str(folder))
    return folder


@pytest.fixture
def forget_modules():
    """``forget(*names)``: drop these packages from ``sys.modules`` now and after the test, as a
    new process would not have them."""
    names: list[str] = []

    def forget(*more: str) -> None:
        names.extend(more)
        for name in [m for m in sys.modules if m.split(".")[0] in names]:
            del sys.modules[name]

    yield forget
    forget()


def typed(cfg):
    """The run's typed config (:class:`reportgen.config.Config`) of a composed ``cfg`` (what a Setup holds)."""
    return OmegaConf.to_object(cfg) if OmegaConf.is_config(cfg) else cfg


def key_of(cfg, **kw) -> str:
    """The plain run's key for seed 0, batch 8 on this machine's CPU in float32 (``cfg`` composed or typed)."""
    return cache_key.plain_run_key(typed(cfg), kw.get("device", "cpu"), kw.get("dtype", torch.float32), 0, 8, 1.0)[0]


def plain_run(setup):
    """The plain twin's budget run through a fresh per-run cache, as a later job would get it."""
    return BudgetRuns().get(setup, False, 0, 8)


# --------------------------------------------------------------------------- the key covers every input
def test_key_covers_autocast_compile_and_every_config_group_but_the_recompute_settings():
    base = compose_config("+model=ffn")
    key = key_of(base)
    changed = {
        "autocast": "precision.autocast=bf16",
        "compile": "compile.enabled=true",
        "compile backend": "compile.backend=aot_eager",
        "seed": "seed=1",
        "forward seed": "forward_seed=3",
        "budget": "budget.examples=64",
        "optimizer": "budget.optimizer.lr=0.01",
        "model argument": "+model.hidden=8",
        "task": "task.width=6",
        "dtype": "dtype=float64",
        "device setting": "device=cpu",
        "a setting no key list names": "state.ignore_attributes=[x]",
    }
    keys = {name: key_of(compose_config("+model=ffn", override)) for name, override in changed.items()}
    assert all(k != key for k in keys.values()), [n for n, k in keys.items() if k == key]
    assert len(set(keys.values())) == len(keys)
    for run_input in ({"device": "cuda:0"}, {"dtype": torch.bfloat16}):
        assert key_of(base, **run_input) != key
    # a sweep over recompute settings (or the report's) still shares the plain twin
    same = ["recompute=reentrant", "recompute.preserve_rng_state=false", "report.title=x", "cache.enabled=true"]
    assert {key_of(compose_config("+model=ffn", o)) for o in same} == {key}
    material = cache_key.plain_run_key(typed(base), "cpu", torch.float32, 0, 8, 1.0)[1]
    assert set(material["versions"]) >= {"torch", "transformers", "reportgen", "python"}
    assert material["device"]["kind"].startswith("cpu ") and len(material["sources"]["reportgen"]) == 64


def test_an_autocast_job_does_not_reuse_the_fp32_plain_run(cache_folder):
    """The attack: a bf16 job reused the fp32 plain run (and failed task metrics)."""
    fp32 = plain_run(small_setup("+model=ffn"))
    again = plain_run(small_setup("+model=ffn"))
    assert fp32.cache_key is None and again.cache_key is not None  # the cache works ...
    bf16 = plain_run(small_setup("+model=ffn", "precision.autocast=bf16"))
    assert bf16.cache_key is None and bf16.cache_rejected is None  # ... and autocast is a miss
    assert bf16.metrics != fp32.metrics


def test_a_compile_change_is_a_miss(cache_folder):
    """torch.compile changes the plain twin's numerics: the key must see it (key level: compiling is slow)."""
    setup = small_setup("+model=ffn")
    plain_run(setup)
    secret, proof = cache_secret.cache_secret(), cache.fingerprint(setup, 0, 8)
    replay = cache.Replay(
        lambda sizes: cache.draw_digests(setup, 0, sizes), lambda t: cache.weights_evaluation(setup, t, 0)
    )
    for override in ("compile.enabled=true", "compile.backend=aot_eager"):
        cfg = compose_config("+model=ffn", override)
        key = cache_key.plain_run_key(typed(cfg), setup.device, setup.dtype, 0, 8, 1.0)[0]
        assert cache.load(cache_folder, key, secret, proof, replay) is None, override
    assert cache.load(cache_folder, key_of(setup.config), secret, proof, replay) is not None


def test_an_edit_in_a_namespace_package_is_a_miss(tmp_path, cache_folder, monkeypatch, forget_modules):
    """The attack: a user package without __init__.py; GELU -> Tanh gave a stale hit."""
    package = tmp_path / "project" / "nsblocks"  # no __init__.py: a namespace package
    package.mkdir(parents=True)
    module = package / "blocks.py"
    module.write_text(BLOCK.format(import_line="", activation="nn.GELU()"))
    monkeypatch.syspath_prepend(str(tmp_path / "project"))
    forget_modules("nsblocks")
    override = "model._target_=nsblocks.blocks.build"
    gelu = plain_run(small_setup("+model=ffn", override))
    assert (
        str(module.resolve())
        in cache_key.plain_run_key(small_setup("+model=ffn", override).config, "cpu", torch.float32, 0, 8, 1.0)[1][
            "sources"
        ]["user"]
    )
    assert plain_run(small_setup("+model=ffn", override)).cache_key is not None  # unchanged code: a hit
    module.write_text(BLOCK.format(import_line="", activation="nn.Tanh()"))
    forget_modules("nsblocks")  # a new process imports the edited code
    tanh = plain_run(small_setup("+model=ffn", override))
    assert tanh.cache_key is None and tanh.cache_rejected is None
    assert tanh.metrics != gelu.metrics  # the stale hit would have reported GELU's numbers


def test_an_edit_of_a_library_imported_from_another_folder_is_a_miss(
    tmp_path, cache_folder, monkeypatch, forget_modules
):
    """The attack: the block's activation comes from a library in another folder (on PYTHONPATH)."""
    library = tmp_path / "elsewhere" / "actlib"
    library.mkdir(parents=True)
    (library / "__init__.py").write_text("")
    (library / "act.py").write_text("from torch import nn\nACT = nn.GELU\n")
    project = tmp_path / "project" / "libuser"
    project.mkdir(parents=True)
    (project / "__init__.py").write_text("")
    (project / "blocks.py").write_text(BLOCK.format(import_line="from actlib.act import ACT", activation="ACT()"))
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    monkeypatch.syspath_prepend(str(tmp_path / "project"))
    forget_modules("actlib", "libuser")
    override = "model._target_=libuser.blocks.build"
    setup = small_setup("+model=ffn", override)
    gelu = plain_run(setup)
    assert (
        str((library / "act.py").resolve())
        in cache_key.plain_run_key(setup.config, "cpu", torch.float32, 0, 8, 1.0)[1]["sources"]["user"]
    )
    (library / "act.py").write_text("from torch import nn\nACT = nn.Tanh\n")
    forget_modules("actlib", "libuser")
    tanh = plain_run(small_setup("+model=ffn", override))
    assert tanh.cache_key is None and tanh.metrics != gelu.metrics


@pytest.mark.gpu
def test_on_cuda_the_key_names_the_gpu_a_second_job_reuses_the_run_and_autocast_is_a_miss(cache_folder):
    setup = small_setup("+model=ffn", "device=cuda")
    first = plain_run(setup)
    second = plain_run(small_setup("+model=ffn", "device=cuda"))
    assert first.cache_key is None and second.cache_key is not None and second.metrics == first.metrics
    kind = cache_key.plain_run_key(setup.config, setup.device, setup.dtype, 0, 8, 1.0)[1]["device"]["kind"]
    assert torch.cuda.get_device_name(setup.device) in kind
    assert plain_run(small_setup("+model=ffn", "device=cuda", "precision.autocast=bf16")).cache_key is None


# --------------------------------------------------------------------------- entries are checked on load
def _entry(folder: Path) -> tuple[Path, dict]:
    (meta,) = folder.glob("*.json")
    return meta, json.loads(meta.read_text())


def _rejection(rows) -> list:
    return [r for r in rows if r.role == Role.CACHE]


def test_the_recompute_twins_run_stored_under_the_plain_key_is_a_warn_and_a_fresh_run(cache_folder):
    """The attack: the broken recompute twin's run stored under the plain key turned task metrics
    FAIL -> PASS. Now the digest does not match: WARN, the plain twin is retrained, still FAIL."""
    from reportgen.checks.budget import task_metrics

    overrides = ("+model=dropout_rng", "recompute.preserve_rng_state=false")  # recompute changes dropout masks
    setup = small_setup(*overrides, user_conf=True)
    run = Run(setup)
    honest = task_metrics(run)
    worst = next(r for r in honest if r.role == Role.WORST)
    assert worst.status == Status.FAIL
    recompute = run.budget_runs.get(setup, True, 0, 8)
    meta, entry = _entry(cache_folder)
    entry["record"] = {name: getattr(recompute, name) for name in cache.RECORD_FIELDS}  # the digest is not redone
    buffer = io.BytesIO()
    torch.save(recompute.final_params, buffer)
    (cache_folder / entry["tensors"]["file"]).write_bytes(buffer.getvalue())
    meta.write_text(json.dumps(entry))

    again = small_setup(*overrides, user_conf=True)
    rerun = Run(again)
    rows = task_metrics(rerun)
    (warn,) = _rejection(rows)
    assert warn.status == Status.WARN and "digest mismatch" in warn.detail and "trained afresh" in warn.detail
    plain = rerun.budget_runs.get(again, False, 0, 8)
    assert plain.cache_key is None and plain.metrics == run.budget_runs.get(setup, False, 0, 8).metrics
    assert next(r for r in rows if r.role == Role.WORST).status == Status.FAIL  # the verdict did not move
    assert not _rejection(task_metrics(Run(small_setup(*overrides, user_conf=True))))  # the entry was replaced


@pytest.mark.parametrize("attack", ["edited tensor bytes", "edited number", "entry of another key", "truncated json"])
def test_an_edited_or_moved_entry_is_a_warn_and_a_fresh_run(cache_folder, attack):
    setup = small_setup("+model=ffn")
    first = plain_run(setup)
    meta, entry = _entry(cache_folder)
    if attack == "edited tensor bytes":
        tensors = cache_folder / entry["tensors"]["file"]
        data = bytearray(tensors.read_bytes())
        data[-40] ^= 0xFF
        tensors.write_bytes(bytes(data))
    elif attack == "edited number":
        entry["record"]["metrics"] = {k: v * 0.5 for k, v in entry["record"]["metrics"].items()}
        meta.write_text(json.dumps(entry))
    elif attack == "entry of another key":  # a genuine entry (seed 1) copied under seed 0's name
        BudgetRuns().get(setup, False, 1, 8)
        other = next(p for p in cache_folder.glob("*.json") if p != meta)
        meta.write_bytes(other.read_bytes())
    else:
        meta.write_text(meta.read_text()[:100])
    result = plain_run(small_setup("+model=ffn"))
    assert result.cache_key is None and result.metrics == first.metrics
    assert result.cache_rejected is not None and len(result.cache_rejected[0]) == 64
    from reportgen.training.rows import run_rows

    (warn,) = _rejection(run_rows("task metrics", "plain", "seed 0", 0, result, "loss"))
    assert warn.status == Status.WARN and warn.extra["cache_problem"] == result.cache_rejected[1]


class _RunsCode:
    """Unpickling this creates ``marker``: what a hostile cache entry would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def test_a_pickled_entry_whose_unpickling_runs_code_is_never_unpickled(cache_folder, tmp_path):
    """The attack: a .pt entry whose unpickling ran code inside the process that signed the report.
    Even with every digest redone by someone holding the cache secret, weights_only loading
    refuses it: WARN, fresh run."""
    setup = small_setup("+model=ffn")
    first = plain_run(setup)
    marker = tmp_path / "the-entry-ran-code"
    meta, entry = _entry(cache_folder)
    hostile = cache_folder / entry["tensors"]["file"]
    buffer = io.BytesIO()
    torch.save({"0.net.0.weight": _RunsCode(marker)}, buffer)
    hostile.write_bytes(buffer.getvalue())
    entry["tensors"]["sha256"] = sha256_file(hostile)
    entry["digest"] = cache.entry_digest(entry, cache_secret.cache_secret())  # an insider: every digest redone
    meta.write_text(json.dumps(entry))

    result = plain_run(small_setup("+model=ffn"))
    assert not marker.exists()
    assert result.cache_key is None and result.metrics == first.metrics
    assert "weights_only" in result.cache_rejected[1]
    # the old format: a whole pickled object as the entry (JSON of format 1): never opened
    meta.write_text(json.dumps({"format": 1}))
    hostile.write_bytes(pickle.dumps(_RunsCode(marker)))
    result = plain_run(small_setup("+model=ffn"))
    assert not marker.exists() and f"format-{cache_key.FORMAT}" in result.cache_rejected[1]
    pickle.loads(pickle.dumps(_RunsCode(marker)))  # control: the payload is real; unpickled, it runs
    assert marker.exists()


def test_an_entry_written_without_your_cache_secret_is_a_warn(cache_folder, tmp_path, monkeypatch):
    """Another user of a shared sweep folder (or an attacker who redoes a plain SHA-256) cannot
    make an entry this user's runs trust: the digest is an HMAC keyed with the user's secret."""
    first = plain_run(small_setup("+model=ffn"))
    monkeypatch.setenv(cache_secret.SECRET_ENV, str(tmp_path / "someone-else" / "cache-secret"))
    result = plain_run(small_setup("+model=ffn"))
    assert result.cache_key is None and "without your cache secret" in result.cache_rejected[1]
    assert result.metrics == first.metrics
    secret = tmp_path / "someone-else" / "cache-secret"
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes()) == cache_secret.SECRET_BYTES
    assert plain_run(small_setup("+model=ffn")).cache_key is not None  # the entry was rewritten under this secret


def test_no_cache_secret_means_no_cache_not_a_failed_run(cache_folder, tmp_path, monkeypatch, caplog):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(cache_secret.SECRET_ENV, str(tmp_path / "a-file" / "cache-secret"))  # cannot be made
    result = plain_run(small_setup("+model=ffn"))
    assert result.cache_key is None and result.cache_rejected is None and result.complete
    assert not cache_folder.exists() and "training without the cache" in caplog.text


def test_cache_enabled_false_neither_reads_nor_writes(cache_folder):
    setup = small_setup("+model=ffn", "cache.enabled=false")
    assert plain_run(setup).cache_key is None and plain_run(setup).cache_key is None
    assert not cache_folder.exists()


# --------------------------------------------------------------------------- duplicate seeds
@pytest.mark.parametrize("setting", ["budget.seeds", "larger_batch.seeds"])
def test_duplicate_seeds_are_refused_before_any_model_work(setting, tmp_path, capsys):
    from reportgen.commands import cli
    from reportgen.commands.validation import config_problems

    cfg = compose_config("+model=ffn", f"{setting}=[0,1,0]")
    problems = config_problems(cfg)
    assert problems.count("repeats seed") == 1 and f"{setting}=[0, 1, 0] repeats seed(s) 0" in problems
    assert f"{setting}=[0,1]" in problems  # the fix
    assert cli._run_job(cfg, str(tmp_path)) == 2  # what every job does first (the Hydra callback too)
    out = capsys.readouterr().out
    assert out.startswith("reportgen: cannot start:") and out.count("repeats seed") == 1
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- end to end: signed and verified
def test_a_poisoned_entry_in_a_signed_run_is_a_warn_on_page_one_and_the_run_still_verifies(
    cache_folder, tmp_path, monkeypatch, signing_key_pair
):
    """Task metrics and the flagged larger-batch experiment reuse one plain run; its poisoned entry
    is rejected in both (WARN, and FLAGGED inside the experiment), the exit code is the honest
    one, page 1 says so, and reportgen.verify accepts every row's status."""
    from conftest import run_pipeline

    from reportgen.checks import REGISTRY
    from reportgen.commands import run as pipeline
    from reportgen.config import LARGER_BATCH, TASK_METRICS
    from reportgen.results import Status
    from reportgen.trust.keys import load_public_key
    from reportgen.verify import verify
    from reportgen.verify.outcome import FAIL as VERIFY_FAIL

    monkeypatch.setattr(pipeline, "REGISTRY", [c for c in REGISTRY if c.name in (TASK_METRICS, LARGER_BATCH)])
    private, public = signing_key_pair
    overrides = (
        "+model=dropout_rng",
        "recompute.preserve_rng_state=false",
        "larger_batch.enabled=true",
        "larger_batch.max_batch_size=16",
        "report.sign=true",
        f"report.key_path={private}",
    )
    for name in ("honest", "poisoned"):
        (tmp_path / name).mkdir()
    honest_code, _ = run_pipeline(tmp_path / "honest", *overrides, user_conf=True)
    meta, entry = _entry(cache_folder)
    entry["record"]["metrics"] = {k: 0.0 for k in entry["record"]["metrics"]}
    meta.write_text(json.dumps(entry))
    code, frame = run_pipeline(tmp_path / "poisoned", *overrides, user_conf=True)
    assert code == honest_code == 1
    rejected = frame[frame.role == Role.CACHE]
    assert set(rejected.check) == {TASK_METRICS, LARGER_BATCH}
    assert set(rejected[rejected.check == TASK_METRICS].status) == {Status.WARN}
    assert set(rejected[rejected.check == LARGER_BATCH].status) == {Status.FLAGGED}
    html = (tmp_path / "poisoned" / "report.html").read_text()
    assert "Cache entries rejected" in html and "digest mismatch" in html
    checks = verify(tmp_path / "poisoned", load_public_key(public))
    assert not [c.line for c in checks if c.status == VERIFY_FAIL]


# --------------------------------------------------------------------------- contents, not paths (issue 27)


def test_an_edited_config_json_under_the_same_path_is_a_miss(tmp_path):
    """SiLU → GELU in model.config, same path: another key, so the stale plain run is never reused;
    the same holds for task.text_file and every file of a model.pretrained folder."""
    from reportgen.paths import conf_dir

    config = tmp_path / "config.json"
    config.write_text((conf_dir() / "examples" / "hf_causal_lm" / "config.json").read_text())
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox\n" * 20)
    cfg = compose_config("+model=hf_causal_lm", f"model.config={config}", f"task.text_file={text}")
    key, material = cache_key.plain_run_key(typed(cfg), "cpu", torch.float32, 0, 8, 1.0)
    assert set(material["files"]) == {str(config.resolve()), str(text.resolve())}
    fields = json.loads(config.read_text())
    fields["hidden_act"] = "gelu" if fields.get("hidden_act") != "gelu" else "silu"
    config.write_text(json.dumps(fields))
    assert key_of(cfg) != key
    edited = key_of(cfg)
    text.write_text("the quick brown fox\n" * 19 + "the quick brown cat\n")
    assert key_of(cfg) != edited
    weights = tmp_path / "pretrained"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"\0" * 64)
    with_folder = compose_config("+model=hf_causal_lm", f"model.pretrained={weights}")
    before = key_of(with_folder)
    (weights / "model.safetensors").write_bytes(b"\1" * 64)
    assert key_of(with_folder) != before


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_cache_secret_others_can_read_is_refused_naming_chmod_600(cache_folder, tmp_path, monkeypatch, caplog, mode):
    secret = tmp_path / "shared" / "cache-secret"
    secret.parent.mkdir()
    secret.write_bytes(b"s" * cache_secret.SECRET_BYTES)
    secret.chmod(mode)
    monkeypatch.setenv(cache_secret.SECRET_ENV, str(secret))
    with pytest.raises(cache_secret.CacheSecretError, match=r"Run `chmod 600 .*cache-secret`"):
        cache_secret.cache_secret()
    result = plain_run(small_setup("+model=ffn"))
    assert result.cache_key is None and result.complete and not cache_folder.exists()  # never used
    assert "chmod 600" in caplog.text and "training without the cache" in caplog.text


def test_a_cache_secret_that_is_a_device_is_refused(monkeypatch):
    monkeypatch.setenv(cache_secret.SECRET_ENV, "/dev/zero")
    with pytest.raises(cache_secret.CacheSecretError, match="is a character device, not a regular file"):
        cache_secret.cache_secret()


def test_a_data_file_the_task_opens_on_its_own_is_recorded_and_its_edit_makes_the_entry_stale(cache_folder, tmp_path):
    """A file no config value names (a dataset the task finds itself) is seen through Python's audit
    hook while the plain twin trains; the entry keeps its digest, and an edit is a miss."""
    from reportgen.trust.opened import opened_files

    data = tmp_path / "dataset.txt"
    data.write_text("1 2 3\n")
    with opened_files(ignore=(cache_folder,)) as found:
        assert data.read_text() == "1 2 3\n"
        (tmp_path / "written.txt").write_text("not data")  # written, not read: not recorded
    assert found == [data.resolve()]
    cfg = compose_config("+model=ffn")
    key, material = cache_key.plain_run_key(typed(cfg), "cpu", torch.float32, 0, 8, 1.0)
    record = {name: 0 for name in cache.RECORD_FIELDS} | {"metrics": {}, "curve": [], "complete": True}
    secret, proof = cache_secret.cache_secret(), {"loss": "0.5", "gradients": "0" * 64}
    proven = {"draws": [[8, "0" * 64]], "evaluation": {"loss": "0.5"}}  # what the replay below redoes
    replay = cache.Replay(lambda sizes: ["0" * 64], lambda tensors: {"loss": "0.5"})
    cache.store(cache_folder, key, material, record, {"w": torch.zeros(2)}, secret, proof, opened=found, **proven)
    assert cache.load(cache_folder, key, secret, proof, replay) is not None
    data.write_text("1 2 4\n")
    assert cache.load(cache_folder, key, secret, proof, replay) is None  # stale: trained afresh, never the old run
