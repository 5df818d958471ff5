"""One input through the ticket's model: its place in line, the input prepared (an image decoded and preprocessed
on an image thread, a tensor checked), the run (its task's `Outputs`: every output tensor, the input's geometry,
each stage's time), and the end of its work (its timings, observed in /metrics)."""

from __future__ import annotations

import asyncio
import time
from functools import lru_cache

import numpy as np

from app import metrics
from app.core.images import ImageWork
from app.core.inputs import Given, ImageInput
from app.errors import RequestError
from app.imaging.geometry import Geometry
from app.pool import RunResult
from app.registry import Ticket
from app.tasks import Outputs


async def run(ticket: Ticket, given: Given, images: ImageWork) -> Outputs:
    """The input through the ticket's model (Ticket.run, which takes the place in line if it is not yet): an image
    decoded and preprocessed on an image thread once its place is taken (Ticket.admit: before any work on it), its
    tensor queued by that thread the moment it is made; or a tensor checked against the model's input."""
    start = time.perf_counter()
    if isinstance(given, ImageInput):
        ticket.admit()
        preparing = images.prepare(given.data, ticket)
        try:
            result = await ticket.run(preparing)
        except BaseException:
            preparing.cancel()  # not begun yet (its request gave up, say): never decoded
            # The error is also in `preparing`, and this frame joins its traceback: without the name, no cycle keeps
            # the body alive until a full collection (issue 42's DOODS bodies)
            del preparing
            raise
        prepared = preparing.prepared
        return _outputs(ticket, result, start, {"decode": prepared.decode_ms, "preprocess": prepared.preprocess_ms},
                        prepared.geometry)
    spec = ticket.input
    tensor = given.tensor
    if tuple(tensor.shape) != tuple(spec.shape) or tensor.dtype != spec.dtype:
        raise RequestError(f"model {ticket.model!r} on {ticket.backend!r} takes a {spec.dtype.name} tensor "
                           f"of shape {list(spec.shape)}, got {tensor.dtype.name} {list(tensor.shape)}")
    geometry = _identity(spec.shape[2], spec.shape[1])
    # no decode or preprocess stage: none is timed (a zero would skew those histograms)
    return _outputs(ticket, await ticket.run(np.ascontiguousarray(tensor)), start, {}, geometry)


# A raw tensor's geometry, made once per input size
_identity = lru_cache(maxsize=64)(Geometry.identity)


def _outputs(ticket: Ticket, result: RunResult, start: float, stages_ms: dict[str, float],
             geometry: Geometry) -> Outputs:
    stages_ms["queue"], stages_ms["inference"] = result.queue_ms, result.inference_ms
    return Outputs(result.outputs, ticket.roles, ticket.model_dir, geometry, stages_ms, result.segments_ms,
                   result.cold, start)


def finish(ticket: Ticket, run: Outputs, postprocess_start: float | None = None) -> dict[str, float]:
    """The end of one input's work: its timings in ms (the stages, the task's post-processing from
    `postprocess_start`, the total, each segment's invoke), observed in /metrics once the event loop has run what it
    runs now: a door answers first (Prometheus' histograms took about 35 us of the loop's time before each answer
    at one client, cold, on 2 cores)."""
    end = time.perf_counter()
    timing_ms = dict(run.stages_ms)
    if postprocess_start is not None:
        timing_ms["postprocess"] = (end - postprocess_start) * 1000
    timing_ms["total"] = (end - run.started) * 1000
    if run.segments_ms is not None:
        timing_ms["segments"] = run.segments_ms
    asyncio.get_running_loop().call_soon(metrics.observe_input, ticket.model, ticket.backend, timing_ms, run.cold)
    return timing_ms
