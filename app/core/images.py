"""The image work of a request, off the event loop: decode (EXIF orientation, colour mode), crop or resize as
model.json says, quantize into the model's input tensor, on a few threads of its own. The core schedules it once the
request has its place in line (`ImageWork.prepare`) and hands the tensor in the making to the ticket (Ticket.run):
the image thread that makes it queues it in the pool's line at once, with no hop back through the event loop, and
the pool schedules no image work."""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import numpy as np

from app.errors import ServeError
from app.imaging.decoding import decode_with_source
from app.imaging.geometry import Geometry, to_pixels
from app.imaging.quantization import InputQuantizer
from app.pool import EnginePool
from app.registry import Ticket
from app.threads import lower_this_thread


@dataclass(frozen=True)
class Prepared:
    """What the image thread made besides the input tensor: its stages' times and where the input came from."""

    decode_ms: float
    preprocess_ms: float
    geometry: Geometry


class Preparing(Future):
    """The model's inputs (its one tensor, the image's) in the making on an image thread, whose callbacks run on that
    thread; once they are made, `prepared` says what preprocessing made besides."""

    prepared: Prepared | None = None


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

    def prepare(self, data: bytes, ticket: Ticket) -> Preparing:
        """Decode and preprocess on an image thread, for a request that holds its place in line: the model's inputs
        in the making, for the ticket to run (Ticket.run). Cancelled before its thread comes to it (its request gave
        up), it costs no decoding; one whose place waited too long (Ticket.overdue: an overloaded line's bound by
        time, the wait deadline) is refused (Busy) without it."""
        preparing = Preparing()
        self._executor.submit(self._make, preparing, data, ticket)
        return preparing

    def _make(self, preparing: Preparing, data: bytes, ticket: Ticket) -> None:
        """On an image thread: the input tensor, or why not, into `preparing` (whose callbacks run here)."""
        if not preparing.set_running_or_notify_cancel():  # cancelled while this thread was busy with others
            return
        try:
            late = ticket.overdue()
            if late is not None:
                raise late
            tensor, preparing.prepared = self._prepare(data, ticket)
        except ServeError as e:  # a bad image, a place that waited too long: the request's error, without its frames
            # (they hold the body, the ticket and this future: a cycle that kept each refused body until a full
            # collection, issue 42's DOODS bodies)
            preparing.set_exception(e.alone())
        except Exception as e:  # a fault of ours: its frames kept for the log
            preparing.set_exception(e)
        else:
            preparing.set_result([tensor])  # the model's one input: the image

    def _prepare(self, data: bytes, ticket: Ticket) -> tuple[np.ndarray, Prepared]:
        spec = ticket.model_dir.manifest.input
        start = time.perf_counter()
        image, source = decode_with_source(data, spec, self.max_pixels, **self.decode_options)
        decoded = time.perf_counter()
        tensor = self.quantizer(ticket)(to_pixels(image, spec, (source.width, source.height)))
        geometry = Geometry.of(source, image.size, spec)
        prepared = Prepared((decoded - start) * 1000, (time.perf_counter() - decoded) * 1000, geometry)
        return tensor, prepared  # the model's one input: the image

    def quantizer(self, ticket: Ticket) -> InputQuantizer:
        """The quantizer of the ticket pool's image input (the registry checked at load that it takes one)."""
        quantizer = self._quantizers.get(ticket.pool)
        if quantizer is None:  # two image threads may both make it: the same table, kept once
            image = ticket.input
            quantizer = InputQuantizer(ticket.model_dir.manifest.input, image.dtype, image.scale, image.zero_point)
            self._quantizers[ticket.pool] = quantizer
        return quantizer

    def close(self) -> None:
        self._executor.shutdown(wait=False)
