"""A model directory read and checked: its model.json validated (`Manifest`), its labels and, on demand, each
of its files against the sha256 model.json records, so the service never runs a file that changed after it was
built."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from app.errors import ModelDirError
from app.model_dir.schema import EDGETPU, INT8, LABELS, MANIFEST, Manifest, segment_kind


@dataclass(frozen=True)
class ModelDir:
    path: Path
    manifest: Manifest
    labels: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.manifest.name

    def file(self, kind: str) -> Path:
        """Path of a file kind (int8, edgetpu, labels) after checking its sha256."""
        entry = self.manifest.files.get(kind)
        if entry is None:
            if kind == INT8 and self.has(EDGETPU):
                raise ModelDirError(no_cpu_form(self))
            raise ModelDirError(f"model {self.name!r} has no {kind!r} file in {self.path / MANIFEST}")
        path = self.path / entry.path
        if not path.is_file():
            raise ModelDirError(f"model {self.name!r}: {path} is listed in {MANIFEST} but missing")
        actual = sha256_file(path)
        if actual != entry.sha256:
            raise ModelDirError(
                f"model {self.name!r}: {path} has sha256 {actual}, {MANIFEST} expects {entry.sha256}; "
                "the file was changed or corrupted after it was built: rebuild it with the command in "
                f"{MANIFEST} 'build.command'"
            )
        return path

    def has(self, kind: str) -> bool:
        return kind in self.manifest.files

    def missing(self, kind: str) -> str | None:
        """Why a backend that runs `kind` files cannot serve this model (None: it can, or the model is
        segmented and its loader checks each segment's file)."""
        if self.manifest.segments is not None or self.has(kind):
            return None
        if kind == INT8 and self.has(EDGETPU):
            return no_cpu_form(self)
        return f"model {self.name!r} has no {kind!r} file (model.json lists {sorted(self.manifest.files)})"

    def segment_files(self, kind: str) -> list[Path]:
        """A segmented model's files of `kind` (int8, edgetpu), in pipeline order, sha256 checked."""
        segments = self.manifest.segments
        if segments is None:
            raise ModelDirError(f"model {self.name!r} is not segmented (no 'segments' in {MANIFEST})")
        return [self.file(segment_kind(kind, i)) for i in range(segments.count)]


def no_cpu_form(model: ModelDir) -> str:
    """Why a model that has only its Edge TPU file runs nowhere but on an Edge TPU, and the fix."""
    compiled = model.manifest.files[EDGETPU].path
    imported = model.manifest.imported
    given = next((f.name for f in imported.files if f.kind == EDGETPU), compiled) if imported else compiled
    plain = given.removesuffix("_edgetpu.tflite") + ".tflite" if given.endswith("_edgetpu.tflite") else "MODEL.tflite"
    return (f"model {model.name!r} has no CPU form: only its Edge TPU file {compiled} is here, which runs only "
            "through libedgetpu's delegate on an Edge TPU. Fix: import the plain .tflite it was compiled from "
            f"beside it: python -m converter import {plain} {given} --name {model.name} --replace")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_model_dir(path: Path) -> ModelDir:
    """Read and validate a model directory: the manifest, and the labels against their sha256 (model files on demand)."""
    path = Path(path)
    manifest_path = path / MANIFEST
    try:
        raw = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelDirError(f"{path} is not a model directory: {MANIFEST} is missing") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ModelDirError(f"cannot read {manifest_path}: {e}") from None
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as e:
        raise ModelDirError(f"invalid {manifest_path}: {e}") from None
    model = ModelDir(path=path, manifest=manifest, labels=())
    labels: tuple[str, ...] = ()
    if model.has(LABELS):
        labels_path = model.file(LABELS)  # sha256 checked, like every other file
        try:
            labels = tuple(labels_path.read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as e:
            raise ModelDirError(f"cannot read labels of {manifest.name!r}: {e}") from None
    return ModelDir(path=path, manifest=manifest, labels=labels)


def discover(root: Path) -> dict[str, Path]:
    """Model name -> directory, for every sub-directory of root holding a model.json."""
    root = Path(root)
    if not root.is_dir():
        raise ModelDirError(f"model directory {root} does not exist")
    found = {}
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.name.startswith(".") and (child / MANIFEST).is_file():
            found[child.name] = child
    return found
