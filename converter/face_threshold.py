"""`python -m converter face-threshold`: an embedder's match threshold, from photos of people you know, written into
its model.json as `face.calibration` (app/faces/confidence.py: the threshold becomes confidence 0.5 for every
client of the face routes).

    PEOPLE_DIR/ann/*.jpg, PEOPLE_DIR/bob/*.png, ...   one folder per person, any number of photos each
      --> each photo: decoded upright (EXIF orientation), the detector's largest face (its landmarks where the
          detector gives them), aligned or cropped as the face routes do (app/faces/align.py face_input, the
          embedder's face.crop_margin), embedded (the embedding task: unit vectors)
      --> every same-person and different-person pair's cosine similarity (pair_similarities)
      --> calibrate: the equal-error threshold (or the lowest whose false accepts are at most --false-accept-rate),
          the separation printed (d', the overlap, the error rates)
      --> models/<embedder>/model.json face.calibration {threshold, same, different}, written whole and atomically

The models run in this process on the service's own backends and tasks (converter/local_models.py: `cpu`, or the
emulator), so the similarities are the service's. A photo that cannot be read, or where the detector finds no face,
is skipped and listed.

Example usage:

    python -m converter face-threshold --models models --detector ulfd_rfb320 --embedder mobilefacenet people/
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from app.faces.align import face_input
from app.faces.confidence import CalibrationError, ThresholdReport, calibrate, pair_similarities
from app.model_dir.schema import EMBEDDING, FaceCalibration, FaceSpec
from app.tasks.detect import DetectOptions, LandmarkedObject
from converter.local_models import LocalModel
from converter.model_dir import update_manifest

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"})
MAX_PIXELS = 100_000_000  # a photo larger than this is refused (a decompression bomb), as Pillow warns at 89 M
PHOTOS_MAX = 10_000       # app/faces/confidence.py FACES_MAX: the pairs of at most this many faces


class FaceThresholdError(ValueError):
    """The people folder, the models or the photos cannot give a threshold: the message says why."""


@dataclass
class Faces:
    """What the photos gave: each person's unit embeddings, and the photos skipped with why."""

    by_person: dict[str, list[np.ndarray]] = field(default_factory=dict)
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(vectors) for vectors in self.by_person.values())


def people_photos(people_dir: Path) -> dict[str, list[Path]]:
    """Person (folder name) -> their photos (image files in it, recursively), in name order."""
    people_dir = Path(people_dir)
    if not people_dir.is_dir():
        raise FaceThresholdError(f"{people_dir} is not a folder: give a folder with one sub-folder of photos per "
                                 "person")
    people = {}
    for folder in sorted(p for p in people_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        photos = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if photos:
            people[folder.name] = photos
    if len(people) < 2:
        raise FaceThresholdError(f"{people_dir} has {len(people)} folder(s) of photos; a threshold needs at least two "
                                 "people (one folder each), one of them with two photos or more")
    total = sum(len(photos) for photos in people.values())
    if total > PHOTOS_MAX:
        raise FaceThresholdError(f"{people_dir} holds {total} photos; give at most {PHOTOS_MAX}")
    return people


def open_photo(path: Path) -> Image.Image:
    """A photo decoded upright (EXIF orientation applied), RGB, at its full size."""
    try:
        with Image.open(path) as image:
            if image.width * image.height > MAX_PIXELS:
                raise FaceThresholdError(f"{path}: {image.width}x{image.height} is more than {MAX_PIXELS} pixels")
            return ImageOps.exif_transpose(image).convert("RGB")
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError) as e:
        raise FaceThresholdError(f"{path}: not an image Pillow can read ({e})") from None


def embed_people(people: dict[str, list[Path]], detector: LocalModel, embedder: LocalModel,
                 say: Callable[[str], None] = lambda line: None) -> Faces:
    """Each photo's largest face, aligned or cropped, embedded; photos without a face skipped."""
    spec = embedder.model_dir.manifest
    size = (spec.input.width, spec.input.height)
    margin = (spec.face or FaceSpec()).crop_margin
    faces = Faces()
    for person, photos in people.items():
        vectors = faces.by_person.setdefault(person, [])
        for path in photos:
            try:
                photo = open_photo(path)
            except FaceThresholdError as e:
                faces.skipped.append((path, str(e).removeprefix(f"{path}: ")))
                continue
            found = detector.answer(photo, DetectOptions()).detections
            if not found:
                faces.skipped.append((path, "no face found"))
                continue
            face = max(found, key=lambda o: (o.box.x_max - o.box.x_min) * (o.box.y_max - o.box.y_min))
            landmarks = [(p.x, p.y) for p in face.landmarks] if isinstance(face, LandmarkedObject) else []
            box = (face.box.x_min, face.box.y_min, face.box.x_max, face.box.y_max)
            vector = embedder.answer(face_input(photo, box, landmarks, size, margin))
            if vector.norm == 0.0:
                faces.skipped.append((path, "the embedder gave the zero vector"))
                continue
            vectors.append(vector.embedding)
        say(f"{person}: {len(vectors)} of {len(photos)} photos with a face")
    return faces


def face_threshold(models: Path, detector: str, embedder: str, people_dir: Path, backend: str = "cpu",
                   false_accept_rate: float | None = None, record: bool = True,
                   say: Callable[[str], None] = lambda line: None) -> ThresholdReport:
    """The threshold from the people's photos (the module docstring); written into the embedder's model.json
    unless `record` is False."""
    people = people_photos(people_dir)
    with LocalModel.open(Path(models) / detector, backend, task="detection") as find, \
            LocalModel.open(Path(models) / embedder, backend, task=EMBEDDING) as embed:
        say(f"detector {detector}, embedder {embedder} ({embed.model_dir.manifest.files['int8'].sha256[:12]}), "
            f"on {backend}")
        faces = embed_people(people, find, embed, say)
        embedder_dir = embed.model_dir
    for path, why in faces.skipped:
        say(f"skipped {path}: {why}")
    try:
        report = calibrate(*pair_similarities({p: np.stack(v) for p, v in faces.by_person.items() if v}),
                           false_accept_rate=false_accept_rate)
    except CalibrationError as e:
        raise FaceThresholdError(f"{faces.count} faces found in {people_dir}: {e}") from None
    for line in report.lines():
        say(line)
    if record:
        face = embedder_dir.manifest.face or FaceSpec()
        calibration = FaceCalibration(**report.calibration.to_json())
        update_manifest(embedder_dir.path, face=face.model_copy(update={"calibration": calibration}))
        say(f"recorded in {embedder_dir.path / 'model.json'} (face.calibration)")
    return report
