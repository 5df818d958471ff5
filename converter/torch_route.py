"""PyTorch (.pt2) and ONNX classifiers -> full-integer TFLite with no TRANSPOSE, no float op, batch 1.

The route, measured to give an Edge TPU clean graph (docs: docs/converter.md "PyTorch and ONNX models"):

  1. the model as a torch module: a `torch.export` ExportedProgram (.pt2), or an ONNX graph
     rebuilt as torch operations by converter/onnx_import.py;
  2. `litert_torch.to_channel_last_io` + `litert_torch.convert`: NHWC in, float TFLite out, the
     NCHW layout rewritten inside the graph (no TRANSPOSE around the convolutions);
  3. `ai_edge_quantizer`'s `static_wi8_ai8` recipe: int8 weights per channel, int8 activations per
     tensor, calibrated on the representative images with the GLOBAL min/max of each tensor over all
     samples (the quantizer's default averages the per-sample ranges, which clips the tails: about
     10 points of top-1 agreement lost on ImageNet models).

The quantizer writes int8 input and output tensors (it has no uint8 I/O): the service quantizes
pixels with the model's own input scale and zero point, so int8 I/O is served as uint8 is.
Routes that were measured and are NOT taken: litert-torch's PT2E quantization (TRANSPOSE and
DEQUANTIZE left in: 1 of 141 ops on the Edge TPU), onnxruntime QDQ models (not clean either).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from converter.quantize import QuantizeError

TORCH_SUFFIXES = (".pt2",)
ONNX_SUFFIXES = (".onnx",)
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
EXPORT_HINT = ("save it with torch.export.save(torch.export.export(model.eval(), (example,)), 'model.pt2') "
               "where example = torch.randn(1, C, H, W)")
# ai-edge-quantizer recipe: int8 weights (per channel) and int8 activations on every supported op
RECIPE = "static_wi8_ai8"
ROUTE = f"litert-torch + ai-edge-quantizer {RECIPE}: per-channel int8 weights, global min/max calibration"


def is_torch_or_onnx(path: Path) -> bool:
    return Path(path).suffix.lower() in TORCH_SUFFIXES + ONNX_SUFFIXES + PICKLE_SUFFIXES


def import_route():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import ai_edge_quantizer  # noqa: F401
        import litert_torch  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        raise QuantizeError(f"the PyTorch/ONNX route needs the converter extra: pip install "
                            f"'edgetpu-serve[convert]' (litert-torch, ai-edge-quantizer, torch, onnx): {e}") from None


def load_module(path: Path, height: int, width: int, channels: int):
    """The float model as a torch module taking one NCHW float32 batch-1 tensor."""
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file():
        raise QuantizeError(f"{path} does not exist")
    if suffix in PICKLE_SUFFIXES:
        raise QuantizeError(_pickle_explanation(path))
    import_route()
    if suffix in ONNX_SUFFIXES:
        from converter.onnx_import import module_from_onnx

        # traced at the served shape (ONNX exporters often leave the batch dynamic: it is 1 here)
        module = prepare(module_from_onnx(path), height, width, channels, what=str(path))
    else:
        module, expected = _module_from_pt2(path)
        if expected[1:] != (channels, height, width):
            raise QuantizeError(f"{path} takes input of shape {expected}, but --channels {channels} --height {height} "
                                f"--width {width} say (1, {channels}, {height}, {width}): the served image must be what "
                                "the model was exported with")
    return module


def _pickle_explanation(path: Path) -> str:
    kind = "a pickled PyTorch file"
    try:
        import torch

        loaded = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(loaded, dict) and loaded and all(hasattr(v, "shape") for v in loaded.values()):
            kind = f"a state_dict ({len(loaded)} tensors, no architecture)"
    except Exception:  # noqa: BLE001 - only used to name what the file is
        pass
    return (f"{path} is {kind}: weights alone cannot be converted without the model's code. Load it into your "
            f"model class, then {EXPORT_HINT}, and quantize the .pt2")


def _module_from_pt2(path: Path):
    import torch

    try:
        program = torch.export.load(str(path))
    except Exception as e:  # noqa: BLE001 - torch raises several kinds for a file that is not a .pt2
        raise QuantizeError(f"{path} is not a torch.export program ({type(e).__name__}: {e}); {EXPORT_HINT}") from None
    inputs = [spec for spec in program.graph_signature.input_specs if spec.kind.name == "USER_INPUT"]
    if len(inputs) != 1:
        raise QuantizeError(f"{path}: expected one image input, the program takes {len(inputs)}")
    node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == inputs[0].arg.name)
    shape = tuple(node.meta["val"].shape)
    if len(shape) != 4:
        raise QuantizeError(f"{path}: expected an NCHW image input (1, C, H, W), got shape {shape}")
    if not all(isinstance(d, int) for d in shape):
        raise QuantizeError(f"{path} has a dynamic input shape {shape}: the Edge TPU runs batch 1 with static shapes; "
                            f"export without dynamic_shapes: {EXPORT_HINT}")
    if shape[0] != 1:
        raise QuantizeError(f"{path} was exported with batch {shape[0]}: the Edge TPU runs batch 1; {EXPORT_HINT}")
    return _global_pool_without_transpose(program.module()), shape


def _global_pool_without_transpose(module):
    """Rewrite `x.mean((2, 3))` (no keepdim) on a 4-D tensor as mean(keepdim=True) + flatten.

    The channel-last rewrite turns the keepdim=False form into TRANSPOSE + MEAN, and TRANSPOSE is not
    an Edge TPU op (it and everything after it would run on the CPU); the keepdim form maps. Same values.
    """
    import torch

    graph = module.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.mean.dim:
            continue
        source, dims = node.args[0], node.args[1]
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        value = source.meta.get("val") if hasattr(source, "meta") else None
        if keepdim or value is None or value.dim() != 4 or sorted(d % 4 for d in dims) != [2, 3]:
            continue
        with graph.inserting_after(node):
            flat = graph.call_function(torch.ops.aten.flatten.using_ints, (node, 1))
        node.replace_all_uses_with(flat, delete_user_cb=lambda user: user is not flat)
        node.args = (source, [2, 3], True)
        node.kwargs = {}
        changed = True
    if changed:
        graph.lint()
        module.recompile()
    return module


def prepare(module, height: int, width: int, channels: int, what: str = "the model"):
    """A torch module, exported at batch 1 (1, channels, height, width), with the global pool rewritten."""
    import torch

    try:
        program = torch.export.export(module.eval(), (torch.zeros(1, channels, height, width),))
    except QuantizeError:
        raise
    except Exception as e:  # noqa: BLE001 - a shape mismatch shows up here as one of many torch errors
        raise QuantizeError(f"{what} does not run on a (1, {channels}, {height}, {width}) input: "
                            f"{type(e).__name__}: {e}") from None
    return _global_pool_without_transpose(program.module())


def to_int8(module, height: int, width: int, channels: int, representative: Iterable[np.ndarray]) -> bytes:
    """The whole route after loading: float TFLite, calibrated int8, and the check that no float op is left."""
    tflite = quantize_tflite(float_tflite(module, height, width, channels), representative)
    left = float_ops_left(tflite)
    if left:
        raise QuantizeError(
            "the quantizer left float operators in the model: " + ", ".join(f"{k} x{v}" for k, v in left.items())
            + "; the Edge TPU takes integer ops only: replace them in the model (e.g. GELU/SiLU -> ReLU6, "
            "LayerNorm -> BatchNorm) and export again")
    return tflite


def float_tflite(module, height: int, width: int, channels: int) -> bytes:
    """litert-torch: NHWC float32 TFLite of the module (its NCHW input made channel-last inside the graph)."""
    import litert_torch
    import torch

    channel_last = litert_torch.to_channel_last_io(module, args=[0])
    sample = (torch.zeros(1, height, width, channels),)
    try:
        return bytes(litert_torch.convert(channel_last, sample).model_content())
    except Exception as e:  # noqa: BLE001 - litert-torch raises many kinds; the message says which op
        raise QuantizeError(f"litert-torch could not convert the model: {type(e).__name__}: {e}") from e


def quantize_tflite(float_model: bytes, representative: Iterable[np.ndarray]) -> bytes:
    """ai-edge-quantizer static int8, calibrated with each tensor's global min/max over every sample.

    representative yields float32 (1, H, W, C) inputs, normalised as the float model expects.
    """
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import calibrator, quantizer, recipe
    from ai_edge_quantizer.utils import qsv_utils

    signatures = Interpreter(model_content=float_model).get_signature_list()
    if len(signatures) != 1:
        raise QuantizeError(f"expected one signature in the float model, got {sorted(signatures)}")
    (key, signature), = signatures.items()
    (input_name,) = signature["inputs"]
    data = {key: [{input_name: np.asarray(x, np.float32)} for x in representative]}
    if not data[key]:
        raise QuantizeError("no calibration samples")
    q = quantizer.Quantizer(float_model, getattr(recipe, RECIPE)())
    # global min/max over all samples (qsv_utils.min_max_update), not the default moving average
    calib = calibrator.Calibrator(float_model, num_threads=1, qsv_update_func=qsv_utils.min_max_update)
    calib.calibrate(data, q._recipe_manager)  # the Quantizer's own calibrate() offers no update function
    result = q.quantize(calib.get_model_qsvs(), enable_progress_report=False)
    return bytes(result.quantized_model)


def float_ops_left(tflite: bytes) -> dict[str, int]:
    """Operators of the int8 model that still read or write a float tensor (the quantizer left them float)."""
    from collections import Counter

    from app.tflite_file import read_tflite

    graph = read_tflite(tflite).graph
    floats = {i for i, t in enumerate(graph.tensors) if t.type in ("FLOAT32", "FLOAT16")}
    return dict(Counter(op.opcode for op in graph.operators
                        if floats & {i for i in (*op.inputs, *op.outputs) if i >= 0}))


def torch_scorer(module, spec):
    """uint8 HxWxC pixels -> float logits of the torch module (NCHW, normalised as model.json says)."""
    import torch

    from converter.calibration import normalise

    def score(pixels: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(normalise(pixels, spec).transpose(0, 3, 1, 2).copy())
        with torch.no_grad():
            return module(x).numpy().reshape(-1)
    return score
