"""Front doors that are not HTTP: Frigate's ZMQ detector protocol (zmq_door.py; ZeroMQ's wire protocol, ZMTP 3, in
zmtp.py, its connections in zmq_server.py; its messages in frigate.py, the model messages in zmq_models.py, the model
transfer in uploads.py, the models it answers with in serving.py and served.py). Nothing here imports an HTTP
framework, nor libzmq: the door speaks ZMTP itself, so that its limits bite as the bytes arrive.

The service (app/service.py) makes the doors the settings ask for (`zmq_door`), opens them once it has started loading
the models and closes them before it drains; /readyz, /v1/devices and /metrics cover them through the service's doors
(`ready`, `report`) and app/metrics.py.
"""

from __future__ import annotations

import logging

from app.core import Core
from app.settings import Settings

log = logging.getLogger(__name__)


def zmq_door(settings: Settings, core: Core, first_worker: bool = True):
    """Frigate's ZMQ door on the service's core (app/core), made, not yet open; None where the settings ask for none.
    Under several worker processes only the first one binds the ZMQ endpoint (one endpoint, one socket): it feeds
    that worker's share of the TPUs (docs/frigate.md)."""
    if settings.zmq_endpoint is None:
        return None
    if not first_worker:
        log.info("ZMQ door: bound by the first worker process, not this one")
        return None
    from app.frontdoors.serving import CoreDetectors
    from app.frontdoors.uploads import ModelUploads
    from app.frontdoors.zmq_door import ZmqDoor
    from app.frontdoors.zmq_server import PeerPolicy
    from app.settings import zmq_endpoint

    uploads = ModelUploads(core.add, settings.model_dir, settings.zmq_max_model_bytes, settings.zmq_accept_models,
                           settings.zmq_max_uploaded_models, settings.zmq_max_uploaded_bytes)
    policy = PeerPolicy.from_settings(settings.zmq_allow_from, settings.zmq_upload_from, settings.zmq_allow_remote)
    return ZmqDoor(zmq_endpoint(settings.zmq_endpoint), CoreDetectors(core), uploads, policy=policy,
                   max_in_flight=settings.zmq_max_in_flight, refusal_log_window_s=settings.refusal_log_window_s,
                   max_connections=settings.zmq_max_connections, peer_timeout_s=settings.zmq_peer_timeout_s)
