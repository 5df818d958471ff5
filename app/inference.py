"""The task-neutral core of a request: bytes -> pixels -> tensor -> the leased pool -> every output
tensor, timed stage by stage. What the outputs mean is the task's (app/tasks/).

Every front door calls it the same way: `async with registry.lease(model, backend, counted(request)) as lease:`
first (a 503 at once if the line is full), then read the body, then `run_image` (or, for a tensor
protocol, `run_tensor`), then the task's reading of the outputs (app/api/classify.py `classify`,
app/api/detect.py `detect`, app/api/v2/infer.py: the task's named outputs). The run through the
lease takes the request's place in line (`Lease.admit()`) before the image is decoded. An input's
work ends with `finish()`: the timings, observed in /metrics.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from weakref import WeakKeyDictionary

import numpy as np

from app import metrics
from app.errors import RequestError
from app.imaging.decoding import decode_with_source
from app.imaging.geometry import Geometry, to_pixels
from app.imaging.quantization import InputQuantizer
from app.pool import EnginePool, RunResult
from app.registry import Lease
from app.threads import lower_this_thread


@dataclass(frozen=True)
class Ran:
    """One input through the leased model: every output tensor, in the model's order, and its stages."""

    outputs: list[np.ndarray]
    stages_ms: dict[str, float]  # decode and preprocess (an image input), queue, inference
    segments_ms: list[float] | None  # a pipelined model: each segment's invoke, in order
    cold: bool
    started: float  # time.perf_counter() when the work on this input began
    geometry: Geometry | None = None  # an image input: where the model's input came from in the original


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
        self.decode_options = decode_options  # app/imaging/decoding.py decode's max_decoded_pixels, accept_damaged
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="image", initializer=lower_this_thread,
                                            initargs=(nice,))
        # pool -> the quantizer of its image input (model.json's normalisation, the input tensor's scale and zero
        # point): made at the pool's first image, dropped with the pool (a reload makes new pools)
        self._quantizers: WeakKeyDictionary[EnginePool, InputQuantizer] = WeakKeyDictionary()

    async def run(self, data: bytes, lease: Lease) -> tuple[RunResult, float, float, Geometry]:
        """Decode and preprocess on an image thread, which hands the tensor straight to the lease's
        pool (no hop back through the event loop in between); the result, decode ms, preprocess ms,
        and the geometry preprocessing used (for answers in the original image's pixels)."""
        result, (decode_ms, preprocess_ms, geometry) = await lease.run_after(partial(self._prepare, data, lease),
                                                                             self._executor)
        return result, decode_ms, preprocess_ms, geometry

    def _prepare(self, data: bytes, lease: Lease) -> tuple[list[np.ndarray], tuple[float, float, Geometry]]:
        """On an image thread: the model's one input (the image), and decode ms, preprocess ms, geometry."""
        spec = lease.model_dir.manifest.input
        start = time.perf_counter()
        image, source = decode_with_source(data, spec, self.max_pixels, **self.decode_options)
        decoded = time.perf_counter()
        tensor = self.quantizer(lease)(to_pixels(image, spec))
        geometry = Geometry.of(source, image.size, spec)
        return [tensor], ((decoded - start) * 1000, (time.perf_counter() - decoded) * 1000, geometry)

    def quantizer(self, lease: Lease) -> InputQuantizer:
        """The quantizer of the leased pool's image input (the registry checked at load that it takes one)."""
        quantizer = self._quantizers.get(lease.pool)
        if quantizer is None:  # two image threads may both make it: the same table, kept once
            image = lease.input
            quantizer = InputQuantizer(lease.model_dir.manifest.input, image.dtype, image.scale, image.zero_point)
            self._quantizers[lease.pool] = quantizer
        return quantizer

    def close(self) -> None:
        self._executor.shutdown(wait=False)


async def run_image(lease: Lease, data: bytes, images: ImageWork) -> Ran:
    """An encoded image (JPEG, PNG, ...) through the leased model: decoded, preprocessed, run."""
    start = time.perf_counter()
    result, decode_ms, preprocess_ms, geometry = await images.run(data, lease)
    return _ran(result, start, {"decode": decode_ms, "preprocess": preprocess_ms}, geometry)


async def run_tensor(lease: Lease, tensor: np.ndarray) -> Ran:
    """A tensor already in the model's input form ([1, H, W, C] of its input dtype) through the leased model."""
    start = time.perf_counter()
    spec = lease.input
    if tuple(tensor.shape) != tuple(spec.shape) or tensor.dtype != spec.dtype:
        raise RequestError(f"model {lease.model_dir.name!r} on {lease.backend!r} takes a {spec.dtype.name} tensor "
                           f"of shape {list(spec.shape)}, got {tensor.dtype.name} {list(tensor.shape)}")
    # no decode or preprocess stage: none is timed (a zero would skew those histograms)
    return _ran(await lease.run([np.ascontiguousarray(tensor)]), start, {})


def _ran(result: RunResult, start: float, stages_ms: dict[str, float], geometry: Geometry | None = None) -> Ran:
    stages_ms["queue"], stages_ms["inference"] = result.queue_ms, result.inference_ms
    return Ran(result.outputs, stages_ms, result.segments_ms, result.cold, start, geometry)


def finish(lease: Lease, ran: Ran, postprocess_start: float | None = None) -> dict[str, float]:
    """The end of one input's work: its timings in ms (the stages, the task's post-processing from
    `postprocess_start`, the total, each segment's invoke), observed in /metrics."""
    end = time.perf_counter()
    timing_ms = dict(ran.stages_ms)
    if postprocess_start is not None:
        timing_ms["postprocess"] = (end - postprocess_start) * 1000
    timing_ms["total"] = (end - ran.started) * 1000
    if ran.segments_ms is not None:
        timing_ms["segments"] = ran.segments_ms
    metrics.observe_input(lease.model_dir.name, lease.backend, timing_ms, ran.cold)
    return timing_ms
