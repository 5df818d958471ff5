"""Representative data for post-training quantization, through the service's own preprocessing.

The quantizer learns each tensor's range from these samples, so they must look exactly
like what the service will feed: the same decode, crop, resize (app.imaging) and the same
normalisation `real = (pixel - mean) / std` from model.json.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from app.imaging.decoding import decode
from app.imaging.geometry import to_pixels
from app.model_dir.schema import InputSpec

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
MAX_CALIBRATION_PIXELS = 100_000_000


class CalibrationError(Exception):
    pass


def image_files(folder: Path) -> list[Path]:
    """Image files below folder (recursive), sorted so calibration is reproducible."""
    files = sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise CalibrationError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) found below {folder}")
    return files


def pixels_from_source(source: Path, spec: InputSpec, limit: int | None = None) -> Iterator[np.ndarray]:
    """uint8 HxWxC pixels from a folder of images or an .npy/.npz array of N pixel images."""
    source = Path(source)
    if source.is_dir():
        for path in image_files(source)[:limit]:
            yield to_pixels(decode(path.read_bytes(), spec, MAX_CALIBRATION_PIXELS), spec)
    elif source.suffix in (".npy", ".npz"):
        yield from _pixels_from_array(source, spec, limit)
    else:
        raise CalibrationError(f"calibration data must be a folder of images or an .npy/.npz file, got {source}")


def _pixels_from_array(path: Path, spec: InputSpec, limit: int | None) -> Iterator[np.ndarray]:
    loaded = np.load(path)
    array = loaded[loaded.files[0]] if isinstance(loaded, np.lib.npyio.NpzFile) else loaded
    if array.ndim == 3 and spec.channels == 1:
        array = array[..., None]
    expected = (spec.height, spec.width, spec.channels)
    if array.ndim != 4 or array.shape[1:] != expected or array.dtype != np.uint8:
        raise CalibrationError(
            f"{path}: expected uint8 pixels of shape (N, {', '.join(map(str, expected))}), "
            f"got {array.dtype} {array.shape}"
        )
    yield from array[:limit]


def normalise(pixels: np.ndarray, spec: InputSpec) -> np.ndarray:
    """uint8 HxWxC -> float32 (1, H, W, C): real = (pixel - mean) / std, the float model's input."""
    mean = np.asarray(spec.mean, np.float32)
    std = np.asarray(spec.std, np.float32)
    return ((pixels.astype(np.float32) - mean) / std)[None]


def with_progress(samples: Iterable[np.ndarray], total: int | None, label: str = "calibrating") -> Iterator[np.ndarray]:
    """Yield samples, reporting n/total on stderr (one line rewritten in place on a terminal)."""
    tty = sys.stderr.isatty()
    count = 0
    for count, sample in enumerate(samples, 1):
        if tty or count == total or count % 25 == 0:
            end = "\r" if tty and count != total else "\n"
            print(f"{label}: {count}/{total if total else '?'}", end=end, file=sys.stderr, flush=True)
        yield sample
    if count == 0:
        raise CalibrationError("the representative dataset is empty")
