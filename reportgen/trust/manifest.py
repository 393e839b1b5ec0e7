"""What a run wrote: the manifest its statement's subjects come from.

A run starts only in a new or empty folder (``reportgen.commands.rundir``), and from its first
step every file reportgen writes there is appended to ``.reportgen.manifest`` as it is written
(``reportgen.files.track_writes``). Hydra writes ``.hydra/config.yaml``, ``hydra.yaml`` and
``overrides.yaml`` itself, before reportgen runs; they are the run's too. The statement's
subjects are the run's files that are in that list, so a file someone else puts into the folder
(``notes.txt``, ``sub/mine.txt``) is never signed: ``reportgen.verify`` names it "not covered".
"""

from __future__ import annotations

from pathlib import Path

from reportgen.files import track_writes

#: The manifest, a dotfile (never a statement subject itself).
MANIFEST_NAME = ".reportgen.manifest"
#: What Hydra writes into a run folder before reportgen's job starts.
HYDRA_FILES = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")


def start_manifest(out_dir: Path) -> None:
    """Record, from now on, every file this process writes into ``out_dir``."""
    track_writes(Path(out_dir), MANIFEST_NAME)


def written_files(out_dir: Path) -> set[str] | None:
    """The files the run wrote into ``out_dir`` (POSIX paths relative to it), Hydra's included;
    ``None`` when the folder has no manifest (a run made before manifests, or a test's folder)."""
    manifest = Path(out_dir) / MANIFEST_NAME
    if not manifest.is_file():
        return None
    names = {line.strip() for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()}
    return names | {name for name in HYDRA_FILES if (Path(out_dir) / name).is_file()}


#: Left in a run folder whose checks all finished while its report is rendered and signed;
#: removed once it is signed. A run interrupted there keeps it: ``python -m reportgen.sign DIR``.
PENDING_NAME = "report.pending.json"
#: The command that finishes such a run.
SIGN_COMMAND = "python -m reportgen.sign"


def mark_pending(out_dir: Path, meta: dict, required: list[str], pdf: bool, sign: bool) -> Path:
    """Mark ``out_dir``: its checks finished, its report is being rendered and signed.

    The mark keeps what rendering needs and cannot be read back from the results (the run's
    metadata: claim, tolerances, environment; ``report.pdf``; whether it signs). The verdict
    is never taken from it: ``reportgen.sign`` re-judges every row of results.json.
    """
    import json

    from reportgen.files import atomic_write

    record = {
        "meta": meta,
        "required": list(required),
        "pdf": bool(pdf),
        "sign": bool(sign),
        "finish": f"{SIGN_COMMAND} {out_dir}",
    }
    return atomic_write(Path(out_dir) / PENDING_NAME, json.dumps(record, indent=1, default=str) + "\n")


def clear_pending(out_dir: Path) -> None:
    """The report is rendered and signed: remove the mark."""
    (Path(out_dir) / PENDING_NAME).unlink(missing_ok=True)
