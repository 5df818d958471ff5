"""Frigate's ZMQ detector protocol on the service's event loop: ZMTP 3 on asyncio's transports
(app/frontdoors/zmq_server.py), the messages app/frontdoors/frigate.py's.

Frigate's side is a REQ socket (frigate/detectors/plugins/zmq_ipc.py): one request at a time per Frigate detector,
each answered before the next. The door takes many of them at once (several Frigate instances, or several detectors
of one), each connection's request answered on a task of its own, so a slow invoke for one peer holds up no other;
the reply goes back on the connection it came on, in the envelope it came in (a REQ peer's empty frame).

Limits bite before memory is spent: as each frame's head arrives, `frame_limit` says how large it may be from what
came before it in its message. A header at most MAX_HEADER_BYTES; a tensor at most the largest input a served
detector takes; a model file at most ZMQ_MAX_MODEL_BYTES, and only the one upload that may be written is held
(app/frontdoors/zmq_models.py). A frame past its limit is refused at its head: the request is answered with the
reason and its peer dropped, before a byte of the frame is read (libzmq's REQ reads the answer, then connects
again by itself).

A peer whose requests keep being refused is paced: after REFUSALS_UNPACED refusals in a row, its next message is
read only after a pause that doubles with each refusal, up to PACE_MAX_S (under Frigate's 200 ms timeout). Refusals
cost the event loop little, but a peer that sends nothing else gets no more of it than that.

Every request gets a reply, never silence: refused ones get zero rows with the reason (or a model message's JSON
with it), logged (rate-limited, app/refusal_log.py) and counted in /metrics (protocol="zmq", and
edgetpu_serve_zmq_refusals by reason). A peer dropped in the middle of a message (too many frames, a frame beyond
ZMQ_MAX_MODEL_BYTES, a broken frame, a stall) is answered first when what it asked is known, then closed, logged and
counted (edgetpu_serve_zmq_dropped_peers by reason).

Which model answers a peer: the one its model_request named (app/frontdoors/zmq_models.py), remembered per
connection (Frigate re-creates its socket, and so its connection, after any timeout, and then asks again). A peer
the door has not heard a model_request from (the door restarted under it) gets the default detector, or the one
served detector whose input its tensor fits. So two Frigate instances with different models are each answered with
their own, over one endpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import numpy as np

from app import metrics
from app.errors import Busy, InvokeTimeout, ModelNotFound, NotReady, RequestError, ServeError
from app.frontdoors.frigate import (
    MAX_HEADER_BYTES,
    ModelCheck,
    ModelUpload,
    Refused,
    Requests,
    TensorRequest,
    family_for,
    header_problem,
    looks_like_json,
    model_reply,
    rows_reply,
    zero_reply,
)
from app.frontdoors.served import Detectors, ServedDetector
from app.frontdoors.zmq_models import ModelMessages
from app.frontdoors.zmq_server import BindError, Connection, PeerPolicy, ZmtpServer
from app.frontdoors.zmtp import Dropped, ReaderLimits
from app.refusal_log import RefusalLog
from app.settings import ZmqEndpoint

log = logging.getLogger(__name__)

PROTOCOL = "zmq"
# A peer counts as a client in /v1/devices while it has sent a request this recently
CLIENT_SEEN_S = 60.0
STOP_WAIT_S = 5.0
# The largest served input is asked of the models again after this long (a model uploaded or reloaded meanwhile)
LARGEST_INPUT_S = 1.0
# A peer refused this many times in a row is paced: its next message is read after PACE_FIRST_S, doubling up to
# PACE_MAX_S with each refusal more, until one of its requests is answered
REFUSALS_UNPACED = 8
PACE_FIRST_S, PACE_MAX_S = 0.001, 0.1


# ServeError class -> (reason, status) for the refusals a run can end in
RUN_REFUSALS = ((InvokeTimeout, "timeout"), (Busy, "busy"), (NotReady, "not_ready"), (ModelNotFound, "model"),
                (RequestError, "request"))


class ZmqDoor:
    def __init__(self, endpoint: ZmqEndpoint, detectors: Detectors, uploads, *, policy: PeerPolicy = PeerPolicy(),
                 max_in_flight: int, refusal_log_window_s: float, max_connections: int = 64,
                 peer_timeout_s: float = 10.0):
        self.endpoint = endpoint
        self.detectors = detectors
        self.uploads = uploads
        self.max_in_flight = max_in_flight
        self.refusals = RefusalLog(log, refusal_log_window_s, status=None)
        self.requests = Requests()
        self.models = ModelMessages(detectors, uploads, self)
        self.server = ZmtpServer(endpoint, self, policy, max_connections=max_connections, timeout_s=peer_timeout_s,
                                 limits=ReaderLimits(), refusals=self.refusals)
        self.peers: dict[Connection, str] = {}   # connection -> the model its model_request named
        self.answered = 0
        self.refused: Counter[str] = Counter()
        self.problem: str | None = "not started"
        self._tasks: set[asyncio.Task] = set()
        self._largest = (0, -LARGEST_INPUT_S)  # (bytes, when asked)

    # -- lifetime --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind and serve. A bind that fails leaves the door not ready, saying why (/readyz), the service up."""
        try:
            await self.server.start()
        except BindError as e:
            self.problem = f"ZMQ door: {e}"
            log.error("%s", self.problem)
            return
        self.problem = None
        who = ("anyone who reaches it (ZMQ_ALLOW_REMOTE)" if self.server.policy.anyone else
               "loopback" + "".join(f", {n}" for n in self.server.policy.allow_from)
               if self.endpoint.scheme == "tcp" else "whoever may open the socket file")
        log.info("ZMQ door (Frigate's zmq detector) on %s for %s; model uploads %s", self.endpoint.text, who,
                 "accepted" if self.uploads.accepting else "refused (ZMQ_ACCEPT_MODELS)")
        if self.server.policy.anyone and not self.endpoint.loopback:
            log.warning("ZMQ door: ZMQ_ALLOW_REMOTE=true: anyone who reaches %s can run the models served (models "
                        "are taken from loopback and ZMQ_UPLOAD_FROM only); ZMQ_ALLOW_FROM would admit Frigate's "
                        "address alone", self.endpoint.text)

    async def stop(self) -> None:
        """Stop reading; the requests being answered finish (bounded), then the connections close."""
        self.problem = "stopping"
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=STOP_WAIT_S)
        await self.server.stop()
        self.problem = "stopped"

    def ready(self) -> str | None:
        """None when the door serves, else why not (for /readyz)."""
        return self.problem

    def report(self) -> dict:
        """What /v1/devices says of the door."""
        now = time.monotonic()
        connections = list(self.server.connections)
        return {"endpoint": self.endpoint.text, "serving": self.problem is None, "problem": self.problem,
                "accept_models": self.uploads.accepting, "in_flight": len(self._tasks),
                "connections": len(connections), "dropped_peers": self.server.dropped,
                "clients": sum(1 for c in connections if now - c.active_at < CLIENT_SEEN_S),
                "answered": self.answered, "refused": dict(self.refused),
                "peers": {peer.name: model for peer, model in list(self.peers.items())[-16:]}}

    # -- the socket's handler (zmq_server.Handler) ----------------------------------------------------------

    def frame_limit(self, peer: Connection, frames: list, size: int) -> int:
        """How large the frame that follows `frames` may be, from what came before it: its message's header, at most
        MAX_HEADER_BYTES; after a tensor request's header, the largest served input; after a model_data header, what
        the uploads admit; anything else, MAX_HEADER_BYTES. Dropped, saying why, for a frame past it."""
        body = _body(frames)
        if len(body) == 1:
            header = self.requests.peek(body[0])
            if header is not None and header.get("model_data"):
                return self.models.upload_limit(peer, header, size)
            if header is None or not header.get("model_request"):  # a tensor (or what follows a header unread)
                largest = self._largest_input()
                if size > largest:
                    if header is None:
                        raise Dropped("header", header_problem(body[0]))
                    raise Dropped("size", f"the tensor frame has {size} bytes, more than any model here takes (at "
                                          f"most {largest}): set Frigate's model width and height to those of the "
                                          "model it names (GET /v1/models)")
                return largest
        if size > MAX_HEADER_BYTES:
            what = "first frame" if not body else "frame"
            raise Dropped("header" if not body else "frames", f"a {what} of {size} bytes where at most "
                          f"{MAX_HEADER_BYTES} may come (a header; Frigate's are under 100 bytes)")
        return MAX_HEADER_BYTES

    def message(self, peer: Connection, frames: list) -> None:
        if len(self._tasks) >= self.max_in_flight or self.problem is not None:
            refused = Refused("busy", f"{self.max_in_flight} requests are being answered (ZMQ_MAX_IN_FLIGHT): "
                                      "try again", 503) if self.problem is None else \
                Refused("stopping", "the service is stopping", 503)
            envelope, body = _split(frames)
            self._count_refusal(peer, refused, None)
            self.models.settle(peer)
            peer.refused_in_a_row += 1
            peer.send(envelope + self._refusal(body, refused), pace_s(peer.refused_in_a_row))
            return
        task = asyncio.get_running_loop().create_task(self._answer(peer, frames))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def refused_message(self, peer: Connection, frames: list, dropped: Dropped) -> list[bytes] | None:
        """The answer to a message cut short by its peer's drop: what it asked refused with the drop's reason."""
        if not frames:
            return None
        envelope, body = _split(frames)
        self.refused[dropped.reason] += 1
        metrics.zmq_refused(dropped.reason)
        return envelope + self._refusal(body, Refused(dropped.reason, dropped.message))

    def peer_lost(self, peer: Connection) -> None:
        self.peers.pop(peer, None)
        self.models.settle(peer)

    # -- requests -----------------------------------------------------------------------------------------------

    async def _answer(self, peer: Connection, frames: list) -> None:
        envelope, body = _split(frames)
        ran = None
        try:
            reply, ran = await self._reply(peer, body)
        except Exception as e:  # a bug: logged (summed up per kind), and still answered
            self.refusals.failed("ZMQ", f"{self.endpoint.text} from {peer.name}", e, exc_info=True)
            reply = self._refusal(body, Refused("internal", "internal error: see the service's log", 500))
        finally:
            self.models.settle(peer)
        if ran is not None:
            peer.refused_in_a_row = 0
            peer.send(envelope + reply)
            self.answered += 1
            metrics.answered(PROTOCOL, *ran, 200)
        else:
            peer.refused_in_a_row += 1
            peer.send(envelope + reply, pace_s(peer.refused_in_a_row))

    async def _reply(self, peer: Connection, body: list) -> tuple[list[bytes], tuple[str, str] | None]:
        """The reply, and the model and backend that ran the tensor when it was answered with rows (None: refused,
        and counted; a model message)."""
        model = None
        try:
            header, request = self.requests.read(body)
            if isinstance(request, ModelCheck):
                return await self.models.check(peer, request), None
            if isinstance(request, ModelUpload):
                return await self.models.upload(peer, request), None
            detector = self._detector_for(peer, request)
            model = detector.name
            fits(detector, request)
            rows, backend = await self._run(detector, request)
        except Refused as refused:
            header = refused.header
            model_message = header is not None and bool(header.get("model_request") or header.get("model_data"))
            self._count_refusal(peer, refused, model, inference=not model_message)
            return self._refusal(body, refused), None
        return rows_reply(rows), (model, backend)

    def _refusal(self, body: list, refused: Refused) -> list[bytes]:
        """The reply to a refused request: a model message's JSON where it was one, else zero rows (the reason in
        the JSON form unless its first frame is there and no JSON at all)."""
        header = refused.header if refused.header is not None else (self.requests.peek(body[0]) if body else None)
        if header is not None and header.get("model_request"):
            return model_reply(model_available=False, model_loaded=False, message=refused.message)
        if header is not None and header.get("model_data"):
            return model_reply(model_saved=False, model_loaded=False, message=refused.message)
        return zero_reply(refused, header is not None or not body or looks_like_json(body))

    def _count_refusal(self, peer: Connection, refused: Refused, model: str | None, inference: bool = True) -> None:
        """Every refusal by its reason; a tensor request's also among the requests answered (protocol="zmq"), as
        the model messages' answers are not."""
        self.refused[refused.reason] += 1
        metrics.zmq_refused(refused.reason)
        if inference:
            metrics.answered(PROTOCOL, model or "", "", refused.status)
        self.refusals.refused("ZMQ", f"{self.endpoint.text} from {peer.name} ({refused.reason})", refused,
                              refused.status)

    def _detector_for(self, peer: Connection, request: TensorRequest) -> ServedDetector:
        name = self.peers.get(peer)
        if name is not None:
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
                self.refusals.failed("ZMQ", f"{self.endpoint.text} model {detector.name}", e)
            raise Refused(reason, str(e), e.status) from None

    def remember(self, peer: Connection, model: str) -> None:
        """The model that answers this peer's tensors from now on (its model_request's, or its upload's)."""
        self.peers[peer] = model

    def _largest_input(self) -> int:
        """The most bytes a served detector's input takes (asked of the models again after LARGEST_INPUT_S)."""
        largest, asked = self._largest
        now = time.monotonic()
        if now - asked >= LARGEST_INPUT_S:
            largest = max((d.input_bytes for d in self.detectors.detectors()), default=0)
            self._largest = (largest, now)
        return largest


def pace_s(refused_in_a_row: int) -> float:
    """How long a peer refused so many times in a row waits before its next message is read."""
    if refused_in_a_row <= REFUSALS_UNPACED:
        return 0.0
    return min(PACE_MAX_S, PACE_FIRST_S * 2 ** min(refused_in_a_row - REFUSALS_UNPACED - 1, 16))


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
    """A message's envelope (up to its first empty frame: a REQ peer's delimiter, after a DEALER's routing ids) and
    its body; a message without an empty frame is all body (a DEALER that sends none)."""
    for i, frame in enumerate(frames):
        if not len(frame):
            return list(frames[:i + 1]), frames[i + 1:]
    return [], frames


def _body(frames: list) -> list:
    for i, frame in enumerate(frames):
        if not len(frame):
            return frames[i + 1:]
    return frames
