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
