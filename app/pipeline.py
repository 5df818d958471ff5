"""A segmented model served as a pipeline: segment i on device i (or interpreter i), queues between.

    request -> [queue 0] -> stage 0 (segment 0) -> [queue 1] -> stage 1 -> ... -> stage K-1 -> answer

Each stage is one interpreter on its own thread. The queues between stages are bounded (a
slow stage holds up the ones before it instead of letting inputs pile up), and each stage
takes its inputs first come, first served, so every request's tensors flow through the
segments in order and K requests are worked on at once, one per segment: the pipeline runs
at the pace of its slowest segment, not at the sum of them.

It sits inside the registry's pool and lease machinery: `pipeline_members()` gives the pool
`lanes` members (PipelineLane engines) that all feed the one Pipeline, so admission, the
bounded line, deadlines and warm-up are the pool's, and up to `lanes` requests are in the
pipeline at once. Each lane's last run leaves its per-segment invoke times in
`last_segments_ms` for the response; they also go to the `segment_seconds` histogram.

A lost device (an invoke that outlives the hang limit, as a USB Accelerator does until it
resets) is handled like the pool's watchdog: every request in the pipeline then gets
DeviceHung (503; InvokeTimeout, 504, on backends without a watchdog), the stage's
interpreter is re-created on the same device by a background thread until that works, and
meanwhile new requests are refused at once. The hung invoke cannot be killed: its thread is
a daemon and closes its interpreter if the invoke ever returns.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import Histogram

from app.engines.base import Engine, EngineOptions
from app.errors import DeviceHung, EngineLoadError, InvokeTimeout, ServeError
from app.metrics import LATENCY_BUCKETS, PREFIX
from app.threads import lower_this_thread

if TYPE_CHECKING:
    from app.engines.base import Backend
    from app.model_dir import ModelDir
    from app.pool import Member
    from app.settings import Settings

log = logging.getLogger(__name__)

SEGMENT_SECONDS = Histogram(f"{PREFIX}_segment_seconds",
                            "Pipelined (segmented) models: the invoke of one segment, by segment index",
                            ("model", "backend", "segment"), buckets=LATENCY_BUCKETS)
QUEUE_DEPTH = 1        # inputs waiting between two stages: enough to keep the next stage fed
LANES_PER_SEGMENT = 2  # requests in the pipeline at once, per segment: one in each stage and one queued
_STOP = object()


@dataclass
class _Ticket:
    """One request's tensor on its way through the stages, and its answer."""

    x: np.ndarray
    generation: int
    done: threading.Event = field(default_factory=threading.Event)
    output: np.ndarray | None = None
    error: BaseException | None = None
    segments_ms: list[float] = field(default_factory=list)

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()


@dataclass
class Stage:
    """One segment's interpreter and the thread that runs it."""

    index: int
    engine: Engine
    options: EngineOptions
    device: str | None = None
    load_ms: float = 0.0
    thread: threading.Thread | None = field(default=None, repr=False)
    invoking_since: float | None = None  # monotonic start of the invoke under way
    current: _Ticket | None = field(default=None, repr=False)


@dataclass(frozen=True)
class PipelineResult:
    output: np.ndarray
    segments_ms: list[float]


class Pipeline:
    """K stages with bounded queues between; `run(x)` blocks until x has gone through all of them."""

    def __init__(self, label: str, stages: list[Stage], *, hang_timeout_s: float, hang_error: type[ServeError],
                 recreate: Callable[[Stage], Stage] | None = None, retry_s: float = 2.0, retry_after_s: float = 1.0,
                 queue_depth: int = QUEUE_DEPTH, lanes: int | None = None, metric_labels: tuple[str, str] | None = None,
                 thread_nice: int = 0):
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        self.label = label
        self.stages = stages
        self.hang_timeout_s = hang_timeout_s
        self.hang_error = hang_error
        self.recreate = recreate
        self.retry_s = retry_s
        self.retry_after_s = retry_after_s
        self.lanes = lanes or LANES_PER_SEGMENT * len(stages)
        self.thread_nice = thread_nice  # for stages that compute on the host's cores, as the pool's threads
        self._histograms = ([SEGMENT_SECONDS.labels(*metric_labels, str(i)) for i in range(len(stages))]
                            if metric_labels else None)
        # queue 0 holds every lane's input (never blocks); the ones between stages are short
        self._queues = [queue.Queue(maxsize=self.lanes)] + [queue.Queue(maxsize=queue_depth)
                                                           for _ in stages[1:]]
        self._lock = threading.Lock()
        self._generation = 0     # +1 when a stage is lost: tickets of an older one are failed, not run
        self.problem: str | None = None  # why it refuses requests now (a stage lost, being re-created)
        self._lost: ServeError | None = None  # what the requests of an older generation are failed with
        self.recovered = threading.Condition(self._lock)  # notified when a lost stage is back (tests)
        self._closed = threading.Event()
        self._open_lanes = 0
        for stage in stages:
            self._start(stage)

    @property
    def healthy(self) -> bool:
        return self.problem is None

    def _start(self, stage: Stage) -> None:
        stage.thread = threading.Thread(target=self._serve, args=(stage,), daemon=True,
                                        name=f"pipeline-{self.label}-{stage.index}")
        stage.thread.start()

    # -- the request's side (a pool member's thread) -------------------------------------------

    def run(self, x: np.ndarray) -> PipelineResult:
        with self._lock:
            if self.problem is not None:
                raise self.hang_error(f"{self.label}: {self.problem}", self.retry_after_s)
            if self._closed.is_set():
                raise DeviceHung(f"{self.label}: closed", self.retry_after_s)
            ticket = _Ticket(x, self._generation)
        self._queues[0].put(ticket)  # room for every lane: never blocks
        while not ticket.done.wait(self.hang_timeout_s / 4):
            self._check_hangs()
        if ticket.error is not None:
            raise ticket.error
        return PipelineResult(ticket.output, ticket.segments_ms)

    def _check_hangs(self) -> None:
        now = time.monotonic()
        for stage in list(self.stages):
            since = stage.invoking_since
            if since is not None and now - since > self.hang_timeout_s:
                self._lose(stage, f"segment {stage.index} on {stage.device or 'its interpreter'} did not finish "
                                  f"an invoke within {self.hang_timeout_s} s")

    def _lose(self, stage: Stage, problem: str) -> None:
        """Fail every request in the pipeline, refuse new ones, re-create the stage in the background."""
        with self._lock:
            if self.stages[stage.index] is not stage or self.problem is not None:
                return  # already being handled
            self.problem = f"{problem}; it is re-created"
            # the error first: a stage that sees the new generation fails older tickets with it
            error = self._lost = self.hang_error(f"{self.label}: {self.problem}", self.retry_after_s)
            self._generation += 1
        log.error("%s: %s", self.label, self.problem)
        for s in self.stages:
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
        threading.Thread(target=self._recover, args=(stage,), name=f"recover-{self.label}", daemon=True).start()

    def _recover(self, old: Stage) -> None:
        attempt = 0
        while not self._closed.is_set():
            attempt += 1
            try:
                if self.recreate is None:
                    raise EngineLoadError("no way to re-create it")
                fresh = self.recreate(old)
            except Exception as e:  # the device may still be resetting
                with self._lock:
                    self.problem = (f"segment {old.index} lost; re-creating it failed (attempt {attempt}: {e}); "
                                    f"retrying in {self.retry_s} s")
                log.warning("%s: %s", self.label, self.problem)
                self._closed.wait(self.retry_s)
                continue
            with self._lock:
                if self._closed.is_set():
                    fresh.engine.close()
                    return
                self.stages[old.index] = fresh
                self._start(fresh)
                self.problem = None
                self.recovered.notify_all()
            log.info("%s: segment %d re-created after a hang (attempt %d)", self.label, old.index, attempt)
            return

    # -- the stages' side --------------------------------------------------------------------------

    def _serve(self, stage: Stage) -> None:
        lower_this_thread(self.thread_nice)
        inbox = self._queues[stage.index]
        last = stage.index == len(self.stages) - 1
        while True:
            ticket = inbox.get()
            if ticket is _STOP or self.stages[stage.index] is not stage:
                if ticket is not _STOP and isinstance(ticket, _Ticket):
                    inbox.put(ticket)  # replaced while it waited: the new stage's thread takes it
                break
            if ticket.generation != self._generation or ticket.done.is_set():
                ticket.fail(self._lost)  # from before a stage was lost: failed, not run
                continue
            # `current` from here until the ticket is handed on: a stage lost meanwhile fails it
            stage.current = ticket
            stage.invoking_since = start = time.monotonic()
            try:
                y = stage.engine.run(ticket.x)
            except Exception as e:
                stage.invoking_since, stage.current = None, None
                ticket.fail(e)
                continue
            ms = (time.monotonic() - start) * 1000
            stage.invoking_since = None
            if self.stages[stage.index] is not stage:  # it was lost and replaced while this invoke hung
                break
            ticket.segments_ms.append(ms)
            if self._histograms:
                self._histograms[stage.index].observe(ms / 1000)
            if last:
                ticket.output = y
                ticket.done.set()
            else:
                ticket.x = y
                self._queues[stage.index + 1].put(ticket)  # waits while the next stage is behind
            stage.current = None
        stage.engine.close()

    # -- lanes and the end ---------------------------------------------------------------------------

    def lane(self) -> PipelineLane:
        with self._lock:
            self._open_lanes += 1
        return PipelineLane(self)

    def _lane_closed(self) -> None:
        with self._lock:
            self._open_lanes -= 1
            last = self._open_lanes == 0
        if last:
            self.close()

    def close(self) -> None:
        """Stop every stage after the inputs queued before now; a hung one closes when it returns."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            self.recovered.notify_all()
        self._queues[0].put(_STOP)
        for q in self._queues[1:]:
            q.put(_STOP)

    def wait_recovered(self, timeout_s: float) -> bool:
        with self.recovered:
            return self.recovered.wait_for(lambda: self.problem is None, timeout_s)


class PipelineLane(Engine):
    """One pool member's way into the pipeline: an Engine whose run() is the whole pipeline."""

    key = "pipeline"
    model_file = "segments"

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self.input = pipeline.stages[0].engine.input
        self.output = pipeline.stages[-1].engine.output
        self.last_segments_ms: list[float] | None = None
        self._closed = False

    @classmethod
    def load(cls, path: Path, options: EngineOptions) -> PipelineLane:
        raise EngineLoadError("a pipeline lane is made by app.pipeline.pipeline_members, not loaded from a file")

    @property
    def problem(self) -> str | None:
        """Why the pipeline refuses requests now (a segment lost and being re-created), for readiness."""
        return self.pipeline.problem

    def run(self, x: np.ndarray) -> np.ndarray:
        result = self.pipeline.run(x)
        self.last_segments_ms = result.segments_ms
        return result.output

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.pipeline._lane_closed()


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


def pipeline_members(plugin: Backend, model_dir: ModelDir, settings: Settings, watched: bool) -> list[Member]:
    """The pool members of a segmented model on `plugin`: lanes into one new Pipeline."""
    from app.pool import Member

    paths = model_dir.segment_files(plugin.model_file)
    stages: list[Stage] = []
    try:
        for i, (path, options) in enumerate(zip(paths, stage_options(plugin, len(paths)))):
            stages.append(_load_stage(plugin, i, path, options))
    except BaseException:
        for stage in stages:
            stage.engine.close()
        raise
    for a, b in zip(stages, stages[1:]):
        if (a.engine.output.shape, a.engine.output.dtype) != (b.engine.input.shape, b.engine.input.dtype):
            for stage in stages:
                stage.engine.close()
            raise EngineLoadError(f"{model_dir.name}: segment {a.index} outputs {a.engine.output.shape} "
                                  f"{a.engine.output.dtype}, segment {b.index} takes {b.engine.input.shape} "
                                  f"{b.engine.input.dtype}")
    pipeline = Pipeline(
        f"{model_dir.name}/{plugin.key}", stages,
        hang_timeout_s=settings.watchdog_timeout_s if watched else settings.invoke_timeout_s,
        hang_error=DeviceHung if watched else InvokeTimeout,
        recreate=lambda old: _load_stage(plugin, old.index, paths[old.index], plugin.reopen(old.options)),
        retry_s=settings.watchdog_retry_s, retry_after_s=settings.retry_after_s,
        metric_labels=(model_dir.name, plugin.key), thread_nice=settings.compute_nice if plugin.host_cpu else 0)
    devices = ",".join(s.device for s in stages if s.device) or None
    load_ms = sum(s.load_ms for s in stages)
    return [Member(pipeline.lane(), load_ms if i == 0 else 0.0, device=devices) for i in range(pipeline.lanes)]


def _load_stage(plugin: Backend, index: int, path: Path, options: EngineOptions) -> Stage:
    start = time.perf_counter()
    engine = plugin.load(path, options)
    return Stage(index, engine, options, plugin.device(options), (time.perf_counter() - start) * 1000)
