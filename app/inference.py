"""The classification core: bytes -> pixels -> tensor -> engine -> top-k, timed stage by stage.

Every front door (the native REST API, the Open Inference Protocol) calls it the same way:
`async with registry.lease(model, backend) as lease:` first (a 503 at once if the line is
full), then read the body, then `await classify(lease, data, ...)`, whose run through the lease
takes the request's place in line (`Lease.admit()`) before the image is decoded.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from app import metrics
from app.errors import RequestError
from app.imaging import decode, to_pixels
from app.model_dir import ModelDir
from app.pool import RunResult
from app.registry import Lease
from app.threads import lower_this_thread


@dataclass(frozen=True)
class Prediction:
    index: int
    label: str
    score: float


@dataclass(frozen=True)
class Classification:
    model: str
    backend: str
    predictions: list[Prediction]
    timing_ms: dict[str, float]
    warmup: dict[str, float | None]
    cold: bool


def image_threads(setting: int | None, host_cpu: bool, cores: int | None = None) -> int:
    """The image threads: as set, else the cores the interpreters leave free. A TPU leaves all of
    them (simulated 2.5 ms device, 640x427 JPEGs, 2 cores: one image thread caps the service at
    1 / ~4.5 ms of decode + resize, about half the device's rate); CPU interpreters take about half."""
    if setting is not None:
        return setting
    cores = cores or os.cpu_count() or 1
    return max(1, cores // 2) if host_cpu else cores


class ImageWork:
    """Decoding and resizing, off the event loop, on a few threads of its own.

    Not asyncio's default executor (cores + 4 threads): image work beyond the cores the
    interpreters leave free only preempts them (2 cores, one interpreter, concurrency 4:
    1 image thread gave 83-85% of the bare interpreter's throughput, 6 threads 81-82%), and
    each decode in flight holds a whole image (up to MAX_IMAGE_PIXELS), so the number of
    threads also bounds the memory that image work can take under load.
    """

    def __init__(self, threads: int, max_pixels: int, nice: int = 0, **decode_options):
        self.max_pixels = max_pixels
        self.decode_options = decode_options  # imaging.decode's max_decoded_pixels, accept_damaged
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="image", initializer=lower_this_thread,
                                            initargs=(nice,))

    async def run(self, data: bytes, lease: Lease) -> tuple[RunResult, float, float]:
        """Decode and preprocess on an image thread, which hands the tensor straight to the lease's
        pool (no hop back through the event loop in between); the result, decode ms, preprocess ms."""
        timings: list[float] = []

        def prepare() -> np.ndarray:
            tensor, decode_ms, preprocess_ms = self._prepare(data, lease)
            timings.extend((decode_ms, preprocess_ms))
            return tensor

        result = await lease.run_after(prepare, self._executor)
        return result, *timings

    def _prepare(self, data: bytes, lease: Lease):
        spec = lease.model_dir.manifest.input
        start = time.perf_counter()
        image = decode(data, spec, self.max_pixels, **self.decode_options)
        decoded = time.perf_counter()
        tensor = lease.quantizer(to_pixels(image, spec))
        return tensor, (decoded - start) * 1000, (time.perf_counter() - decoded) * 1000

    def close(self) -> None:
        self._executor.shutdown(wait=False)


async def classify(lease: Lease, data: bytes, top_k: int, threshold: float, images: ImageWork) -> Classification:
    """One image through the leased model version (its place in line taken before its decode)."""
    start = time.perf_counter()
    pool, model_dir = lease.pool, lease.model_dir
    result, decode_ms, preprocess_ms = await images.run(data, lease)
    post_start = time.perf_counter()
    output = pool.engine.output
    predictions = top_predictions(
        scores(result.output, output.scale, output.zero_point, model_dir), model_dir.labels, top_k, threshold)
    end = time.perf_counter()
    timing_ms = {
        "decode": decode_ms,
        "preprocess": preprocess_ms,
        "queue": result.queue_ms,
        "inference": result.inference_ms,
        "postprocess": (end - post_start) * 1000,
        "total": (end - start) * 1000,
    }
    if result.segments_ms is not None:  # a pipelined model: each segment's invoke, in order
        timing_ms["segments"] = result.segments_ms
    metrics.observe_input(model_dir.name, lease.backend, timing_ms, result.cold)
    return Classification(
        model=model_dir.name,
        backend=lease.backend,
        predictions=predictions,
        timing_ms=timing_ms,
        warmup={"load_ms": pool.load_ms, "first_inference_ms": pool.first_inference_ms},
        cold=result.cold,
    )


@dataclass(frozen=True)
class Scored:
    """One input run through a model: the output tensor as the model gave it, its scores
    (dequantized; softmax for logits), and the stage timings in ms."""
    output: np.ndarray
    scores: np.ndarray
    timing_ms: dict[str, float]
    cold: bool


async def score_image(lease: Lease, data: bytes, images: ImageWork) -> Scored:
    """An encoded image (JPEG, PNG, ...) -> Scored, preprocessed exactly as classify() does."""
    start = time.perf_counter()
    result, decode_ms, preprocess_ms = await images.run(data, lease)
    return _scored(lease, result, start, {"decode": decode_ms, "preprocess": preprocess_ms})


async def score_tensor(lease: Lease, tensor: np.ndarray) -> Scored:
    """A tensor already in the model's input form ([1, H, W, C] of its input dtype) -> Scored."""
    start = time.perf_counter()
    spec = lease.pool.engine.input
    if tuple(tensor.shape) != tuple(spec.shape) or tensor.dtype != spec.dtype:
        raise RequestError(f"model {lease.model_dir.name!r} on {lease.backend!r} takes a {spec.dtype.name} tensor "
                           f"of shape {list(spec.shape)}, got {tensor.dtype.name} {list(tensor.shape)}")
    # no decode or preprocess stage: none is timed (a zero would skew those histograms)
    return _scored(lease, await lease.run(np.ascontiguousarray(tensor)), start, {})


def _scored(lease: Lease, result: RunResult, start: float, timing_ms: dict[str, float]) -> Scored:
    output = lease.pool.engine.output
    values = scores(result.output, output.scale, output.zero_point, lease.model_dir)
    timing_ms = {**timing_ms, "queue": result.queue_ms, "inference": result.inference_ms,
                 "total": (time.perf_counter() - start) * 1000}
    if result.segments_ms is not None:  # a pipelined model: each segment's invoke, in order
        timing_ms["segments"] = result.segments_ms
    metrics.observe_input(lease.model_dir.name, lease.backend, timing_ms, result.cold)
    return Scored(result.output, values, timing_ms, result.cold)


def scores(output: np.ndarray, scale: float, zero_point: int, model_dir: ModelDir) -> np.ndarray:
    """Dequantize (real = scale * (q - zero_point)) and, for logits, softmax."""
    values = output.reshape(-1).astype(np.float64)
    if scale > 0:  # quantized output; a float output has scale 0
        values = (values - zero_point) * scale
    if model_dir.manifest.output.scores == "logits":
        values = np.exp(values - values.max())
        values /= values.sum()
    return values


def top_predictions(values: np.ndarray, labels: tuple[str, ...], top_k: int, threshold: float) -> list[Prediction]:
    """The k best scores at or above threshold; equal scores in class order."""
    order = top_order(values, top_k)
    # Python ints and floats at once: numpy scalars cost a microsecond each to index and compare
    return [
        Prediction(i, labels[i] if i < len(labels) else str(i), score)
        for i, score in zip(order.tolist(), values[order].tolist())
        if score >= threshold
    ]


def top_order(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, largest first, equal values in index order: the first k
    of a stable descending sort, without sorting all of them (1000 classes: a partition and a
    sort of k, about a fifth of the full sort's time)."""
    n = values.shape[0]
    if k >= n or not np.isfinite(values).all():  # NaN has no place in a partition: sort all
        return np.argsort(-values, kind="stable")[:k]
    kth = np.partition(values, n - k)[n - k]        # the k-th largest value
    candidates = np.flatnonzero(values >= kth)       # every value tied with it too, in index order
    return candidates[np.argsort(-values[candidates], kind="stable")][:k]
