"""A cache entry proves itself (issue 36): data a user module reads with ``np.load`` when it is
imported is in neither the cache key nor the files opened while training; the entry's stored
first training step (loss and gradient digest) is, so data ×10 is a miss, never a stale hit."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
from conftest import small_setup

from reportgen.checks.base.run import Run
from reportgen.results import Role, Status
from reportgen.training import cache
from reportgen.training.rows import run_rows
from reportgen.training.train import BudgetRuns

MODEL = ("+model=ffn", "model._target_=user_models.import_data.build")


@pytest.fixture
def data(tmp_path, monkeypatch):
    """The module's data file (float32 [12]) and a cache folder for this test only."""
    path = tmp_path / "data.npy"
    np.save(path, np.linspace(-1, 1, 12, dtype=np.float32))
    monkeypatch.setenv("REPORTGEN_TEST_IMPORT_DATA", str(path))
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    return path


def new_job():
    """The plain twin's budget run as a new process gets it: the module imported afresh (its data
    read again) and a fresh per-run cache."""
    if module := sys.modules.get("user_models.import_data"):
        importlib.reload(module)
    return BudgetRuns().get(small_setup(*MODEL), False, 0, 8)


def test_data_read_at_import_that_changed_is_a_fingerprint_miss_and_an_unchanged_rerun_hits(data, monkeypatch):
    first, again = new_job(), new_job()
    assert first.cache_key is None and again.cache_key is not None  # the fingerprint matched bitwise
    np.save(data, np.load(data) * 10)
    changed = new_job()
    assert changed.cache_key is None and changed.cache_rejected is not None
    (row,) = [r for r in run_rows("task metrics", "plain", "seed 0", 0, changed, "loss") if r.role == Role.CACHE]
    assert row.status == Status.WARN and "first training step differs" in row.detail, row.detail
    assert "loss" in row.detail and "trained afresh" in row.detail
    assert new_job().cache_key is not None  # the entry was replaced by the fresh run's
    monkeypatch.setenv(cache.ENV, "off")
    assert changed.metrics == new_job().metrics != first.metrics  # as without a cache


def test_the_rounding_envelope_is_never_measured_against_a_cached_twin(tmp_path, monkeypatch):
    """The second job's plain twin comes from the cache; where the envelope is needed, it is trained
    afresh and the seed judged on it, and the rounding twin is never stored or loaded."""
    from reportgen.checks.budget import task_metrics

    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    first = next(
        r
        for r in task_metrics(Run(small_setup("+model=rounding_level", user_conf=True)))
        if r.role == Role.FINAL_PARAMS
    )
    setup = small_setup("+model=rounding_level", user_conf=True)
    rows = task_metrics(Run(setup))
    assert any(r.role == Role.RUN and r.extra.get("cache_key") for r in rows)  # the plain run was a hit ...
    final = next(r for r in rows if r.role == Role.FINAL_PARAMS)
    assert "the plain twin was trained afresh for it" in final.detail, final.detail  # ... not used for the envelope
    assert final.status == first.status == Status.PASS and final.value == first.value
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1  # the plain twin's entry only


def test_a_first_step_that_is_not_bitwise_reproducible_is_never_stored(data, monkeypatch):
    """A later job could never prove such an entry (e.g. atomic adds in a CUDA backward): not stored."""
    draws = iter(range(10))
    monkeypatch.setattr(cache, "fingerprint", lambda *_: {"loss": str(next(draws)), "gradients": ""})
    assert new_job().cache_key is None and not (data.parent / "cache").exists()
