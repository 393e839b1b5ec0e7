"""No write deletes what it replaces (issue 44, item 3): every file goes to a temporary file beside it
and ``os.replace`` renames it into place, so a full disk mid-write leaves the previous version whole:
the partial results after each check, the run's manifest, every output. A run that dies after its checks
keeps its rows and says how to sign them; ``reportgen.sign`` then signs them.

A full disk is simulated where it bites: the temporary file's ``write`` stores half its bytes, then
raises ``OSError(ENOSPC)``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

import pytest
from conftest import SMALL, compose_config

from reportgen import files
from reportgen.files import OutputWriteError, atomic_write, replace_write, track_writes
from reportgen.results import frame_from_json


class _HalfThenFull:
    """A file handle whose ``write`` stores half the bytes, then fails as a full disk does."""

    def __init__(self, handle):
        self.handle = handle

    def write(self, data):
        self.handle.write(data[: len(data) // 2])
        self.handle.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


def full_disk_for(monkeypatch, *names: str, after: int = 0) -> list[str]:
    """From the ``after``-th write on, writes of files named ``names`` (their temporary files) hit a full disk;
    returns the list of names whose write failed."""
    real, seen, failed = os.fdopen, {n: 0 for n in names}, []

    def fdopen(fd, *args, **kwargs):
        handle = real(fd, *args, **kwargs)
        target = os.readlink(f"/proc/self/fd/{fd}")
        name = next((n for n in names if Path(target).name.startswith(f".{n}.")), None)
        if name is None:
            return handle
        seen[name] += 1
        if seen[name] <= after:
            return handle
        failed.append(name)
        return _HalfThenFull(handle)

    monkeypatch.setattr(files.os, "fdopen", fdopen)
    return failed


def test_a_full_disk_mid_rewrite_keeps_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "results.partial.json"
    old = json.dumps([{"check": "gradient parity", "value": 1.0}] * 50)
    replace_write(path, old)
    full_disk_for(monkeypatch, path.name)
    with pytest.raises(OutputWriteError) as raised:
        replace_write(path, old.replace("1.0", "2.0") * 3)
    assert str(raised.value).startswith(f"could not write {path}: ") and "the disk is full" in str(raised.value)
    assert path.read_text() == old  # never removed, never half-written
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # the temporary file is gone


def test_a_rewrite_replaces_the_file_without_removing_it_first(tmp_path, monkeypatch):
    path = tmp_path / "results.partial.json"
    replace_write(path, "first")
    removed = []
    real = Path.unlink
    monkeypatch.setattr(Path, "unlink", lambda self, *a, **k: (removed.append(self.name), real(self, *a, **k))[1])
    replace_write(path, "second")
    assert path.read_text() == "second" and path.name not in removed
    with pytest.raises(FileExistsError):
        atomic_write(path, "third")  # an output never overwrites an earlier run's


def test_a_full_disk_while_listing_a_file_keeps_the_manifest_whole(tmp_path, monkeypatch):
    track_writes(tmp_path, ".manifest")
    atomic_write(tmp_path / "a.json", "{}")
    listed = (tmp_path / ".manifest").read_text()
    assert listed == "a.json\n"
    full_disk_for(monkeypatch, ".manifest")
    with pytest.raises(OutputWriteError):
        atomic_write(tmp_path / "b.json", "{}")
    assert (tmp_path / ".manifest").read_text() == listed
    monkeypatch.undo()
    replace_write(tmp_path / "b.json", "{}")  # listed once the disk has space
    assert (tmp_path / ".manifest").read_text() == "a.json\nb.json\n"


@pytest.fixture
def two_checks(use_checks):
    """The pipeline runs two quick checks of real rows (gradient parity's loss row, made twice)."""
    from reportgen.results import Role, Row

    def check(name):
        def run(run):
            return [Row.fact(name, "loss", Role.NOTE, f"{name} ran", metric="loss", value=1.0)]

        return run

    use_checks(("gradient parity", check("gradient parity")), ("state parity", check("state parity")))


def test_a_full_disk_during_the_checks_exits_2_and_keeps_the_partial_results(tmp_path, monkeypatch, two_checks):
    """The second check's partial write hits a full disk: one line, exit 2, and results.partial.json still holds
    the first check's rows (the old replace_write removed it before writing)."""
    from reportgen.commands.cli import _guarded_run

    cfg = compose_config(*SMALL, "+model=ffn")
    failed = full_disk_for(monkeypatch, "results.partial.json", after=1)
    code = _guarded_run(cfg, tmp_path, None)
    assert code == 2 and failed == ["results.partial.json"]
    kept = frame_from_json((tmp_path / "results.partial.json").read_text())
    assert list(kept.check) == ["gradient parity"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".results")]


def test_a_run_that_dies_after_its_checks_keeps_its_rows_and_says_how_to_sign_them(
    tmp_path, monkeypatch, capsys, two_checks, signing_key_pair
):
    from reportgen.commands import sign
    from reportgen.commands.cli import _guarded_run
    from reportgen.trust.manifest import PENDING_NAME

    private, _ = signing_key_pair
    cfg = compose_config(*SMALL, "+model=ffn", "report.sign=true", f"report.key_path={private}")
    full_disk_for(monkeypatch, "report.html")
    capsys.readouterr()
    assert _guarded_run(cfg, tmp_path, None) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "the disk is full" in out[0]
    assert out[0].endswith(f"render and sign them with python -m reportgen.sign {tmp_path}")
    assert (tmp_path / PENDING_NAME).is_file() and len(frame_from_json((tmp_path / "results.json").read_text())) == 2
    monkeypatch.undo()
    assert sign.main([str(tmp_path), "--key", str(private)]) in (0, 1)
    assert (tmp_path / "statement.dsse.json").is_file() and not (tmp_path / PENDING_NAME).exists()


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 5 MiB tmpfs mounted under ``tmp_path`` (skipped where this process may not mount one: not root, or a
    container without CAP_SYS_ADMIN)."""
    import shutil
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    if (
        shutil.which("mount") is None
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mount)], capture_output=True
        ).returncode
    ):
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", str(mount)], capture_output=True)


def test_a_real_5_mib_disk_filled_during_the_time_check_exits_2_and_keeps_the_partial_results(tiny_disk, use_checks):
    """Issue 44's done-when, on a real file system: the first check writes its rows, the time check fills the disk
    (as a neighbour's job would), its partial write fails: exit 2, results.partial.json whole and readable."""
    from reportgen.commands.cli import _guarded_run
    from reportgen.results import Role, Row

    def gradient(run):
        return [Row.fact("gradient parity", "loss", Role.NOTE, "ran", metric="loss", value=1.0)]

    def timing(run):
        with open(tiny_disk / "neighbour.bin", "wb") as f:  # fill every byte the disk has left
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
        return [Row.fact("warm-step time", "step 0", Role.NOTE, "ran", metric="step_time_ms", value=1.0)]

    use_checks(("gradient parity", gradient), ("warm-step time", timing))
    out = tiny_disk / "run"
    out.mkdir()
    code = _guarded_run(compose_config(*SMALL, "+model=ffn", "report.sign=false"), out, None)
    assert code == 2
    kept = frame_from_json((out / "results.partial.json").read_text())
    assert list(kept.check) == ["gradient parity"]
