"""Full-integer post-training quantization: float Keras/SavedModel -> int8 TFLite.

Every weight and activation becomes int8 (per-channel weights, per-tensor activations),
the input and output uint8 by default (the Edge TPU convention; int8 by choice), batch 1
and static shapes. Calibration runs the float model over a representative dataset and
records each tensor's range; for a tensor with range [lo, hi] the quantizer picks
`scale = (hi - lo) / 255` and a zero point so that `real = scale * (q - zero_point)`.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

INTEGER_DTYPES = {"uint8": np.uint8, "int8": np.int8}
# The TFLite converter prints its progress through absl/TF logging at import; keep it quiet.
_TF_LOG_LEVEL = "2"


class QuantizeError(Exception):
    pass


def import_tensorflow():
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", _TF_LOG_LEVEL)
    try:
        import tensorflow as tf
    except ImportError:
        raise QuantizeError(
            "the converter needs TensorFlow: pip install 'edgetpu-serve[convert]' (tensorflow-cpu)"
        ) from None
    return tf


def saved_model_from(model_path: Path, workdir: Path) -> Path:
    """A SavedModel directory for a Keras file (.keras, .h5) or an existing SavedModel."""
    model_path = Path(model_path)
    if model_path.is_dir():
        if not (model_path / "saved_model.pb").is_file():
            raise QuantizeError(f"{model_path} is a directory without saved_model.pb: not a SavedModel")
        return model_path
    if model_path.suffix in (".keras", ".h5"):
        import_tensorflow()
        import keras

        return export_keras(keras.models.load_model(model_path, compile=False), workdir)
    if model_path.suffix == ".tflite":
        raise QuantizeError(tflite_explanation(model_path))
    if not model_path.exists():
        raise QuantizeError(f"{model_path} does not exist")
    raise QuantizeError(f"{model_path}: expected a .keras or .h5 file or a SavedModel directory")


def tflite_explanation(path: Path) -> str:
    """Why a .tflite is not quantized here: what it is (float or already integer) and what to do instead."""
    from app.tflite_file import TfliteFileError, read_tflite

    try:
        graph = read_tflite(path).graph
    except TfliteFileError as e:
        return f"{path} has the .tflite suffix but is not a readable TFLite model ({e})"
    float_tensors = [t.name for t in graph.tensors if t.type in ("FLOAT32", "FLOAT16")]
    if not float_tensors:
        return (f"{path} is already an integer TFLite model: there is nothing left to quantize. Serve it as it is: "
                f"`python -m converter import {path} --name NAME` makes its model directory (labels and input spec "
                "from the file), which `compile` then takes; or quantize again from its float source model.")
    return (
        f"{path} is a float TFLite model ({len(float_tensors)} float tensors, e.g. {float_tensors[0]!r}). "
        "Full-integer quantization needs the float source model (Keras .keras/.h5 or a SavedModel): "
        "calibration runs the float graph over representative images to learn each activation's range, "
        "and TensorFlow's converter does that only from a TensorFlow graph, not from a converted .tflite. "
        "Quantize from the model you converted it from.")


def export_keras(model, workdir: Path) -> Path:
    """Keras 3 model -> SavedModel with a batch-1 signature.

    TF 2.21's from_keras_model fails on Keras 3 models, so the route is a SavedModel.
    Keras exports a batch dimension of None by default, which would leave a dynamic
    shape in the TFLite graph; the Edge TPU needs every shape static and batch 1.
    """
    tf = import_tensorflow()
    if len(model.inputs) != 1:
        raise QuantizeError(f"expected a model with one input, {model.name} has {len(model.inputs)}")
    shape = (1, *model.inputs[0].shape[1:])
    if None in shape:
        raise QuantizeError(f"input shape {tuple(model.inputs[0].shape)} must be static apart from the batch")
    target = Path(workdir) / "saved_model"
    model.export(str(target), verbose=False,
                 input_signature=[tf.TensorSpec(shape, tf.float32, name=model.inputs[0].name)])
    return target


def quantize(
    saved_model: Path,
    representative: Callable[[], Iterable[np.ndarray]],
    io_type: str = "uint8",
    output_type: str | None = None,
    float_tail: bool = False,
    float_ops: tuple[str, ...] = (),
) -> bytes:
    """Convert with calibration; representative() yields float32 (1, H, W, C) inputs (or what the model's own
    input takes, with float_tail).

    output_type (default: io_type) "float32" keeps float outputs: a detector ending in TFLite_Detection_PostProcess,
    whose outputs are float by definition, as the TF object-detection API's TFLite exports have them.

    float_tail: every operator with an int8 kernel is still quantized, and those without one (SQRT, DIV, the
    int32 index arithmetic of a keypoint decoder) keep TFLite's float kernels, between QUANTIZE/DEQUANTIZE;
    the input and output keep the model's own types (a uint8 input it casts itself, a float32 output). This
    is how MoveNet's post-training-quantized files were converted: an integer network for the Edge TPU with
    its decoding after it, on the CPU. Without it, a float op fails the conversion. float_ops (TFLite operator
    names; with float_tail) stay float even where an int8 kernel exists: the converter MoveNet's files came
    from had none for SQRT and DIV, TensorFlow 2.21's has."""
    if io_type not in INTEGER_DTYPES:
        raise QuantizeError(f"input/output type must be one of {sorted(INTEGER_DTYPES)}, got {io_type!r}")
    output_type = io_type if output_type is None else output_type
    if output_type not in (*INTEGER_DTYPES, "float32"):
        raise QuantizeError(f"output type must be one of {sorted(INTEGER_DTYPES)} or float32, got {output_type!r}")
    tf = import_tensorflow()
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([sample] for sample in representative())
    if float_tail:
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
    else:
        # Integer kernels only: a float op left in the graph fails conversion instead of
        # silently producing a hybrid model the Edge TPU cannot take.
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = getattr(tf, io_type)
        converter.inference_output_type = getattr(tf, output_type)
    if float_ops and not float_tail:
        raise QuantizeError("float_ops leaves operators in float: it needs float_tail")
    try:
        if not float_ops:
            return converter.convert()
        from tensorflow.lite.python.convert import mlir_quantize

        # calibrate, then quantize every operator but those named, as TFLite's quantization debugger does
        converter._experimental_calibrate_only = True
        return mlir_quantize(converter.convert(), denylisted_ops=list(float_ops))
    except Exception as e:  # the converter raises ConverterError, ValueError, RuntimeError...
        raise QuantizeError(f"TFLite conversion failed: {e}") from e


def describe(tflite: bytes) -> dict:
    """Operators, I/O quantization, and a check that no float tensor is left."""
    from ai_edge_litert.interpreter import Interpreter

    with tempfile.NamedTemporaryFile(suffix=".tflite") as f:
        f.write(tflite)
        f.flush()
        interpreter = Interpreter(model_path=f.name)
        ops = Counter(op["op_name"] for op in interpreter._get_ops_details())
        tensors = interpreter.get_tensor_details()
        inp = interpreter.get_input_details()[0]
        out = interpreter.get_output_details()[0]
    float_tensors = [t["name"] for t in tensors if np.dtype(t["dtype"]).kind == "f"]
    if float_tensors:
        raise QuantizeError(f"not a full-integer model: float tensors left: {float_tensors[:5]}")
    dynamic = [t["name"] for t in (inp, out) if -1 in list(t.get("shape_signature", t["shape"]))]
    if dynamic:
        raise QuantizeError(f"dynamic shapes left in {dynamic}: build the model with a fixed batch size of 1")

    def quant(detail):
        scale, zero_point = detail["quantization"]
        return {
            "dtype": np.dtype(detail["dtype"]).name,
            "shape": [int(d) for d in detail["shape"]],
            "scale": float(scale),
            "zero_point": int(zero_point),
        }

    return {"operators": dict(sorted(ops.items())), "input": quant(inp), "output": quant(out)}
