"""A segmented model served as a pipeline: segment i on device i (or interpreter i), queues between.

    request -> [queue 0] -> stage 0 (segment 0) -> [queue 1] -> stage 1 -> ... -> stage K-1 -> answer

Each stage is one interpreter on its own thread. All of a segment's outputs go on to the next
segment, each to the input of the same tensor name (matched once, at load). The queues between
stages are bounded (a slow stage holds up the ones before it instead of letting inputs pile up),
and each stage takes its inputs first come, first served, so every request's tensors flow through
the segments in order and K requests are worked on at once, one per segment: the pipeline runs at
the pace of its slowest segment, not at the sum of them.

A Pipeline is one kind of pool member (app/pool/member.py): the pool gives it `lanes` threads, so up
to `lanes` requests are in it at once, and admission, the bounded line, deadlines, warm-up and the
watchdog are the pool's. Each run gives its per-segment invoke times back with its outputs
(RunResult.segments_ms); they also go to the `segment_seconds` histogram.

A lost device (an invoke that outlives the watchdog, as a USB Accelerator does until it resets):
the pool's watchdog asks which segment hung (`stalled`), takes the pipeline out of the pool, and
every request in it gets DeviceHung (503; `lose`); that segment alone is re-created on its device,
in place (`renew`), the others staying loaded. The hung invoke cannot be killed: its thread is a
daemon and closes its interpreter if the invoke ever returns.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from app import metrics
from app.engines.base import Engine, EngineOptions
from app.errors import DeviceHung, EngineLoadError, ServeError
from app.pool.member import Member, Stage
from app.settings import default
from app.threads import lower_this_thread

if TYPE_CHECKING:
    from app.engines.base import Backend

log = logging.getLogger(__name__)

# For pipelines built without settings (tests): PIPELINE_QUEUE_DEPTH, PIPELINE_LANES_PER_SEGMENT.
QUEUE_DEPTH = default("pipeline_queue_depth")  # inputs waiting between two stages: keeps the next stage fed
LANES_PER_SEGMENT = default("pipeline_lanes_per_segment")  # requests inside per segment: one in each stage, one queued
_STOP = object()


@dataclass
class _Ticket:
    """One request's tensors on their way through the stages, and its answer."""

    inputs: list[np.ndarray]  # what the next stage takes
    generation: int
    done: threading.Event = field(default_factory=threading.Event)
    outputs: list[np.ndarray] | None = None
    error: BaseException | None = None
    segments_ms: list[float] = field(default_factory=list)

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()


@dataclass(eq=False)
class _Segment:
    """One stage in service: its thread, and the invoke under way."""

    stage: Stage
    thread: threading.Thread | None = field(default=None, repr=False)
    invoking_since: float | None = None  # the pipeline's clock at the start of the invoke under way
    current: _Ticket | None = field(default=None, repr=False)


def feeds(a: Engine, b: Engine, index: int) -> list[int]:
    """For each input of segment index+1 (b), the output of segment `index` (a) that feeds it: the one
    of the same name, or, with one tensor each way, that one; shapes and types must agree, and every
    output must go on (a model output from a middle segment would be lost)."""
    by_name = {spec.name: i for i, spec in enumerate(a.outputs)}
    order = []
    for spec in b.inputs:
        i = by_name.get(spec.name, 0 if len(a.outputs) == len(b.inputs) == 1 else None)
        if i is None:
            raise EngineLoadError(f"segment {index + 1} takes tensor {spec.name!r}, which segment {index} does "
                                  f"not give (it gives {[s.name for s in a.outputs]})")
        given = a.outputs[i]
        if (given.shape, given.dtype) != (spec.shape, spec.dtype):
            raise EngineLoadError(f"segment {index} outputs {given.name!r} {given.shape} {given.dtype}, segment "
                                  f"{index + 1} takes {spec.name!r} {spec.shape} {spec.dtype}")
        order.append(i)
    unused = [a.outputs[i].name for i in range(len(a.outputs)) if i not in order]
    if unused:
        raise EngineLoadError(f"segment {index} gives {unused}, which segment {index + 1} does not take")
    return order


class Pipeline(Member):
    """K stages with bounded queues between: a pool member taking `lanes` requests at once."""

    repaired_in_place = True
    invokes_on_lane = False  # each segment on threads of its own, below the loop's priority for good (thread_nice)

    def __init__(self, label: str, stages: list[Stage], *, lanes_per_segment: int = LANES_PER_SEGMENT,
                 queue_depth: int = QUEUE_DEPTH, metric_labels: tuple[str, str] | None = None, thread_nice: int = 0,
                 retry_after_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        super().__init__(stages, lanes_per_segment * len(stages))
        self.label = label
        # between stage i and i+1: which of stage i's outputs is each input of stage i+1
        self._feeds = [feeds(a.engine, b.engine, i) for i, (a, b) in enumerate(zip(stages, stages[1:]))]
        self.retry_after_s = retry_after_s
        self.thread_nice = thread_nice  # for stages that compute on the host's cores, as the pool's threads
        self.clock = clock  # the pool's: stalled() compares its stages' invoke times with the pool's deadlines
        self._histograms = metrics.segment_histograms(*metric_labels, len(stages)) if metric_labels else None
        # queue 0 holds every lane's input (never blocks); the ones between stages are short
        self._queues = [queue.Queue(maxsize=self.lanes)] + [queue.Queue(maxsize=queue_depth) for _ in stages[1:]]
        self._lock = threading.Lock()
        self._generation = 0      # +1 when a stage is lost: tickets of an older one are failed, not run
        self._lost: set[int] = set()         # segments the watchdog took out, not yet re-created
        self._lost_error: ServeError | None = None  # what the requests of an older generation are failed with
        self._closed = threading.Event()
        self._segments = [_Segment(stage) for stage in stages]
        for segment in self._segments:
            self._start(segment)

    def _start(self, segment: _Segment) -> None:
        segment.thread = threading.Thread(target=self._serve, args=(segment,), daemon=True,
                                          name=f"pipeline-{self.label}-{segment.stage.index}")
        segment.thread.start()

    @property
    def where(self) -> str:
        return "pipeline"

    def describe(self, stages: Sequence[Stage]) -> str:
        return ", ".join(f"segment {s.index} on {s.device or 'its interpreter'}" for s in stages) + " "

    # -- the request's side (one of the pool's lanes) -----------------------------------------

    def invoke(self, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[float]]:
        with self._lock:
            if self._lost:
                raise self._lost_error
            if self._closed.is_set():
                raise DeviceHung(f"{self.label}: closed", self.retry_after_s)
            ticket = _Ticket(list(inputs), self._generation)
        self._queues[0].put(ticket)  # room for every lane: never blocks
        ticket.done.wait()  # bounded by the pool's watchdog, which fails it if a stage hangs (lose)
        if ticket.error is not None:
            raise ticket.error
        return ticket.outputs, ticket.segments_ms

    # -- the watchdog's side ------------------------------------------------------------------

    def stalled(self, now: float, limit_s: float) -> list[Stage]:
        return [s.stage for s in list(self._segments)
                if s.invoking_since is not None and now - s.invoking_since >= limit_s]

    def lose(self, stages: Sequence[Stage], error: ServeError) -> None:
        """Those segments are out: fail every request in the pipeline, and refuse new ones until renew()."""
        with self._lock:
            self._lost.update(stage.index for stage in stages)
            # the error first: a stage that sees the new generation fails older tickets with it
            self._lost_error = error
            self._generation += 1
        log.error("%s: %s", self.label, error)
        for s in self._segments:
            if s.current is not None:
                s.current.fail(error)
        for q in self._queues:  # inputs waiting anywhere: failed now (a stage blocked on a full queue moves on)
            stop = False
            while True:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Ticket):
                    item.fail(error)
                stop = stop or item is _STOP
            if stop:  # closed meanwhile: its stage must still stop
                q.put(_STOP)

    def renew(self, load: Callable[[Stage], Stage]) -> Pipeline:
        """The lost segments loaded again, in place: the others keep their interpreters and threads."""
        for index in sorted(self._lost):
            fresh = load(self._segments[index].stage)  # raises while the device is still resetting: retried
            with self._lock:
                if self._closed.is_set():
                    fresh.engine.close()
                    raise DeviceHung(f"{self.label}: closed while segment {index} was re-created", self.retry_after_s)
                segment = self._segments[index] = _Segment(fresh)
                self.stages[index] = fresh
                self._lost.discard(index)
                self._start(segment)
            log.info("%s: segment %d re-created", self.label, index)
        return self

    # -- the stages' side ------------------------------------------------------------------------

    def _serve(self, segment: _Segment) -> None:
        lower_this_thread(self.thread_nice)
        index = segment.stage.index
        engine = segment.stage.engine
        inbox = self._queues[index]
        last = index == len(self._segments) - 1
        while True:
            ticket = inbox.get()
            if ticket is _STOP or self._segments[index] is not segment:
                if ticket is not _STOP and isinstance(ticket, _Ticket):
                    inbox.put(ticket)  # replaced while it waited: the new stage's thread takes it
                break
            if ticket.generation != self._generation or ticket.done.is_set():
                ticket.fail(self._lost_error)  # from before a stage was lost: failed, not run
                continue
            # `current` from here until the ticket is handed on: a stage lost meanwhile fails it
            segment.current = ticket
            segment.invoking_since = start = self.clock()
            try:
                outputs = engine.run(ticket.inputs)
            except Exception as e:
                segment.invoking_since, segment.current = None, None
                ticket.fail(e)
                continue
            ms = (self.clock() - start) * 1000
            segment.invoking_since = None
            if self._segments[index] is not segment:  # it was lost and replaced while this invoke hung
                break
            ticket.segments_ms.append(ms)
            if self._histograms:
                self._histograms[index].observe(ms / 1000)
            if last:
                ticket.outputs = outputs
                ticket.done.set()
            else:
                ticket.inputs = [outputs[i] for i in self._feeds[index]]
                self._queues[index + 1].put(ticket)  # waits while the next stage is behind
            segment.current = None
        engine.close()

    def close(self) -> None:
        """Stop every stage after the inputs queued before now; a hung one closes when it returns."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        for q in self._queues:
            q.put(_STOP)


def stage_options(plugin: Backend, count: int) -> list[EngineOptions]:
    """Segment i's interpreter options: device i for a device backend (one accelerator per
    segment), the backend's usual options for one that computes on the host's cores."""
    options = plugin.interpreters()
    if plugin.host_cpu:
        return [options[0]] * count
    if len(options) < count:
        raise EngineLoadError(f"{plugin.key}: a model in {count} segments needs {count} devices, "
                              f"{len(options)} found: add devices or segment it into fewer parts")
    return options[:count]
