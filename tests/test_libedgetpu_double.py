"""The libedgetpu TEST DOUBLE's delegate computes what it claims, so tests through it can fail.

Its delegate takes the uint8/int8 QUANTIZE operators and computes them in C. With TFLite's
default XNNPACK delegate left out, it gets both of the committed model's (input and output),
and the whole output tensor must equal the CPU kernels' byte for byte on real photos.
"""

import ctypes

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter, OpResolverType, load_delegate

from app.imaging import prepare
from app.model_dir.reading import read_model_dir
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.doubles.libedgetpu import DEVICES, INVOKE_LOG, libedgetpu_double  # noqa: F401

MAX_PIXELS = 50_000_000
NO_DEFAULT_DELEGATES = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES


@pytest.fixture(scope="module")
def model():
    return read_model_dir(MODELS / DEFAULT_MODEL)


def run(interpreter: Interpreter, pixels: np.ndarray) -> np.ndarray:
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], pixels[None])
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).copy()


def test_the_delegate_computes_both_quantize_operators_as_the_cpu_does(
        libedgetpu_double, model, monkeypatch, tmp_path, cat_png, coffee_png, china_jpg):
    monkeypatch.setenv(DEVICES, "pci:/dev/apex_0")
    monkeypatch.setenv(INVOKE_LOG, str(tmp_path / "invoked"))
    path = str(model.file("int8"))
    delegated = Interpreter(model_path=path, experimental_delegates=[load_delegate(str(libedgetpu_double))],
                            experimental_op_resolver_type=NO_DEFAULT_DELEGATES)
    reference = Interpreter(model_path=path, experimental_op_resolver_type=NO_DEFAULT_DELEGATES)
    delegated.allocate_tensors()
    reference.allocate_tensors()
    counter = ctypes.CDLL(str(libedgetpu_double)).edgetpu_test_double_invocations
    counter.restype = ctypes.c_long
    before = counter()
    photos = (cat_png, coffee_png, china_jpg)
    for photo in photos:
        pixels = prepare(photo.read_bytes(), model.manifest.input, MAX_PIXELS)
        assert np.array_equal(run(delegated, pixels), run(reference, pixels)), photo.name
    # two partitions (the model's first and last operator), each a delegated kernel, per inference
    assert counter() - before == 2 * len(photos)
    lines = (tmp_path / "invoked").read_text().splitlines()
    assert sorted(set(lines)) == ["invoked device= ops=1 QUANTIZE:int8>uint8",
                                  "invoked device= ops=1 QUANTIZE:uint8>int8"]
