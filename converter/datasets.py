"""Labelled image datasets for evaluation and training: a folder per class, IDX files, or NPZ arrays.

Whatever the container, each sample leaves here as the uint8 HxWxC pixels the service would
feed the model (app.imaging's geometry and colour mode) and an integer label in the model's
output order, so float and int8 models are scored on exactly what they will see in service.

    folder/<class>/*.png     class folders named as the model's labels ("/" written "_"), or
                             as their indices
    *-images-idx3-ubyte[.gz] the MNIST family's IDX files; labels from the matching
                             *-labels-idx1-ubyte[.gz] next to it (or given)
    *.npz                    arrays x/images and y/labels (uint8 pixels, integer labels)
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from app.imaging.decoding import decode
from app.imaging.geometry import to_pixels
from app.model_dir.schema import InputSpec
from converter.calibration import IMAGE_SUFFIXES, MAX_CALIBRATION_PIXELS

IDX_MAGIC_UBYTE = 0x08  # IDX type code for unsigned bytes
NPZ_IMAGE_KEYS = ("x", "images", "x_test", "X")
NPZ_LABEL_KEYS = ("y", "labels", "y_test", "Y")


class DatasetError(Exception):
    pass


@dataclass(frozen=True)
class Labelled:
    """A labelled dataset, read lazily: `samples()` yields (pixels, label) `count` times.

    `description` says what the data is (a file, a folder); the count is kept apart.
    """

    description: str
    count: int
    samples: Callable[[], Iterator[tuple[np.ndarray, int]]]


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (optionally gzipped) of unsigned bytes: magic 0x0000 08 ndim, big-endian sizes, data."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DatasetError(f"cannot read IDX file {path}: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DatasetError(f"{path} is not an IDX file (magic {raw[:4].hex()}, expected 0000 08 NN)")
    if raw[2] != IDX_MAGIC_UBYTE:
        raise DatasetError(f"{path}: IDX type 0x{raw[2]:02x}, only unsigned bytes (0x08) are read here")
    ndim = raw[3]
    dims = struct.unpack_from(f">{ndim}I", raw, 4)
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims))
    if len(raw) - offset != expected:
        raise DatasetError(f"{path}: {len(raw) - offset} bytes of data for dimensions {list(dims)} ({expected})")
    return np.frombuffer(raw, np.uint8, offset=offset).reshape(dims)


def idx_labels_path(images: Path) -> Path:
    """train-images-idx3-ubyte.gz -> train-labels-idx1-ubyte.gz, next to it."""
    name = Path(images).name
    if "images-idx3" not in name:
        raise DatasetError(f"{images}: cannot guess its labels file (expected a name with 'images-idx3'); "
                           "give it with --idx-labels")
    return Path(images).with_name(name.replace("images-idx3", "labels-idx1"))


def is_idx(path: Path) -> bool:
    return "idx" in Path(path).name and Path(path).name.endswith(("ubyte", "ubyte.gz"))


def load_idx_pair(images: Path, labels: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(N, H, W) uint8 images and (N,) labels from an IDX pair."""
    x = read_idx(images)
    y = read_idx(labels or idx_labels_path(images))
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
        raise DatasetError(f"{images}: expected (N, H, W) images and (N,) labels, got {x.shape} and {y.shape}")
    return x, y.astype(np.int64)


def array_pixels(image: np.ndarray, spec: InputSpec) -> np.ndarray:
    """One uint8 image array (H, W) or (H, W, C) -> the model's pixels, through app.imaging's resize."""
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    if image.dtype != np.uint8:
        raise DatasetError(f"image arrays must be uint8 pixels, got {image.dtype}")
    pil = Image.fromarray(image)
    pil = pil.convert("L" if spec.channels == 1 else "RGB")
    return to_pixels(pil, spec)


def from_arrays(images: np.ndarray, labels: np.ndarray, spec: InputSpec, description: str,
                limit: int | None = None) -> Labelled:
    n = len(images) if limit is None else min(limit, len(images))

    def samples():
        for i in range(n):
            yield array_pixels(images[i], spec), int(labels[i])

    return Labelled(description, n, samples)


def _npz(path: Path, spec: InputSpec, limit: int | None) -> Labelled:
    with np.load(path) as data:
        keys = list(data.files)
        image_key = next((k for k in NPZ_IMAGE_KEYS if k in keys), None)
        label_key = next((k for k in NPZ_LABEL_KEYS if k in keys), None)
        if image_key is None or label_key is None:
            raise DatasetError(f"{path}: expected arrays named one of {NPZ_IMAGE_KEYS} and one of "
                               f"{NPZ_LABEL_KEYS}, found {keys}")
        images, labels = data[image_key], data[label_key]
    if images.ndim not in (3, 4) or labels.ndim != 1 or len(images) != len(labels):
        raise DatasetError(f"{path}: expected (N, H, W[, C]) images and (N,) labels, "
                           f"got {images.shape} and {labels.shape}")
    return from_arrays(images, labels.astype(np.int64), spec, path.name, limit)


def folder_name(label: str) -> str:
    """The folder name a label gets ("T-shirt/top" -> "T-shirt_top": a path cannot hold "/")."""
    return label.replace("/", "_").replace("\\", "_")


def _class_index(folder: str, labels: Sequence[str]) -> int | None:
    """A class folder's output index: its name as a label (exact, then case-insensitive), or a number."""
    names = [folder_name(label) for label in labels]
    if folder in names:
        return names.index(folder)
    lowered = [name.lower() for name in names]
    if folder.lower() in lowered:
        return lowered.index(folder.lower())
    if folder.isdigit() and int(folder) < len(labels):
        return int(folder)
    return None


def _folders(root: Path, spec: InputSpec, labels: Sequence[str], limit: int | None) -> Labelled:
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DatasetError(f"{root} has no class sub-folders (expected {root}/<class name>/<images>)")
    files: list[tuple[Path, int]] = []
    unknown = []
    for folder in classes:
        index = _class_index(folder.name, labels)
        if index is None:
            unknown.append(folder.name)
            continue
        files += [(p, index) for p in sorted(folder.rglob("*")) if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()]
    if unknown:
        raise DatasetError(f"{root}: class folders {unknown} are neither labels of the model nor label indices "
                           f"(labels start {list(labels[:5])})")
    if not files:
        raise DatasetError(f"no images below {root}")
    files = files[:limit]

    def samples():
        for path, index in files:
            yield to_pixels(decode(path.read_bytes(), spec, MAX_CALIBRATION_PIXELS), spec), index

    return Labelled(f"{root} ({len(classes)} class folders)", len(files), samples)


def load_labelled(source: Path, spec: InputSpec, labels: Sequence[str], idx_labels: Path | None = None,
                  limit: int | None = None) -> Labelled:
    """A labelled dataset from a class-folder tree, an IDX images file, or an .npz file."""
    source = Path(source)
    if not source.exists():
        raise DatasetError(f"{source} does not exist")
    if source.is_dir():
        return _folders(source, spec, labels, limit)
    if source.suffix == ".npz":
        return _npz(source, spec, limit)
    if is_idx(source):
        images, targets = load_idx_pair(source, idx_labels)
        return from_arrays(images, targets, spec, source.name, limit)
    raise DatasetError(f"{source}: expected a folder of class folders, an IDX images file "
                       "(*-images-idx3-ubyte[.gz]) or an .npz file")
