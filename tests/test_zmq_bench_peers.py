"""The ZMQ bench's two peers (bench/naive_zmq_peer.py: the REP loop, and the event loop with a device thread, the
floor of the service's own shape) answer Frigate's protocol as the service does: the model check, Frigate's SSD rows
for a tensor (the simulated device's real outputs), zero rows for a tensor that does not fit, and several clients
at once, on a real socket."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import zmq

from app.frontdoors.frigate import ssd_rows
from bench.frigate_client import decode
from bench.zmq_capacity import NAME, PEERS, SIZE, NaivePeer, build_model

TIMEOUT_MS = 60_000

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import simulated_device  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_model(tmp_path_factory.mktemp("zmq_peers") / "models") / f"{NAME}_int8.tflite"


def request(sock: zmq.Socket, *frames: bytes) -> list[bytes]:
    sock.send_multipart(list(frames))
    return sock.recv_multipart()


def client(context: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


@pytest.mark.parametrize("shape", sorted(PEERS))
def test_each_peer_answers_frigates_protocol_with_the_devices_rows(model, tmp_path, shape):
    expected = ssd_rows(*simulated_device.SimulatedTpuEngine.load(model, None)._values)
    assert expected[:, 1].max() > 0  # the photo's objects: a reply of zeros would not pass for rows
    tensor = np.random.default_rng(0).integers(0, 256, (1, SIZE, SIZE, 3), dtype=np.uint8)
    head = json.dumps({"shape": list(tensor.shape), "dtype": "uint8", "model_type": "ssd"}).encode()
    endpoint = f"ipc://{tmp_path}/peer"
    with NaivePeer(model, 1.0, endpoint, shape), zmq.Context() as context:
        socks = [client(context, endpoint) for _ in range(3)]
        try:
            check = json.loads(request(socks[0], json.dumps({"model_request": True, "model_name": NAME}).encode())[0])
            assert check == {"model_available": True, "model_loaded": True}
            for sock in socks:  # three requests in flight at once
                sock.send_multipart([head, tensor.tobytes()])
            for sock in socks:
                np.testing.assert_array_equal(decode(sock.recv_multipart()), expected)
            assert not decode(request(socks[1], head, tensor.tobytes()[:-1])).any()  # a short tensor: zeros
        finally:
            for sock in socks:
                sock.close(linger=0)
