"""A client of Frigate's ZMQ detector protocol, written from the protocol (docs/frigate.md), as Frigate's own
`zmq` detector behaves: a REQ socket with a request timeout; at start a model_request, and the model file
(model_data) when the server does not have it; then one tensor at a time, each reply read in either of its two
forms; after a timeout or a socket error, zero rows, a new socket, and the model check again.

Used by the tests (tests/test_zmq_door.py) and the benchmark (bench/device_capacity.py --zmq).

    client = FrigateClient("tcp://127.0.0.1:5555", model_name="ssdlite_mobilenet_v2_person")
    client.start()                      # True when the server has the model loaded
    rows = client.detect(tensor)        # float32 [20, 6]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import zmq

ZERO = np.zeros((20, 6), np.float32)
MODEL_TIMEOUT_MS = 30_000  # Frigate's, for the model check and the transfer


class FrigateClient:
    def __init__(self, endpoint: str, model_name: str, model_path: Path | None = None, model_type: str | None = "ssd",
                 timeout_ms: int = 200, context: zmq.Context | None = None):
        self.endpoint = endpoint
        self.model_name = model_name
        self.model_path = model_path
        self.model_type = model_type
        self.timeout_ms = timeout_ms
        self.context = context or zmq.Context.instance()
        self.socket: zmq.Socket | None = None
        self.ready = False
        self.answers: list[dict] = []  # the model messages' replies, in order
        self.timeouts = 0
        self._connect()

    def _connect(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)
        self.socket = self.context.socket(zmq.REQ)
        for option, value in ((zmq.RCVTIMEO, self.timeout_ms), (zmq.SNDTIMEO, self.timeout_ms), (zmq.LINGER, 0)):
            self.socket.setsockopt(option, value)
        self.socket.connect(self.endpoint)

    def ask(self, frames: list[bytes], timeout_ms: int | None = None) -> list[bytes]:
        """One request, its reply's frames (zmq.Again on a timeout: the socket is then made anew)."""
        if timeout_ms is not None:
            self.socket.setsockopt(zmq.RCVTIMEO, timeout_ms)
        try:
            self.socket.send_multipart(frames)
            return self.socket.recv_multipart()
        except zmq.Again:
            self.timeouts += 1
            self._connect()
            raise
        finally:
            if timeout_ms is not None and self.socket is not None:
                self.socket.setsockopt(zmq.RCVTIMEO, self.timeout_ms)

    def _json(self, frames: list[bytes]) -> dict:
        answer = json.loads(frames[0]) if len(frames) == 1 else {"unexpected frames": len(frames)}
        self.answers.append(answer)
        return answer

    def start(self) -> bool:
        """The model check, and the transfer where the server lacks the model: whether inference may start."""
        header = json.dumps({"model_request": True, "model_name": self.model_name}).encode()
        answer = self._json(self.ask([header], MODEL_TIMEOUT_MS))
        if answer.get("model_available") and answer.get("model_loaded"):
            self.ready = True
        elif not answer.get("model_available") and self.model_path is not None:
            header = json.dumps({"model_data": True, "model_name": self.model_name}).encode()
            answer = self._json(self.ask([header, Path(self.model_path).read_bytes()], MODEL_TIMEOUT_MS))
            self.ready = bool(answer.get("model_saved") and answer.get("model_loaded"))
        return self.ready

    def header(self, tensor: np.ndarray) -> bytes:
        fields = {"shape": list(tensor.shape), "dtype": tensor.dtype.name}
        if self.model_type is not None:
            fields["model_type"] = self.model_type
        return json.dumps(fields).encode()

    def detect(self, tensor: np.ndarray) -> np.ndarray:
        """[20, 6] rows; zeros on any error or timeout (then a new socket and the model check, as Frigate does)."""
        try:
            return decode(self.ask([self.header(tensor), np.ascontiguousarray(tensor).tobytes()]))
        except zmq.Again:
            self.ready = False
            return ZERO


def decode(frames: list[bytes]) -> np.ndarray:
    """A reply's rows, in either form: one 480-byte frame, or a JSON header and the array's bytes."""
    if len(frames) == 1:
        return np.frombuffer(frames[0], np.float32).reshape(20, 6) if len(frames[0]) == 480 else ZERO
    header = json.loads(frames[0])
    return np.frombuffer(frames[1], np.dtype(header.get("dtype", "float32"))).reshape(header.get("shape", [20, 6]))
