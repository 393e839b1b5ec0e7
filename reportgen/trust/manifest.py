"""What a run wrote: the manifest its statement's subjects come from.

A run starts only in a new or empty folder (``reportgen.commands.rundir``), and from its first
step every file reportgen writes there is appended to ``.reportgen.manifest`` as it is written
(``reportgen.files.track_writes``). Hydra writes ``.hydra/config.yaml``, ``hydra.yaml`` and
``overrides.yaml`` itself, before reportgen runs; they are the run's too. The statement's
subjects are the run's files that are in that list, so a file someone else puts into the folder
(``notes.txt``, ``sub/mine.txt``) is never signed: ``reportgen.verify`` names it "not covered".
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from reportgen.files import sha256_file, track_writes

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


#: The files a seal always binds (besides the mark's own fields, and every file the run had written when its
#: checks finished, the mark's ``written``): what was measured and the config it ran.
SEALED_FILES = ("results.json", "results.csv", ".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml")


def sealed_digests(out_dir: Path, record: dict) -> dict[str, str | None]:
    """``{name: hex SHA-256 or None when missing}`` of each of :data:`SEALED_FILES` and of every file the mark lists
    as ``written``, as they are on disk now."""
    paths = {name: Path(out_dir) / name for name in sorted(set(SEALED_FILES) | set(record.get("written") or ()))}
    return {name: sha256_file(path) if path.is_file() else None for name, path in paths.items()}


def seal_payload(out_dir: Path, record: dict) -> bytes:
    """The bytes a seal signs: SHA-256 of each of :data:`SEALED_FILES` and of every file the mark lists as
    ``written`` (the run's manifest when its checks finished), as they are on disk, and the mark's fields
    that rendering uses (canonical JSON). Any edit to them changes the payload."""
    digests = sealed_digests(out_dir, record)
    fields = {k: record.get(k) for k in ("meta", "required", "pdf", "sign", "written")}
    return json.dumps({"files": digests, "mark": fields}, sort_keys=True, default=str).encode()


def changed_since_seal(out_dir: Path, record: dict) -> list[str]:
    """The sealed files whose bytes differ from the digests the mark lists (``sealed``: what the seal signed when
    the checks finished), "(missing)" noted for a file that is gone; empty when they all agree or the mark lists
    none (then the mark itself or the key differ). Names for a refusal only: the seal itself is what is trusted."""
    then = record.get("sealed")
    if not isinstance(then, dict):
        return []
    now = sealed_digests(out_dir, record)
    return [
        name + (" (missing)" if now.get(name) is None else "")
        for name in sorted(set(then) | set(now))
        if then.get(name) != now.get(name)
    ]


def mark_pending(out_dir: Path, meta: dict, required: list[str], pdf: bool, sign: bool, private_key=None) -> Path:
    """Mark ``out_dir``: its checks finished, its report is being rendered and signed.

    The mark keeps what rendering needs and cannot be read back from the results (the run's
    metadata: claim, tolerances, environment; ``report.pdf``; whether it signs). The verdict
    is never taken from it: ``reportgen.sign`` re-judges every row of results.json.

    With ``private_key`` (an ECDSA P-256 key, the run's signing key) the mark carries a *seal*: a
    signature over :func:`seal_payload`, made the moment the checks finished. ``reportgen.sign``
    signs only a folder whose results, config and mark still match their seal, so nobody can edit a
    finished, unsigned run and have it signed later.
    """
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from reportgen.files import atomic_write

    record = {
        "meta": meta,
        "required": list(required),
        "pdf": bool(pdf),
        "sign": bool(sign),
        "finish": f"{SIGN_COMMAND} {out_dir}",
        "written": sorted((written_files(out_dir) or set()) - {PENDING_NAME}),
    }
    record = json.loads(json.dumps(record, default=str))  # the fields as they will be read back
    if private_key is not None:
        signature = private_key.sign(seal_payload(out_dir, record), ec.ECDSA(hashes.SHA256()))
        record["seal"] = base64.b64encode(signature).decode()
        record["sealed"] = sealed_digests(out_dir, record)  # to name what changed; the seal signs the bytes
    return atomic_write(Path(out_dir) / PENDING_NAME, json.dumps(record, indent=1, default=str) + "\n")


def seal_holds(out_dir: Path, record: dict, public_key) -> bool:
    """True when ``record``'s seal is a signature by ``public_key`` over the folder as it is now."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        signature = base64.b64decode(str(record["seal"]), validate=True)
        public_key.verify(signature, seal_payload(out_dir, record), ec.ECDSA(hashes.SHA256()))
    except (KeyError, ValueError, TypeError, InvalidSignature):
        return False
    return True


def planted(out_dir: Path, record: dict, rewritten: tuple[str, ...]) -> list[str]:
    """Files the manifest lists now that the run had not written when its checks finished (the mark's
    ``written``) and that signing does not write itself (``rewritten``): what someone put into the folder
    and appended to the manifest since. Nothing of it may be signed."""
    allowed = set(record.get("written") or ()) | set(rewritten) | {PENDING_NAME}
    return sorted((written_files(out_dir) or set()) - allowed)


def clear_pending(out_dir: Path) -> None:
    """The report is rendered and signed: remove the mark."""
    (Path(out_dir) / PENDING_NAME).unlink(missing_ok=True)
