import pytest

from app.edgetpu.compiled_model import read_compiled_model
from app.errors import ModelDirError
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.doubles.compiled_model_double import compiled_model_bytes


def test_reads_the_runtime_version_a_compiled_model_needs(tmp_path):
    path = tmp_path / "m_int8_edgetpu.tflite"
    path.write_bytes(compiled_model_bytes(min_runtime_version=15, compiler_version="16.0.384591198"))
    compiled = read_compiled_model(path)
    assert (compiled.edgetpu_ops, compiled.min_runtime_version, compiled.compiler_version) == (1, 15, "16.0.384591198")


def test_a_plain_int8_model_has_no_edgetpu_node():
    compiled = read_compiled_model(MODELS / DEFAULT_MODEL / f"{DEFAULT_MODEL}_int8.tflite")
    assert (compiled.edgetpu_ops, compiled.min_runtime_version) == (0, None)


def test_a_file_that_is_not_tflite_is_refused(tmp_path):
    path = tmp_path / "x.tflite"
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelDirError, match="is not a TFLite model"):
        read_compiled_model(path)
    path.write_bytes(b"\x10\x00\x00\x00TFL3" + b"\xff" * 8)
    with pytest.raises(ModelDirError, match="not a readable TFLite flatbuffer"):
        read_compiled_model(path)
