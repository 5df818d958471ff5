"""Frigate's model transfer at the ZMQ door (app/frontdoors/uploads.py, zmq_models.py), over a real loopback socket:
raw ZMTP peers (bench/zmtp_peer.py) hold an upload half sent, so that what comes meanwhile is seen as it is.

- the same bytes under the same name while the first is being written wait for it and get its answer: both ready;
- a different model meanwhile is answered "busy" at once, its frame never held;
- a name that already answers (case aside) is refused, unless the bytes are that model's own file;
- uploaded models are capped by count, and none is evicted;
- a writer whose peer goes away frees the write; names match case-insensitively in model_request too.
"""

from __future__ import annotations

import json
import shutil

import pytest

from app.frontdoors.served import ServedDetector
from app.api.deps import service_of
from app.frontdoors.uploads import REFUSED, ModelUploads
from app.frontdoors.zmtp import HASH
from app.settings import Settings
from bench.service import free_port
from bench.zmtp_peer import RawPeer, frame_head
from tests.conftest import MODELS
from tests.detection_models import tiny_detector
from tests.test_tasks import served

PERSON = "ssdlite_mobilenet_v2_person"
SIZE = 16
TIMEOUT_S = 60


@pytest.fixture
def door(tmp_path):
    shutil.copytree(MODELS / PERSON, tmp_path / PERSON)
    port = free_port()
    settings = Settings(model_dir=tmp_path, backends=["cpu"], workers=1, zmq_endpoint=f"tcp://127.0.0.1:{port}",
                        zmq_accept_models=True, zmq_max_uploaded_models=2)
    with served(settings) as (app, url):
        yield app, port, tmp_path


def upload_header(name: str) -> bytes:
    return json.dumps({"model_data": True, "model_name": name}).encode()


def peer(port: int) -> RawPeer:
    return RawPeer.tcp("127.0.0.1", port, TIMEOUT_S).handshake()


def begin(port: int, name: str, data: bytes, held_back: int = 10) -> RawPeer:
    """An upload sent but for its last `held_back` bytes."""
    raw = peer(port)
    head = upload_header(name)
    raw.send(frame_head(0, more=True) + frame_head(len(head), more=True) + head + frame_head(len(data))
             + data[:-held_back])
    return raw


def answer(raw: RawPeer) -> dict:
    frames = raw.read_message()
    assert len(frames) == 1, frames
    return json.loads(frames[0])


def model_dirs(root) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir()}


def test_two_frigates_sending_the_same_model_at_once_both_end_up_ready(door):
    app, port, root = door
    model = tiny_detector(SIZE, order="tf1")
    first = begin(port, "shared.tflite", model)
    second = peer(port)
    second.send_request([upload_header("SHARED.tflite"), model])  # whole, while the first is under way
    first.send(model[-10:])
    for raw in (first, second):
        got = answer(raw)
        assert got["model_saved"] and got["model_loaded"], got
    assert "shared" in model_dirs(root)
    assert service_of(app).registry.serving("shared") is not None


def test_another_file_under_the_same_name_meanwhile_is_refused(door):
    app, port, root = door
    first = begin(port, "shared.tflite", tiny_detector(SIZE, order="tf1"))
    second = peer(port)
    second.send_request([upload_header("shared.tflite"), tiny_detector(SIZE, order="tf2")])
    first.send(tiny_detector(SIZE, order="tf1")[-10:])
    assert answer(first)["model_saved"]
    got = answer(second)
    assert not got["model_saved"] and "another file named shared.tflite was being written" in got["message"], got


def test_a_different_model_meanwhile_is_busy_at_once_and_its_frame_never_held(door):
    app, port, root = door
    model = tiny_detector(SIZE, order="tf1")
    first = begin(port, "first.tflite", model)
    other = peer(port)
    other.send_request([upload_header("other.tflite"), tiny_detector(SIZE, order="tf2")])
    got = answer(other)  # while the first is still under way
    assert not got["model_saved"] and got["message"].startswith("busy: first.tflite is being written"), got
    assert "restart its detector" in got["message"]
    first.send(model[-10:])
    assert answer(first)["model_loaded"]
    assert "other" not in model_dirs(root)


def test_a_name_that_answers_already_is_refused_unless_the_bytes_are_that_models_own_file(door):
    app, port, root = door
    before = model_dirs(root)
    own = (MODELS / PERSON / f"{PERSON}_int8.tflite").read_bytes()
    raw = peer(port)
    raw.send_request([upload_header(f"{PERSON.upper()}_INT8.tflite"), tiny_detector(SIZE)])  # case aside: its file's
    got = answer(raw)
    assert not got["model_saved"] and f"model '{PERSON}' answers to" in got["message"], got
    raw.send_request([upload_header(f"{PERSON}_int8.tflite"), own])
    got = answer(raw)
    assert got["model_saved"] and got["model_loaded"] and "own file" in got["message"], got
    raw.send_request([json.dumps({"shape": [1, 300, 300, 3], "dtype": "uint8"}).encode(), bytes(300 * 300 * 3)])
    assert len(raw.read_message()[0]) == 480  # and the person detector answers this peer
    assert model_dirs(root) == before


def test_uploaded_models_are_capped_and_none_is_evicted(door):
    app, port, root = door
    raw = peer(port)
    for i, order in enumerate(("tf1", "tf2")):
        raw.send_request([upload_header(f"up{i}.tflite"), tiny_detector(SIZE, order=order)])
        assert answer(raw)["model_loaded"]
    raw.send_request([upload_header("third.tflite"), tiny_detector(SIZE, order="tf1", scales=2)])
    got = answer(raw)
    assert not got["model_saved"] and "2 uploaded models" in got["message"] and "none is removed" in got["message"]
    assert {"up0", "up1"} <= model_dirs(root) and "third" not in model_dirs(root)
    assert all(service_of(app).registry.serving(name) is not None for name in ("up0", "up1"))


def test_a_writer_that_goes_away_frees_the_write(door):
    app, port, root = door
    gone = begin(port, "gone.tflite", tiny_detector(SIZE, order="tf1"))
    gone.close()
    raw = peer(port)
    for _ in range(100):  # its connection's end reaches the door soon; until then another model is "busy"
        raw.send_request([upload_header("after.tflite"), tiny_detector(SIZE, order="tf2")])
        got = answer(raw)
        if not got["message"].startswith("busy"):
            break
    assert got["model_saved"] and got["model_loaded"], got
    assert "gone" not in model_dirs(root)


def test_a_model_request_matches_names_case_aside(door):
    app, port, root = door
    raw = peer(port)
    raw.send_request([json.dumps({"model_request": True, "model_name": PERSON.upper() + ".TFLITE"}).encode()])
    got = answer(raw)
    assert got["model_available"] and got["model_loaded"], got


# ---- the admission alone --------------------------------------------------------------------------------------

def detector(name: str, names=(), hashes=()) -> ServedDetector:
    import numpy as np

    return ServedDetector(name, (1, SIZE, SIZE, 3), np.dtype(np.uint8), "ssd", frozenset(names), True, "ready",
                          frozenset(hashes))


async def _admit_all(tmp_path):
    uploads = ModelUploads(lambda path: None, tmp_path, 1 << 20, True, max_models=8)
    served = [detector("person", names=["person_int8.tflite"], hashes=["ab" * 32])]
    cases = {
        "a peer outside ZMQ_UPLOAD_FROM": uploads.admit("x.tflite", 100, False, served),
        "too large": uploads.admit("x.tflite", (1 << 20) + 1, True, served),
        "not tflite": uploads.admit("x.onnx", 100, True, served),
        "answers (a file's name, case aside)": uploads.admit("PERSON_INT8.tflite", 100, True, served),
        "the writer": uploads.admit("new.tflite", 100, True, served),
        "the same name meanwhile": uploads.admit("NEW.tflite", 100, True, served),
        "another meanwhile": uploads.admit("other.tflite", 100, True, served),
    }
    off = ModelUploads(lambda path: None, tmp_path, 1 << 20, False).admit("x.tflite", 100, True, served)
    return cases, off, uploads


def test_each_upload_is_decided_from_its_name_and_size_before_its_bytes(tmp_path):
    import asyncio

    cases, off, uploads = asyncio.run(_admit_all(tmp_path))
    limits = {what: (t.limit, t.refusal) for what, t in cases.items()}
    outside = limits["a peer outside ZMQ_UPLOAD_FROM"]
    assert outside[0] == REFUSED and "ZMQ_UPLOAD_FROM" in outside[1]
    assert limits["too large"][0] == REFUSED and "ZMQ_MAX_MODEL_BYTES" in limits["too large"][1]
    assert limits["not tflite"][0] == REFUSED
    assert limits["answers (a file's name, case aside)"] == (HASH, None)
    assert limits["the writer"] == (100, None)  # the one upload held
    assert limits["the same name meanwhile"] == (HASH, None)
    assert cases["the same name meanwhile"].joins is cases["the writer"]
    assert limits["another meanwhile"][0] == REFUSED and limits["another meanwhile"][1].startswith("busy")
    assert off.limit == REFUSED and "ZMQ_ACCEPT_MODELS" in off.refusal
    uploads.release(cases["the writer"])
    assert uploads.writing is None
