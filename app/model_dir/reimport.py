"""A model.json an earlier `converter import` wrote, read against today's rule for feeding a model (app/importing/
preprocessing.py): an Ultralytics export imported before the importer recorded its maker's convention is fed
otherwise than `yolo predict` feeds it. The service warns at load (app/registry/loading.py), naming the command that
re-imports it; the model is still served as its model.json says.
"""

from __future__ import annotations

import shlex

from app.model_dir.schema import ULTRALYTICS_FILES, ULTRALYTICS_MEAN, ULTRALYTICS_STD, Manifest


def stale_preprocessing(manifest: Manifest) -> str | None:
    """Why a model imported before its maker's convention was recorded is fed otherwise than a re-import would feed
    it, with the command that re-imports it; None when it is fed as a re-import would feed it (or was not imported)."""
    imported, spec = manifest.imported, manifest.input
    if imported is None or spec.convention is not None or not _ultralytics_export(manifest):
        return None
    flags = _flags(manifest.build.command if manifest.build is not None else "")
    differences = []
    if "--mean" not in flags and "--std" not in flags and (spec.mean, spec.std) != (ULTRALYTICS_MEAN,
                                                                                     ULTRALYTICS_STD):
        differences.append(f"its pixels go in with mean {_fmt(spec.mean)}, std {_fmt(spec.std)}, where Ultralytics "
                           "feeds pixels / 255")
    if spec.resize == "letterbox":
        differences.append("its letterbox sits at the top-left on black, where Ultralytics centres it on grey 114")
    if not differences:
        return None
    return (f"model {manifest.name!r} is an Ultralytics export imported before the importer followed Ultralytics' "
            f"preprocessing: {'; '.join(differences)}, so its scores differ from `yolo predict`'s. It is served as "
            f"its model.json says; to feed it as Ultralytics does, import it again: {_reimport(manifest, flags)}")


def _ultralytics_export(manifest: Manifest) -> bool:
    """What an earlier import recorded of an Ultralytics export: its packed metadata, labels read from it, or
    YOLOv5's three anchors a cell (its objectness after the box)."""
    imported = manifest.imported
    packed = imported.metadata.get("packed_files") or []
    detection = manifest.detection
    yolov5 = (detection is not None and bool(detection.objectness)
              and any("3 anchors a cell" in note for note in imported.notes))
    return any(name in ULTRALYTICS_FILES for name in packed) or "Ultralytics' metadata" in imported.labels or yolov5


def _flags(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return []


def _reimport(manifest: Manifest, flags: list[str]) -> str:
    """The import's own command with --replace (the files it was given by name where it recorded "..."), or one
    made of the files it was given where none was recorded."""
    given = [f.name for f in manifest.imported.files]
    if flags[:4] != ["python", "-m", "converter", "import"]:
        flags = ["python", "-m", "converter", "import", "...", "--name", manifest.name]
    if "..." in flags:
        at = flags.index("...")
        flags = flags[:at] + given + flags[at + 1:]
    return shlex.join(flags + ([] if "--replace" in flags else ["--replace"]))


def _fmt(values: list[float]) -> str:
    return " ".join(f"{v:g}" for v in values)
