"""Writing model directories, whole and atomically: a reader (the service, a reload) sees the old directory or
the complete new one, never a half-written one. Every model.json written here is validated by its `Manifest`
first, so nothing writes one the service would refuse. The converter writes through it (converter/model_dir.py),
and so does the service where a client hands it a model (app/frontdoors/uploads.py).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel, ValidationError

from app.errors import ModelDirError
from app.model_dir.reading import read_model_dir, sha256_file
from app.model_dir.schema import MANIFEST, FileEntry, Manifest


def file_entry(path: Path, relative_to: Path) -> FileEntry:
    return FileEntry(
        path=str(path.relative_to(relative_to)),
        sha256=sha256_file(path),
        bytes=path.stat().st_size,
    )


def _as_manifest(manifest: Manifest | dict) -> Manifest:
    return manifest if isinstance(manifest, Manifest) else Manifest.model_validate(manifest)


def write_model_dir(root: Path, manifest: Manifest | dict, files: dict[str, tuple[str, bytes]],
                    replace: bool = False) -> Path:
    """Write models/<name>/ whole, atomically: a complete new directory or the old one.

    files maps a kind (int8, labels, ...) to (filename, content); their entries
    (path, sha256, bytes) are filled into the manifest here. Files already in an
    existing directory that this write does not name are kept (e.g. a compiled
    Edge TPU model when only the int8 model is rebuilt) along with their entries,
    unless `replace`: then the new directory holds only these files.
    """
    manifest = _as_manifest(manifest)
    root = Path(root)
    target = root / manifest.name
    root.mkdir(parents=True, exist_ok=True)
    kept = {}
    if not replace and target.is_dir() and (target / MANIFEST).is_file():
        previous = json.loads((target / MANIFEST).read_text(encoding="utf-8"))
        kept = {kind: FileEntry.model_validate(entry) for kind, entry in previous.get("files", {}).items()
                if kind not in files and (target / entry["path"]).is_file()}
    _replace_whole(target, manifest, kept, files)
    return target


def _merged(model_dir: Path, fields: dict) -> Manifest:
    """The existing manifest with top-level fields replaced, validated."""
    current = read_model_dir(model_dir).manifest
    data = current.model_dump(mode="json", by_alias=True, exclude_none=True)
    data.update({k: (v.model_dump(mode="json", by_alias=True, exclude_none=True) if isinstance(v, BaseModel) else v)
                 for k, v in fields.items()})
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        raise ModelDirError(f"{model_dir / MANIFEST}: the new fields do not validate: {e}") from None


def update_manifest(model_dir: Path, **fields) -> None:
    """Replace top-level fields of an existing model.json, atomically (write + rename)."""
    path = Path(model_dir) / MANIFEST
    text = _merged(model_dir, fields).to_json()
    tmp = path.with_name(f".{MANIFEST}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _swap_into_place(staging: Path, target: Path) -> None:
    """Rename staging to target; an existing target is moved aside first, then removed."""
    if not target.exists():
        os.rename(staging, target)
        return
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.rename(target, old)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def add_files(model_dir: Path, files: dict[str, tuple[str, bytes]], remove: tuple[str, ...] = (),
              **fields) -> None:
    """Add or replace files of an existing model directory and merge manifest fields, atomically.

    Like write_model_dir, the change lands whole (a new directory swapped in) or not at all.
    `remove` drops file kinds first (their files and entries), e.g. the previous compilation's
    segments. The directory's name must be its manifest's name, as the service requires.
    """
    model_dir = Path(model_dir)
    manifest = _merged(model_dir, fields)
    if manifest.name != model_dir.name:
        raise ModelDirError(f"{model_dir}: model.json names {manifest.name!r}, the directory {model_dir.name!r}")
    kept = {kind: entry for kind, entry in manifest.files.items() if kind not in remove and kind not in files}
    _replace_whole(model_dir, manifest, kept, files)


def _replace_whole(target: Path, manifest: Manifest, kept: dict[str, FileEntry],
                   files: dict[str, tuple[str, bytes]]) -> None:
    """Stage the complete new directory beside target (kept files copied from it, new ones
    written, the manifest validated and everything fsynced), then swap it in."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        entries = {}
        for kind, entry in kept.items():
            shutil.copy2(target / entry.path, staging / entry.path)
            entries[kind] = entry
        for kind, (filename, content) in files.items():
            (staging / filename).write_bytes(content)
            entries[kind] = file_entry(staging / filename, staging)
        full = manifest.model_copy(update={"files": entries})
        text = Manifest.model_validate_json(full.to_json()).to_json()  # never write what the service would refuse
        (staging / MANIFEST).write_text(text, encoding="utf-8")
        for f in staging.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        os.chmod(staging, 0o755)
        _swap_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
