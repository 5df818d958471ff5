"""Prometheus metrics: every metric of the core is defined here, what the core does and the state of models
and pools; a backend plug-in defines its own families in its own package (the Edge TPU's, in its metrics.py)
and hands them over at each scrape. docs/metrics.md lists them all.

Events (requests, stage latencies, cold starts, model loads, a pipeline's segment invokes) are counted by a
few calls from the core. Everything that is a state (queue depth, busy interpreters, warm-up times, model
states, and each backend plug-in's own gauges: its devices' health, temperature) is read from the registry
when Prometheus scrapes, by StateCollector, so nothing has to be kept in step by hand. Process metrics come
from prometheus_client's own collectors. Requests are counted by the middleware in app/api/metrics.py.

Several processes (app/processes): counters and histograms go to prometheus_client's multiprocess files
(`use_multiprocess`), summed over every worker, dead ones included (the requests they answered were
answered); the state gauges are read live from every worker at the scrape (app/processes/siblings.py) and
merged series by series, each family by its own rule (`merged_by`: sum by default; a model is ready only
where every worker serves it, `min`; the latest load, `max`; a count a process keeps itself, one series per
worker, `each`, labelled with its slot). Process metrics (process_*) are per process and left out there.

Label values are bounded: `model` and `backend` only ever take names the registry serves
(the request counter, app/api/metrics.py, is told them by the request's ticket once it has resolved the
model and backend, so a request refused from there on, a full line say, counts against that model),
requests that never reach a model are counted under model="", backend="" and task="". Unknown names in URLs create no series. `task` (the
model's task: classification, detection) follows from the model, so it adds no series of its own: it
lets a dashboard sum by task without listing the models of each.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client import multiprocess, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from app.errors import ServeError

log = logging.getLogger(__name__)
# No `_created` series: one more gauge per counter and histogram series that dashboards never read.
disable_created_metrics()

PREFIX = "edgetpu_serve"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# From a 35 us MNIST invoke to a 200 ms reference-kernel one, and cold starts of seconds.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STAGES = ("decode", "preprocess", "queue", "inference", "postprocess", "total")

REQUESTS = Counter(f"{PREFIX}_requests", "Inference requests answered, by protocol, task and HTTP status",
                   ("protocol", "task", "model", "backend", "status"))
STAGE_SECONDS = Histogram(f"{PREFIX}_stage_seconds",
                          "Time per stage of one input: decode, preprocess, queue (waiting for an interpreter), "
                          "inference (the invoke), postprocess (the task's work on the outputs), total",
                          ("task", "model", "backend", "stage"), buckets=LATENCY_BUCKETS)
COLD_STARTS = Counter(f"{PREFIX}_cold_starts", "Inputs that paid their interpreter's first inference",
                      ("model", "backend"))
MODEL_LOADS = Counter(f"{PREFIX}_model_loads", "Model loads and reloads, by result (ok or failed)",
                      ("model", "result"))
# Frigate's ZMQ door (app/frontdoors/zmq_door.py): each request it answers without running a model, by why (its
# requests are counted with the others, protocol="zmq", under the status an HTTP door would give the same fault)
ZMQ_REFUSALS = Counter(f"{PREFIX}_zmq_refusals", "Frigate ZMQ requests answered with zero rows or a refusal, by reason "
                       "(header, frames, size, shape, dtype, model_type, model, busy, not_ready, upload, ...)",
                       ("reason",))
# ... and each peer whose connection it closed, by why (not_allowed, connections, evicted, greeting_timeout, stalled,
# frames, frame_size, framing, greeting, handshake, ...)
ZMQ_DROPPED = Counter(f"{PREFIX}_zmq_dropped_peers", "Frigate ZMQ peers whose connection the door closed, by reason "
                      "(not_allowed, connections, evicted, greeting_timeout, stalled, frames, frame_size, framing, "
                      "greeting, ...)", ("reason",))
SEGMENT_SECONDS = Histogram(f"{PREFIX}_segment_seconds",
                            "Pipelined (segmented) models: the invoke of one segment, by segment index",
                            ("model", "backend", "segment"), buckets=LATENCY_BUCKETS)

# model -> its task (model.json), noted by the registry when it reads the model directory
_tasks: dict[str, str] = {}


def note_task(model: str, task: str) -> None:
    """The model's task, for the `task` label of its series (a reload that changes it starts new series)."""
    if _tasks.get(model) == task:
        return
    _tasks[model] = task
    for cached, position in ((_answers, 1), (_stage_histograms, 0)):
        for key in [key for key in cached if key[position] == model]:
            del cached[key]


# (model, backend) -> its stage histograms, in STAGES order (labels() ~3 us a call; see _answers)
_stage_histograms: dict[tuple[str, str], tuple] = {}


def observe_input(model: str, backend: str, timing_ms: dict[str, float], cold: bool) -> None:
    """One input through the core: its stage latencies (ms, as the core measures them)."""
    histograms = _stage_histograms.get((model, backend))
    if histograms is None:
        histograms = _stage_histograms[model, backend] = tuple(
            STAGE_SECONDS.labels(_tasks.get(model, ""), model, backend, stage) for stage in STAGES)
    for stage, histogram in zip(STAGES, histograms):
        value = timing_ms.get(stage)
        if value is not None:
            histogram.observe(value / 1000)
    if cold:
        COLD_STARTS.labels(model, backend).inc()


# (protocol, model, backend, status) -> its counter: labels() takes ~3 us a call, a dict lookup
# ~0.1; bounded as the label values are (module docstring)
_answers: dict[tuple[str, str, str, int], Counter] = {}


def answered(protocol: str, model: str, backend: str, status: int) -> None:
    """An inference request answered: by the application (app/api/metrics.py RequestCounter) or, refused
    from its head, by the HTTP server (app/api/shedding.py)."""
    key = (protocol, model, backend, status)
    counter = _answers.get(key)
    if counter is None:
        counter = _answers[key] = REQUESTS.labels(protocol, _tasks.get(model, ""), model, backend, str(status))
    counter.inc()


def zmq_refused(reason: str) -> None:
    """A ZMQ request refused: `reason` is one of the door's short labels (a bounded set)."""
    ZMQ_REFUSALS.labels(reason).inc()


def zmq_dropped(reason: str) -> None:
    """A ZMQ peer dropped: `reason` is one of the door's short labels (a bounded set)."""
    ZMQ_DROPPED.labels(reason).inc()


def model_loaded(model: str, ok: bool) -> None:
    MODEL_LOADS.labels(model, "ok" if ok else "failed").inc()


def segment_histograms(model: str, backend: str, segments: int) -> list:
    """A pipelined model's segment histograms, in segment order, for its pipeline to observe each invoke in
    (app/pool/pipeline.py): made once per pipeline."""
    return [SEGMENT_SECONDS.labels(model, backend, str(i)) for i in range(segments)]


# How each worker's value of a state series becomes the service's (app/processes): sum, min or max, or
# "each": every worker's series kept, labelled with its slot (WORKER_LABEL).
MERGES = {"sum": sum, "min": min, "max": max}
EACH = "each"
WORKER_LABEL = "worker"


def merged_by(family: Metric, how: str) -> Metric:
    """Mark a state family with the rule that merges the workers' values of each of its series (default
    sum): "min" where the service has a state only if every worker has it, "max" for the latest or worst,
    "each" for a count a process keeps since it started (a sum would drop when a worker is replaced, which
    Prometheus takes for a reset: one series per worker resets with its own process only)."""
    if how not in MERGES and how != EACH:
        raise ValueError(f"merge {how!r}: one of {sorted([*MERGES, EACH])}")
    family.merge = how
    return family


class StateCollector(Collector):
    """Gauges read from the registry at scrape time: the pools', and each plug-in's own."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self) -> Iterable:
        yield from self._pools()
        yield from self._plugins()

    def _pools(self):
        g = {name: GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels) for name, doc, labels in (
            ("model_ready", "1 when the model is loaded and serving; 0 while loading, failed or unhealthy",
             ("model",)),
            ("model_loaded_timestamp_seconds", "When the model serving now was loaded (changes on reload)",
             ("model",)),
            ("pool_interpreters", "Interpreters in the pool", ("model", "backend")),
            ("pool_interpreters_busy", "Interpreters running an invoke now", ("model", "backend")),
            ("pool_interpreters_unhealthy", "Interpreters out of the pool (watchdog)", ("model", "backend")),
            ("pool_queue_depth", "Requests waiting for an interpreter", ("model", "backend")),
            ("pool_load_seconds", "Time to create and allocate the pool's interpreters", ("model", "backend")),
            ("pool_first_inference_seconds", "The pool's first inference after (re)load: the warm-up",
             ("model", "backend")),
        )}
        for name, how in (("model_ready", "min"), ("model_loaded_timestamp_seconds", "max"),
                          ("pool_load_seconds", "max"), ("pool_first_inference_seconds", "max")):
            merged_by(g[name], how)
        for name in self.registry.names():
            g["model_ready"].add_metric([name], 1.0 if self.registry.status(name).state == "ready" else 0.0)
            try:
                model = self.registry.get(name)
            except ServeError:  # loading or failed: no pools to report
                continue
            g["model_loaded_timestamp_seconds"].add_metric([name], model.loaded_at)
            for backend, pool in model.pools.items():
                labels, members = [name, backend], pool.members
                g["pool_interpreters"].add_metric(labels, members.interpreters)
                g["pool_interpreters_busy"].add_metric(labels, pool.busy)
                g["pool_interpreters_unhealthy"].add_metric(labels, len(members.unhealthy))
                g["pool_queue_depth"].add_metric(labels, pool.line.waiting)
                g["pool_load_seconds"].add_metric(labels, members.load_ms / 1000)
                if members.first_inference_ms is not None:
                    g["pool_first_inference_seconds"].add_metric(labels, members.first_inference_ms / 1000)
        yield from g.values()

    def _plugins(self):
        for key, plugin in self.registry.plugins.items():
            try:
                families = list(plugin.collect(self.registry.members(key)))
            except Exception:  # one plug-in's failure leaves the other series standing
                log.exception("backend %s: its metrics could not be collected", key)
                continue
            yield from families


class Watched:
    """The registry whose state this process's scrapes report. Module state, because prometheus_client's REGISTRY is
    the process's: one registry watched per process, the last one."""

    collector: StateCollector | None = None


THIS_PROCESS = Watched()


def watch(registry, prometheus: CollectorRegistry = REGISTRY) -> None:
    """Report this registry's state at each scrape (one registry per process: the last one watched)."""
    unwatch(prometheus)
    THIS_PROCESS.collector = StateCollector(registry)
    prometheus.register(THIS_PROCESS.collector)


def unwatch(prometheus: CollectorRegistry = REGISTRY) -> None:
    if THIS_PROCESS.collector is not None:
        prometheus.unregister(THIS_PROCESS.collector)
        THIS_PROCESS.collector = None


def exposition(prometheus: CollectorRegistry = REGISTRY) -> bytes:
    return generate_latest(prometheus)


# ---- several processes (app/processes) -----------------------------------------------------------------

def use_multiprocess(directory: Path) -> None:
    """From now on this process's counters and histograms live in `directory`'s files, which every worker's
    scrape sums. In a worker, before any series is made: prometheus_client picks its value class when it is
    imported (here possibly in the master, before the fork), and a series takes the class current when it is
    first labelled (prometheus-client pinned: its `values.ValueClass`). The metrics here all have labels."""
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    values.ValueClass = values.MultiProcessValue()
    _answers.clear()
    _stage_histograms.clear()


def process_gone(pid: int, directory: Path) -> None:
    """In the master, for a worker that ended: its live gauges leave the group's files (its counters stay: the
    requests it answered were answered)."""
    multiprocess.mark_process_dead(pid, str(directory))


def state_families(registry) -> list[dict]:
    """This process's state gauges (StateCollector) as plain values, to be merged with the other workers'."""
    return [{"name": f.name, "documentation": f.documentation, "type": f.type,
             "merge": getattr(f, "merge", "sum"),
             "samples": [[sample.name, sample.labels, sample.value] for sample in f.samples]}
            for f in StateCollector(registry).collect()]


class _Merged(Collector):
    """Every worker's state families (by slot), series by series, each merged by its family's rule."""

    def __init__(self, workers: dict[int, list[dict]], processes: int):
        self.workers = workers
        self.processes = processes

    def collect(self) -> Iterable:
        families: dict[str, dict] = {}
        for slot, worker in self.workers.items():
            for family in worker:
                entry = families.setdefault(family["name"], {**family, "series": {}})
                for name, labels, value in family["samples"]:
                    if family["merge"] == EACH:
                        labels = {**labels, WORKER_LABEL: str(slot)}
                    entry["series"].setdefault((name, tuple(sorted(labels.items()))), []).append(value)
        for family in families.values():
            metric = Metric(family["name"], family["documentation"], family["type"])
            merge = MERGES.get(family["merge"], sum)  # "each": one value per series already
            for (name, labels), found in family["series"].items():
                metric.add_sample(name, dict(labels), merge(found))
            yield metric
        yield GaugeMetricFamily(f"{PREFIX}_processes", "Worker processes serving this port (app/processes)",
                                value=self.processes)
        yield GaugeMetricFamily(f"{PREFIX}_processes_answering",
                                "Worker processes whose state this scrape read (the others are starting or gone)",
                                value=len(self.workers))


def group_exposition(directory: Path, workers: dict[int, list[dict]], processes: int) -> bytes:
    """The service's metrics when several processes serve it: the counters and histograms of every worker
    (their multiprocess files in `directory`), and the state families of the workers that answered (by slot),
    merged."""
    prometheus = CollectorRegistry()
    MultiProcessCollector(prometheus, path=str(directory))
    prometheus.register(_Merged(workers, processes))
    return generate_latest(prometheus)

