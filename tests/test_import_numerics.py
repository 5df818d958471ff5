"""An imported TF1-style uint8 MobileNet computes what TFLite computes: the same top-5 on `cpu` as TFLite's
interpreter on the same preprocessed input, and on `emulated` the output bytes of TFLite's reference
kernels (BUILTIN_REF, in a subprocess: it can abort on a degenerate model). The model is built here
(tests/mobilenet_tf1.py: TensorFlow's TF1 converter, uint8 everywhere), imported with a 1000-line labels
file for its 1001 outputs, and served over a socket."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from app.emulator import Interpreter as Emulator
from app.imaging import prepare
from app.imaging.quantization import InputQuantizer
from app.model_dir.reading import read_model_dir
from converter.importer import ImportOptions, import_model
from converter.photos import sample_photos
from tests.conftest import Service
from tests.mobilenet_tf1 import CLASSES, build_mobilenet_uint8
from tests.reference_worker import ReferenceWorker

pytestmark = pytest.mark.slow

PHOTOS = 6
MAX_PIXELS = 50_000_000


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    work = tmp_path_factory.mktemp("mobilenet")
    photos = sample_photos()
    model = work / "mobilenet_v1_0.25_128_quant.tflite"
    model.write_bytes(build_mobilenet_uint8(photos[:16]))
    labels = work / "labels.txt"
    labels.write_text("".join(f"class {i}\n" for i in range(1, CLASSES)))  # 1000 names, no background
    done = import_model([model], ImportOptions(name="mobilenet_v1", out=work / "models", labels=labels))
    return read_model_dir(done.path), photos[:PHOTOS]


def tensor_of(model_dir, photo) -> np.ndarray:
    """The input tensor as the service makes it: decode, stretch, quantize with the input's own parameters."""
    spec = model_dir.manifest.input
    q = model_dir.manifest.quantization.input
    return InputQuantizer(spec, np.dtype(q.dtype), q.scale, q.zero_point)(prepare(photo.read_bytes(), spec, MAX_PIXELS))


def test_it_imports_as_coral_feeds_it(imported):
    model_dir, photos = imported
    assert model_dir.labels[0] == "background" and len(model_dir.labels) == CLASSES
    m = model_dir.manifest
    assert (m.input.mean, m.input.std, m.input.resize, m.output.scores) == ([128], [127.5], "stretch", "probabilities")
    assert set(m.quantization.operators) == {"CONV_2D", "DEPTHWISE_CONV_2D", "MEAN", "RESHAPE", "SOFTMAX"}
    assert m.edgetpu_analysis.startswith("all ") and m.edgetpu_estimate is not None


def test_cpu_gives_tflites_top5_on_the_same_input(imported):
    from ai_edge_litert.interpreter import Interpreter

    model_dir, photos = imported
    interpreter = Interpreter(model_path=str(model_dir.file("int8")))
    interpreter.allocate_tensors()
    env = {"EDGETPU_SERVE_MODEL_DIR": str(model_dir.path.parent), "EDGETPU_SERVE_BACKENDS": "cpu",
           "EDGETPU_SERVE_WORKERS": "1", "EDGETPU_SERVE_DEFAULT_MODEL": "mobilenet_v1"}
    distinct = []
    with Service(env, inherit_settings=False) as service, httpx.Client(base_url=service.url, timeout=60) as client:
        for photo in photos:
            interpreter.set_tensor(interpreter.get_input_details()[0]["index"], tensor_of(model_dir, photo))
            interpreter.invoke()
            out = interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).reshape(-1).astype(int)
            expected = np.argsort(-out, kind="stable")[:5].tolist()  # ties in class order, as the service
            answer = client.post("/v1/classify?backend=cpu&top_k=5", files={"image": photo.read_bytes()}).json()
            assert [p["index"] for p in answer["predictions"]] == expected, photo.name
            assert [p["score"] for p in answer["predictions"]] == pytest.approx([out[i] / 256 for i in expected])
            distinct.append(len(set(out.tolist())))
    assert max(distinct) >= 8, f"a degenerate model proves nothing: distinct output values {distinct}"


def test_emulated_gives_the_reference_kernels_bytes(imported):
    model_dir, photos = imported
    model = model_dir.file("int8").read_bytes()
    emulator = Emulator(model_content=model)
    emulator.allocate_tensors()
    reference = ReferenceWorker("BUILTIN_REF")
    try:
        for photo in photos:
            x = tensor_of(model_dir, photo)
            emulator.set_tensor(emulator.get_input_details()[0]["index"], x)
            emulator.invoke()
            ours = emulator.get_tensor(emulator.get_output_details()[0]["index"])
            (theirs,) = reference.run(model, [x])
            assert ours.tobytes() == theirs.tobytes(), photo.name
    finally:
        reference.close()
