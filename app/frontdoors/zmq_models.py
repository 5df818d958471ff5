"""Frigate's model messages at the ZMQ door: the model check (model_request) and the model transfer (model_data).

model_request: the model of that name (matched by model directory name, or by the name of one of the model's
files, as given or as written, case aside), else the default detector where uploads are off (its class ids must be
Frigate's labelmap's). The answer is remembered for the peer's connection.

model_data: admitted from its header as its file's frame begins (`upload_limit`: app/frontdoors/uploads.py decides
whether the file is held, read through a hash, or refused at once, its peer answered and dropped before any of it is
read), answered once it has come (`upload`). An admission whose message never reaches `upload` (its peer gone, the
message refused for its frames) is released (`settle`), so that the one write it may hold is free again.
"""

from __future__ import annotations

import logging

from app import metrics
from app.frontdoors.frigate import ModelCheck, ModelUpload, Refused, model_reply
from app.frontdoors.served import Detectors, ServedDetector
from app.frontdoors.uploads import REFUSED, ModelUploads, Ticket
from app.frontdoors.zmtp import Dropped

log = logging.getLogger("app.frontdoors.zmq_door")

# A model message that comes while the models load waits for them this long: Frigate waits 30 s for the answer, and
# gives up for good on "available but not loaded"
SETTLE_WAIT_S = 25.0


class ModelMessages:
    """`door` remembers which model answers a peer (ZmqDoor.remember) and counts refusals."""

    def __init__(self, detectors: Detectors, uploads: ModelUploads, door):
        self.detectors = detectors
        self.uploads = uploads
        self.door = door
        self.tickets: dict[object, Ticket] = {}   # peer -> its upload admitted, its file not yet answered

    async def check(self, peer, request: ModelCheck) -> list[bytes]:
        await self.detectors.settled(SETTLE_WAIT_S)
        served = self.detectors.detectors()
        found = match(request.name, served)
        if found is None and not self.uploads.accepting:
            found = next((d for d in served if d.name == self.detectors.default()), None)
            if found is not None:
                if self.door.peers.get(peer) != found.name:  # once per connection
                    log.info("ZMQ door: %s asks for %r, not served here (uploads off: ZMQ_ACCEPT_MODELS): answering "
                             "with the default detector %s", peer.name, request.name[:80], found.name)
                self.door.remember(peer, found.name)
                return model_reply(model_available=True, model_loaded=found.loaded, model_name=request.name,
                                   message=f"no model {request.name!r} here: the default detector {found.name!r} "
                                           "answers (its class ids must be those of Frigate's labelmap)")
        if found is None:
            message = (f"no model {request.name!r} here: send it (model_data)" if self.uploads.accepting else
                       f"no model {request.name!r} here and no detector to answer with")
            return model_reply(model_available=False, model_loaded=False, model_name=request.name, message=message)
        self.door.remember(peer, found.name)
        message = (f"{found.name} serves" if found.loaded else f"{found.name} is {found.state}: see /readyz")
        return model_reply(model_available=True, model_loaded=found.loaded, model_name=request.name, message=message)

    def upload_limit(self, peer, header: dict, size: int) -> int:
        """The limit of a model_data's file frame of `size` bytes (zmtp: its size to hold it, or HASH); Dropped, the
        refusal its answer, where the upload is refused from its header."""
        name = header.get("model_name")
        if not isinstance(name, str) or not name.strip() or len(name) > 255:
            raise Dropped("header", "the header has no model_name (the base name of Frigate's model.path)")
        self.settle(peer)
        ticket = self.uploads.admit(name.strip(), size, peer.may_upload, self.detectors.detectors())
        if ticket.limit == REFUSED:  # answered, counted and logged as its peer is dropped
            raise Dropped(ticket.reason, ticket.refusal)
        self.tickets[peer] = ticket
        return ticket.limit

    async def upload(self, peer, request: ModelUpload) -> list[bytes]:
        ticket = self.tickets.pop(peer, None)
        if ticket is None:  # every file frame is admitted as its head arrives; one that was not is not taken
            ticket = Ticket(request.name, len(request.data), REFUSED, refusal="the upload was not admitted: send it "
                                                                               "again")
        try:
            if ticket.answers is not None or ticket.directory is not None:
                await self.detectors.settled(SETTLE_WAIT_S)
            result = await self.uploads.receive(ticket, request.data)
        finally:
            self.uploads.release(ticket)
        if result.model is not None and result.loaded:
            self.door.remember(peer, result.model)
        if not (result.saved and result.loaded):
            self._count("upload", request.name, peer, result.message)
        else:
            log.info("ZMQ door: model upload %r from %s: %s", request.name[:80], peer.name, result.message)
        return model_reply(model_saved=result.saved, model_loaded=result.loaded, model_name=request.name,
                           message=result.message)

    def _count(self, reason: str, name: str, peer, message: str) -> None:
        self.door.refused[reason] += 1
        metrics.zmq_refused(reason)
        self.door.refusals.refused("ZMQ", f"{self.door.endpoint.text} model upload {name[:80]!r} from {peer.name}",
                                   Refused(reason, message))

    def settle(self, peer) -> None:
        """The peer's message is answered, or it is gone: an admission it still holds is released."""
        ticket = self.tickets.pop(peer, None)
        if ticket is not None:
            self.uploads.release(ticket)


_WARNED: set[str] = set()


def _first_time(name: str) -> bool:
    """A warning about a name once per process (at most 64 names: then no more)."""
    if name in _WARNED or len(_WARNED) >= 64:
        return False
    _WARNED.add(name)
    return True


def match(name: str, served: list[ServedDetector]) -> ServedDetector | None:
    """The model a model_request's name means, case aside: a model of that name (with or without .tflite), else the
    one whose files go by that name (as uploaded or imported, or as written); several: the first by name, logged."""
    lowered = name.lower()
    stem = lowered.removesuffix(".tflite")
    for wanted in (lowered, stem):
        exact = next((d for d in served if d.name.lower() == wanted), None)
        if exact is not None:
            return exact
    base = lowered.replace("\\", "/").rsplit("/", 1)[-1]
    by_file = sorted((d for d in served if base in d.names), key=lambda d: d.name)
    if len(by_file) > 1 and _first_time(base):
        log.warning("ZMQ door: %r names files of %s: answering with %s", name[:80], [d.name for d in by_file],
                    by_file[0].name)
    return by_file[0] if by_file else None
