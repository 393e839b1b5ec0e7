"""A plain-twin cache entry is keyed on the bytes it consumed (issue 44, item 1): a task whose training pool
and validation split are read with ``np.load`` when its module is imported (no key, no file opened while
training sees them) must not reuse the entry when the split changes (a miss naming the evaluation) or when
only a later training batch changes (a miss naming that batch); an unchanged rerun is a hit."""

from __future__ import annotations

import importlib
import json
import sys

import numpy as np
import pytest
import torch
from conftest import small_setup

from reportgen.results import Role, Status
from reportgen.training import cache
from reportgen.training.rows import run_rows
from reportgen.training.train import BudgetRuns

TASK = ("+model=ffn", "task._target_=user_models.import_split.SplitTask", "~task.width")
POOL = 64  #: rows of the training pool (tests/user_models/import_split.py)


@pytest.fixture
def split(tmp_path, monkeypatch):
    """The module's ``.npz`` (train [64, 12], val [16, 12]) and a cache folder for this test only."""
    path = tmp_path / "split.npz"
    rng = np.random.default_rng(0)
    np.savez(
        path, train=rng.normal(size=(POOL, 12)).astype(np.float32), val=rng.normal(size=(16, 12)).astype(np.float32)
    )
    monkeypatch.setenv("REPORTGEN_TEST_IMPORT_SPLIT", str(path))
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    yield path
    forget()


def forget():
    """Drop the module from ``sys.modules`` and its package, as a new process would not have it (Hydra finds a
    target through the package's attribute)."""
    sys.modules.pop("user_models.import_split", None)
    if package := sys.modules.get("user_models"):
        package.__dict__.pop("import_split", None)


def edit(path, **arrays):
    """Rewrite the split file with ``arrays`` replacing its own."""
    data = dict(np.load(path))
    np.savez(path, **{**data, **arrays})


def new_job():
    """The plain twin's budget run as a new process gets it: the module imported afresh (its split read
    again) and a fresh per-run cache (seed 0, batch 8, 32 examples: 4 draws)."""
    importlib.reload(importlib.import_module("user_models.import_split"))
    return BudgetRuns().get(small_setup(*TASK), False, 0, 8)


def rejected_row(result):
    """The run's one ``cache_entry_rejected`` row."""
    (row,) = [r for r in run_rows("task metrics", "plain", "seed 0", 0, result, "loss") if r.role == Role.CACHE]
    return row


def test_a_validation_split_read_at_import_that_changed_is_a_miss_naming_the_evaluation(split, monkeypatch):
    first, again = new_job(), new_job()
    assert first.cache_key is None and again.cache_key is not None  # every proof matched bitwise
    assert again.cache_draws == 4 and again.cache_proof_seconds > 0 and again.metrics == first.metrics
    (run,) = [r for r in run_rows("task metrics", "plain", "seed 0", 0, again, "loss") if r.role == Role.RUN]
    assert "4 training batches drawn again and one evaluation" in run.detail and run.extra["cache_draws"] == 4
    edit(split, val=np.load(split)["val"] * 3)  # the split only: first step and every batch unchanged
    changed = new_job()
    assert changed.cache_key is None and changed.cache_rejected is not None
    row = rejected_row(changed)
    assert row.status == Status.WARN and "the evaluation of its weights differs" in row.detail, row.detail
    assert "trained afresh" in row.detail
    assert changed.metrics != first.metrics  # the stale held-out loss is never signed
    monkeypatch.setenv(cache.ENV, "off")
    assert new_job().metrics == changed.metrics  # as without a cache
    monkeypatch.undo()
    monkeypatch.setenv("REPORTGEN_TEST_IMPORT_SPLIT", str(split))
    monkeypatch.setenv(cache.ENV, str(split.parent / "cache"))
    assert new_job().cache_key is not None  # the entry was replaced by the fresh run's


def test_a_change_to_a_later_training_batch_only_is_a_miss_naming_that_batch(split, monkeypatch):
    generator = torch.Generator().manual_seed(0)  # the run's draws: 4 batches of 8 rows (SplitTask.make_batch)
    draws = [set(torch.randint(0, POOL, (8,), generator=generator).tolist()) for _ in range(4)]
    k, row = next(
        (k, r) for k, d in enumerate(draws[1:], 2) for r in sorted(d) if not any(r in e for e in draws[: k - 1])
    )
    first = new_job()
    train = np.load(split)["train"]
    train[row] += 1.0  # a row that batch k is the first to draw: the first step and the evaluation cannot see it
    edit(split, train=train)
    changed = new_job()
    assert first.cache_key is None and changed.cache_key is None
    detail = rejected_row(changed).detail
    assert f"training batch {k} of 4 (8 examples) differs" in detail, detail
    monkeypatch.setenv(cache.ENV, "off")
    unchanged_cache_off = new_job()
    assert changed.metrics == unchanged_cache_off.metrics != first.metrics  # the rows hold this run's numbers
    assert changed.final_params.keys() == unchanged_cache_off.final_params.keys()
    assert all(torch.equal(changed.final_params[n], unchanged_cache_off.final_params[n]) for n in changed.final_params)


def test_an_entry_without_batch_digests_or_evaluation_is_rejected(split, tmp_path):
    """An entry that stored no proof of what it consumed (e.g. written by hand with the secret) proves nothing."""
    from reportgen.training import cache_secret

    first = new_job()
    setup = small_setup(*TASK)
    secret = cache_secret.cache_secret()
    replay = cache.Replay(
        lambda sizes: cache.draw_digests(setup, 0, sizes), lambda t: cache.weights_evaluation(setup, t, 0)
    )
    (entry,) = (tmp_path / "cache").glob("*.json")
    key = entry.name.removesuffix(".json")
    stored = json.loads(entry.read_text())
    assert len(stored["draws"]) == 4 and set(stored["evaluation"]) == set(first.metrics)
    proof = cache.fingerprint(setup, 0, 8)
    for field, message in (
        ("draws", "no digests of the training batches"),
        ("evaluation", "no evaluation of its weights"),
    ):
        edited = {**stored, field: [] if field == "draws" else {}}
        edited["digest"] = cache.entry_digest(edited, secret)
        entry.write_text(json.dumps(edited))
        with pytest.raises(cache.Rejected, match=message):
            cache.load(tmp_path / "cache", key, secret, proof, replay)


def test_the_whole_run_after_a_split_change_trains_the_plain_twin_again_and_holds(split, tmp_path):
    """The issue's repro end to end: the second run with only the split changed was "from cache", exit 1 and
    "recompute is worse"; now the entry is a miss naming the evaluation, and the claim holds on fresh numbers."""
    from conftest import run_pipeline

    importlib.reload(importlib.import_module("user_models.import_split"))
    code, _ = run_pipeline(tmp_path / "first", *TASK)
    edit(split, val=np.load(split)["val"] * 3)
    importlib.reload(importlib.import_module("user_models.import_split"))
    code_after, frame = run_pipeline(tmp_path / "second", *TASK)
    assert code == code_after == 0
    rejected = frame[frame.role == Role.CACHE]
    assert len(rejected) == 1 and "the evaluation of its weights differs" in rejected.detail.iloc[0]
    assert "cache_key" not in frame.columns or frame[frame.role == Role.RUN].cache_key.isna().all()  # nothing reused
