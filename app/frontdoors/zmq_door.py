"""Frigate's ZMQ detector protocol on a ZeroMQ ROUTER socket, on the service's event loop.

Frigate's side is a REQ socket (frigate/detectors/plugins/zmq_ipc.py): one request at a time per Frigate detector,
each answered before the next. A ROUTER socket takes many of them at once (several Frigate instances, or several
detectors of one), each request tagged with its peer's identity; each is answered on a task of its own, so a slow
invoke for one peer holds up no other, and the reply goes back through the same identity. The messages are
app/frontdoors/frigate.py's.

Every request gets a reply, never silence: refused ones get zero rows with the reason (or a model message's JSON
with it), logged (rate-limited, app/refusal_log.py) and counted in /metrics (protocol="zmq", and
edgetpu_serve_zmq_refusals by reason). The one exception is a frame larger than the socket reads
(ZMQ_MAX_MODEL_BYTES and a little more): libzmq closes that connection without reading it, so Frigate's request
times out and Frigate re-creates its socket.

Which model answers a peer: the one its model_request named (matched by model directory name, or by the name of
one of the model's files, as given or as written), remembered per peer identity (Frigate re-creates its socket,
and so its identity, after any timeout, and then asks again). A peer the door has not heard a model_request from
(the door restarted under it) gets the default detector, or the one served detector whose input its tensor fits.
So two Frigate instances with different models are each answered with their own, over one endpoint.

The models are reached through `Detectors` (app/frontdoors/serving.py gives the service's), uploads through
`Uploads` (app/frontdoors/uploads.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import zmq

from app import metrics
from app.errors import Busy, InvokeTimeout, ModelNotFound, NotReady, RequestError, ServeError
from app.frontdoors.frigate import (
    ModelCheck,
    ModelUpload,
    Refused,
    Requests,
    TensorRequest,
    family_for,
    header_of,
    model_reply,
    rows_reply,
    zero_reply,
)
from app.refusal_log import RefusalLog

log = logging.getLogger(__name__)

PROTOCOL = "zmq"
# Peers remembered (identity -> model); the oldest forgotten first. Frigate makes a new identity after each timeout.
PEERS_KEPT = 4096
# A peer counts as a client in /v1/devices while it has sent a request this recently
CLIENT_SEEN_S = 60.0
# Room a message may take beyond the largest model file (its JSON header; libzmq's framing)
FRAME_SLACK_BYTES = 64 * 1024
# Messages libzmq keeps per peer before the door reads them (each up to the frame limit)
RECEIVE_QUEUE = 16
STOP_WAIT_S = 5.0
# A model_request that comes while the models load waits for them this long: Frigate waits 30 s for the answer, and
# gives up for good on "available but not loaded"
SETTLE_WAIT_S = 25.0
# Messages read per turn of the event loop before it runs its other work
PUMP_BATCH = 32
# pyzmq's flags and options as plain ints: its enums cost an enum operation per use on the hot path
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_SEND, _SEND_MORE = int(zmq.NOBLOCK), int(zmq.NOBLOCK | zmq.SNDMORE)


@dataclass(frozen=True)
class ServedDetector:
    """A detection model as this door sees it: its input, its family (Frigate's model_type), whether it serves."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    family: str              # "ssd": ends in TFLite_Detection_PostProcess
    names: frozenset[str]    # the file names it answers a model_request to, besides its own name
    loaded: bool
    state: str               # the registry's: ready, degraded, loading, failed, unhealthy


class Detectors(Protocol):
    """The detection models this door may answer with, and a run of one (the service's: app/frontdoors/serving.py)."""

    def detectors(self) -> list[ServedDetector]: ...

    def detector(self, name: str) -> ServedDetector | None:
        """The one of detectors() named `name` (None: not a detector served here), without making the others."""

    def default(self) -> str | None: ...

    async def settled(self, timeout_s: float) -> None:
        """Return once the models configured at start have loaded (or failed), at most timeout_s."""

    async def rows(self, model: str, tensor: np.ndarray) -> tuple[np.ndarray, str]:
        """Frigate's [20, 6] rows for one tensor, and the backend that ran it; a ServeError says why not."""


class Uploads(Protocol):
    accepting: bool

    async def receive(self, name: str, data: memoryview) -> UploadResult: ...


@dataclass(frozen=True)
class UploadResult:
    saved: bool
    loaded: bool
    model: str | None   # the model that answers this name from now on
    message: str


# ServeError class -> (reason, status) for the refusals a run can end in
RUN_REFUSALS = ((InvokeTimeout, "timeout"), (Busy, "busy"), (NotReady, "not_ready"), (ModelNotFound, "model"),
                (RequestError, "request"))


class ZmqDoor:
    def __init__(self, endpoint: str, detectors: Detectors, uploads: Uploads, *, max_in_flight: int,
                 max_model_bytes: int, refusal_log_window_s: float):
        self.endpoint = endpoint
        self.detectors = detectors
        self.uploads = uploads
        self.max_in_flight = max_in_flight
        self.max_frame_bytes = max_model_bytes + FRAME_SLACK_BYTES
        self.refusals = RefusalLog(log, refusal_log_window_s, status=None)
        self.requests = Requests()
        self.peers: OrderedDict[bytes, str] = OrderedDict()
        self.seen: OrderedDict[bytes, float] = OrderedDict()
        self.answered = 0
        self.refused: Counter[str] = Counter()
        self.problem: str | None = "not started"
        self._context: zmq.Context | None = None
        self._socket: zmq.Socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()

    # -- lifetime --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind and serve. A bind that fails leaves the door not ready, saying why (/readyz), the service up."""
        self._context = zmq.Context()
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes)
        sock.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            if self.endpoint.startswith("ipc://"):
                Path(self.endpoint.removeprefix("ipc://")).parent.mkdir(parents=True, exist_ok=True)
            sock.bind(self.endpoint)
        except (zmq.ZMQError, OSError) as e:
            sock.close(linger=0)
            self.problem = f"ZMQ door: cannot bind {self.endpoint}: {e}"
            log.error("%s", self.problem)
            return
        self._socket, self.problem = sock, None
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.getsockopt(zmq.FD), self._pump)
        self._loop.call_soon(self._pump)  # anything that came with the connection
        log.info("ZMQ door (Frigate's zmq detector) on %s; model uploads %s", self.endpoint,
                 "accepted" if self.uploads.accepting else "refused (ZMQ_ACCEPT_MODELS)")

    async def stop(self) -> None:
        """Stop reading; the requests being answered finish (bounded), then the socket closes."""
        if self._socket is not None and self._loop is not None:
            self._loop.remove_reader(self._socket.getsockopt(zmq.FD))
        self.problem = "stopping"
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=STOP_WAIT_S)
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        if self._context is not None:
            self._context.term()
        self.problem = "stopped"

    def ready(self) -> str | None:
        """None when the door serves, else why not (for /readyz)."""
        return self.problem

    def report(self) -> dict:
        """What /v1/devices says of the door."""
        now = time.monotonic()
        return {"endpoint": self.endpoint, "serving": self.problem is None, "problem": self.problem,
                "accept_models": self.uploads.accepting, "in_flight": len(self._tasks),
                "clients": sum(1 for t in self.seen.values() if now - t < CLIENT_SEEN_S),
                "answered": self.answered, "refused": dict(self.refused),
                "peers": {self._peer_name(identity): model for identity, model in list(self.peers.items())[-16:]}}

    # -- the socket --------------------------------------------------------------------------------------------

    # The socket is driven from the event loop by its file descriptor, with non-blocking calls: a ROUTER never blocks
    # on a send (a reply to a peer gone, or whose queue is full, is dropped), and libzmq's descriptor is
    # edge-triggered, so after every send the socket is asked whether input waits. pyzmq's zmq.asyncio does the same
    # with a future per call: about 110 us of CPU more per request here (a bare echo of a 320x320 tensor, 2 cores:
    # 170-185 us against 275-300). The socket is asked whether a message waits (ZMQ_EVENTS, as libzmq documents for
    # an edge-triggered descriptor) rather than read until zmq.Again: an exception per turn, and a message's frames are
    # read by their `more` flag rather than through recv_multipart's option read per frame (together about 17 us of
    # CPU per request less, warm).

    def _pump(self) -> None:
        """Read what has come, at most PUMP_BATCH messages, then yield to the loop (and come back if more waits)."""
        sock = self._socket
        if sock is None or self.problem is not None:
            return
        for _ in range(PUMP_BATCH):
            try:
                if not sock.getsockopt(_EVENTS) & _POLLIN:
                    return
                frame = sock.recv(_SEND, copy=False)
                frames = [frame]
                while frame.more:
                    frame = sock.recv(_SEND, copy=False)
                    frames.append(frame)
            except zmq.Again:
                return
            except zmq.ZMQError as e:
                if e.errno not in (zmq.ETERM, zmq.ENOTSOCK):
                    log.warning("ZMQ door: receive failed: %s", e)
                return
            self._take(frames)
        self._loop.call_soon(self._pump)

    def _take(self, frames: list) -> None:
        envelope, body = _split(frames)
        if len(self._tasks) >= self.max_in_flight:
            refused = Refused("busy", f"{self.max_in_flight} requests are being answered (ZMQ_MAX_IN_FLIGHT): "
                                      "try again", 503)
            self._count_refusal(envelope[0] if envelope else b"", refused, None)
            self._send(envelope, self._refusal(body, refused))
            return
        task = self._loop.create_task(self._answer(envelope, body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, envelope: list, reply: list[bytes]) -> None:
        sock = self._socket
        if sock is None:
            return
        *head, last = *envelope, *reply
        try:
            for frame in head:
                sock.send(frame, _SEND_MORE)
            sock.send(last, _SEND)
        except zmq.ZMQError as e:  # the socket closing; a peer gone is dropped by the ROUTER without an error
            log.warning("ZMQ door: reply not sent: %s", e)
            return
        if sock.getsockopt(_EVENTS) & _POLLIN:  # the send may have taken the descriptor's edge
            self._loop.call_soon(self._pump)

    async def _answer(self, envelope: list, body: list) -> None:
        identity = envelope[0] if envelope else b""
        ran = None
        try:
            reply, ran = await self._reply(identity, body)
        except Exception:  # a bug: logged, and still answered
            log.exception("ZMQ door: request from %s", self._peer_name(identity))
            reply = self._refusal(body, Refused("internal", "internal error: see the service's log", 500))
        self._send(envelope, reply)
        # the bookkeeping once the reply is on its way: at one client, the loop's time before it is the client's
        self.seen[identity] = time.monotonic()
        self.seen.move_to_end(identity)
        while len(self.seen) > PEERS_KEPT:
            self.seen.popitem(last=False)
        if ran is not None:
            self.answered += 1
            metrics.answered(PROTOCOL, *ran, 200)

    # -- requests -----------------------------------------------------------------------------------------------

    async def _reply(self, identity: bytes, body: list) -> tuple[list[bytes], tuple[str, str] | None]:
        """The reply, and the model and backend that ran the tensor when it was answered with rows (None: refused,
        and counted; a model message)."""
        views = [frame.buffer for frame in body]
        header = model = None
        try:
            header, request = self.requests.read(views)
            if isinstance(request, ModelCheck):
                await self.detectors.settled(SETTLE_WAIT_S)
                return self._check(identity, request), None
            if isinstance(request, ModelUpload):
                return await self._upload(identity, request), None
            detector = self._detector_for(identity, request)
            model = detector.name
            fits(detector, request)
            rows, backend = await self._run(detector, request)
        except Refused as refused:
            if header is None:  # refused as it was read
                header = header_of(views)
            model_message = header is not None and bool(header.get("model_request") or header.get("model_data"))
            self._count_refusal(identity, refused, model, inference=not model_message)
            return self._refusal(body, refused, header), None
        return rows_reply(rows), (model, backend)

    def _refusal(self, body: list, refused: Refused, header: dict | None = ...) -> list[bytes]:
        """The reply to a refused request: a model message's JSON where it was one, else zero rows."""
        if header is ...:
            header = header_of([frame.buffer for frame in body])
        if header is not None and header.get("model_request"):
            return model_reply(model_available=False, model_loaded=False, message=refused.message)
        if header is not None and header.get("model_data"):
            return model_reply(model_saved=False, model_loaded=False, message=refused.message)
        return zero_reply(refused, header)

    def _count_refusal(self, identity: bytes, refused: Refused, model: str | None, inference: bool = True) -> None:
        """Every refusal by its reason; a tensor request's also among the requests answered (protocol="zmq"), as
        the model messages' answers are not."""
        self.refused[refused.reason] += 1
        metrics.zmq_refused(refused.reason)
        if inference:
            metrics.answered(PROTOCOL, model or "", "", refused.status)
        self.refusals.refused("ZMQ", f"{self.endpoint} from {self._peer_name(identity)} ({refused.reason})", refused,
                              refused.status)

    def _check(self, identity: bytes, request: ModelCheck) -> list[bytes]:
        """model_request: the model of that name (or file name), else the default detector where uploads are off."""
        served = self.detectors.detectors()
        found = match(request.name, served)
        if found is None and not self.uploads.accepting:
            found = next((d for d in served if d.name == self.detectors.default()), None)
            if found is not None:
                log.info("ZMQ door: %s asks for %r, not served here (uploads off: ZMQ_ACCEPT_MODELS): answering with "
                         "the default detector %s", self._peer_name(identity), request.name, found.name)
                self._remember(identity, found.name)
                return model_reply(model_available=True, model_loaded=found.loaded, model_name=request.name,
                                   message=f"no model {request.name!r} here: the default detector {found.name!r} "
                                           "answers (its class ids must be those of Frigate's labelmap)")
        if found is None:
            message = (f"no model {request.name!r} here: send it (model_data)" if self.uploads.accepting else
                       f"no model {request.name!r} here and no detector to answer with")
            return model_reply(model_available=False, model_loaded=False, model_name=request.name, message=message)
        self._remember(identity, found.name)
        message = (f"{found.name} serves" if found.loaded else f"{found.name} is {found.state}: see /readyz")
        return model_reply(model_available=True, model_loaded=found.loaded, model_name=request.name, message=message)

    async def _upload(self, identity: bytes, request: ModelUpload) -> list[bytes]:
        if not self.uploads.accepting:
            raise Refused("upload", f"model uploads are off here (set EDGETPU_SERVE_ZMQ_ACCEPT_MODELS=true to accept "
                                    f"them), and {request.name!r} is not served: name a served model in Frigate's "
                                    "model.path", 403)
        result = await self.uploads.receive(request.name, request.data)
        if result.model is not None and result.loaded:
            self._remember(identity, result.model)
        if not (result.saved and result.loaded):
            self.refused["upload"] += 1
            metrics.zmq_refused("upload")
            log.warning("ZMQ door: model upload %r from %s: %s", request.name, self._peer_name(identity),
                        result.message)
        else:
            log.info("ZMQ door: model upload %r from %s: %s", request.name, self._peer_name(identity), result.message)
        return model_reply(model_saved=result.saved, model_loaded=result.loaded, model_name=request.name,
                           message=result.message)

    def _detector_for(self, identity: bytes, request: TensorRequest) -> ServedDetector:
        name = self.peers.get(identity)
        if name is not None:
            self.peers.move_to_end(identity)
            detector = self.detectors.detector(name)
        else:  # no model_request heard from this peer: the default detector, or the one its tensor fits
            served = {d.name: d for d in self.detectors.detectors()}
            default = served.get(self.detectors.default())
            fitting = [d for d in served.values() if d.loaded and d.shape == request.shape and d.dtype == request.dtype]
            if default is not None and (default in fitting or len(fitting) != 1):
                name = default.name
            elif len(fitting) == 1:
                name = fitting[0].name
            detector = served.get(name) if name is not None else None
        if detector is None:
            raise Refused("model", f"no detector serves here{f' (model {name!r} is gone)' if name else ''}: send a "
                                   "model_request first", 404)
        return detector

    async def _run(self, detector: ServedDetector, request: TensorRequest) -> tuple[np.ndarray, str]:
        try:
            return await self.detectors.rows(detector.name, request.tensor())
        except ServeError as e:
            reason = next((why for cls, why in RUN_REFUSALS if isinstance(e, cls)), "internal")
            if reason == "internal":
                log.error("ZMQ door: model %s: %s", detector.name, e)
            raise Refused(reason, str(e), e.status) from None

    def _remember(self, identity: bytes, model: str) -> None:
        self.peers[identity] = model
        self.peers.move_to_end(identity)
        while len(self.peers) > PEERS_KEPT:
            self.peers.popitem(last=False)

    @staticmethod
    def _peer_name(identity: bytes) -> str:
        return identity.hex() or "?"


def fits(detector: ServedDetector, request: TensorRequest) -> None:
    """Refused unless the tensor is the model's input as it is (shape, dtype) and its type is Frigate's for it."""
    if not detector.loaded:
        raise Refused("not_ready", f"model {detector.name!r} is {detector.state}: see /readyz", 503)
    if request.shape != detector.shape:
        raise Refused("shape", f"model {detector.name!r} takes a tensor of shape {list(detector.shape)}, this one is "
                               f"{list(request.shape)}: set Frigate's model width and height to "
                               f"{detector.shape[2]}x{detector.shape[1]} and input_tensor to nhwc")
    if request.dtype != detector.dtype:
        raise Refused("dtype", f"model {detector.name!r} takes {detector.dtype.name}, this tensor is "
                               f"{request.dtype.name}: set Frigate's input_dtype to int (uint8)")
    family_for(request.model_type, detector.family)


def _split(frames: list) -> tuple[list, list]:
    """A ROUTER message's envelope (the identity, and a REQ peer's empty delimiter) and its body."""
    for i, frame in enumerate(frames[1:], start=1):
        if len(frame) == 0:
            return [f.bytes for f in frames[:i + 1]], frames[i + 1:]
    return [frames[0].bytes] if frames else [], frames[1:]


def match(name: str, served: list[ServedDetector]) -> ServedDetector | None:
    """The model a model_request's name means: a model of that name (with or without .tflite), else the one whose
    files go by that name (as uploaded or imported, or as written); several: the first by name, logged."""
    stem = name.removesuffix(".tflite")
    for wanted in (name, stem):
        exact = next((d for d in served if d.name == wanted), None)
        if exact is not None:
            return exact
    by_file = sorted((d for d in served if name in d.names), key=lambda d: d.name)
    if len(by_file) > 1:
        log.warning("ZMQ door: %r names files of %s: answering with %s", name, [d.name for d in by_file],
                    by_file[0].name)
    return by_file[0] if by_file else None
