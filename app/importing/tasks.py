"""What an imported .tflite is for, read from its graph: segmentation, pose, or what the importer knew before
(a classifier, a detector); and whether its float operators are a part the CPU runs around an integer model.

`python -m converter import` (converter/importer.py) calls this module for what it adds to the import:

    the graph --> integer_parts(): its weighted layers must be 8-bit (a float or dynamic-range model is
                  refused); float elementwise operators around them (MoveNet's CAST of its uint8 input, the
                  DEQUANTIZE ... SQRT, DIV ... QUANTIZE islands of its keypoint decoding) are a CPU part,
                  as edgetpu_compiler leaves them, and are noted
              --> recognise(): one output that is
                    an ARG_MAX over the channels, int32/int64 [1, H, W]   -> segmentation (a class map: DeepLab)
                    per-pixel class scores [1, H, W, C] at the input size -> segmentation (U-Net)
                    float32 [1, 1, 17, 3] (y, x, score)                   -> pose (MoveNet SinglePose)
                    a vector [1, D], D >= 32, made by pooling (AVERAGE_POOL_2D, MEAN) or L2_NORMALIZATION, and no
                    labels                                                -> embedding (Coral's embedding extractor)
                  with --task embedding (or --output embedding=TENSOR), the one output vector [1, D] among the
                  model's outputs (MobileFaceNet's 128 values beside a [1, 2] mask classifier), or the one named;
                  or None: the importer's classifier and detector rules decide.
              --> raw_input(): an 8-bit input without quantization that the model casts to float itself
                  (MoveNet): the pixels go in as they are

Where the graph cannot tell (per-pixel scores smaller than the input could be a segmenter's or keypoint
heatmaps), it refuses and asks for `--task`; a `--task` the graph contradicts is refused with what that task
needs. Coral's PoseNet and BodyPix files end in PosenetDecoderOp, a custom op of Coral's own library
(libcoral's posenet_decoder.so) that neither TFLite's runtime nor the emulator has: refused, with the reason.

Pure: it reads the parsed graph (app/tflite_file.py), never runs it. Refusals are `TaskRefused`; the importer
turns them into its ImportRefused.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from app.detection_postprocess import POSTPROCESS_OP
from app.edgetpu.compat import EIGHT_BIT
from app.edgetpu.compiled_model import EDGETPU_CUSTOM_OP
from app.tasks.embed import MIN_DIMENSION, VECTOR
from app.tasks.pose import KEYPOINT_NAMES, KEYPOINTS
from app.tasks.segment import CLASS_MAP, CLASS_MAP_TYPES
from app.tflite_file import Operator, Subgraph, Tensor

CLASSIFICATION, DETECTION, SEGMENTATION, POSE, EMBEDDING = (
    "classification", "detection", "segmentation", "pose", "embedding")
TASKS = (CLASSIFICATION, DETECTION, SEGMENTATION, POSE, EMBEDDING)
# What each task needs of a file, said when --task asks for one the graph is not.
NEEDS = {
    CLASSIFICATION: "one output of class scores, [1, classes]",
    DETECTION: f"outputs made by {POSTPROCESS_OP} (boxes, classes, scores, count)",
    SEGMENTATION: "one output: an ARG_MAX class map int32/int64 [1, H, W], or per-pixel class scores [1, H, W, C]",
    POSE: f"one output of {len(KEYPOINT_NAMES)} keypoints, float32 [1, 1, {len(KEYPOINT_NAMES)}, 3] as (y, x, "
          "score) normalized to the input (MoveNet SinglePose)",
    EMBEDDING: f"an output vector [1, D] of D >= {MIN_DIMENSION} values, 8-bit or float32 (in a model with several "
               "outputs, the only one, or the one --output embedding=TENSOR names)",
}
# What makes an output an embedding without --task: pooled features (Coral's embedding extractor: MobileNet v1
# without its classifier, AVERAGE_POOL_2D then a reshape), or a normalized vector (FaceNet-like exports).
EMBEDDING_MAKERS = ("AVERAGE_POOL_2D", "MEAN", "L2_NORMALIZATION")
# Coral's PoseNet and BodyPix decoder: a custom op in libcoral (coral/pose_estimation/posenet_decoder_op.cc).
POSENET_DECODER = "PosenetDecoderOp"
# Operators that carry weights: in a full-integer model they compute on 8-bit tensors. Float ones make a float
# model; int8 weights with float activations, a dynamic-range quantized one. Neither runs on the Edge TPU.
WEIGHTED_OPS = frozenset({
    "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", "CONV_3D", "CONV_3D_TRANSPOSE",
    "BATCH_MATMUL", "UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM", "LSTM", "SVDF",
    "UNIDIRECTIONAL_SEQUENCE_RNN", "RNN", "EMBEDDING_LOOKUP",
})
FLOAT_TYPES = ("FLOAT32", "FLOAT16")
# Operators at the boundaries between the integer and the float parts, and the shape-only ones the importer looks
# through to find what made an output.
EDGE_OPS = ("QUANTIZE", "DEQUANTIZE", "CAST")
SHAPE_OPS = ("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
# Operators whose float tensors are theirs by design: a detector's post-processing, the compiled Edge TPU op.
OWN_FLOAT_OPS = (POSTPROCESS_OP, EDGETPU_CUSTOM_OP)
MULTIPOSE_COLUMNS = 56  # MoveNet MultiPose: [1, 6, 56], 17 keypoints x 3 and a box with its score


class TaskRefused(Exception):
    """The graph is not one the service serves as it is, or not the task asked for; the message says why."""


@dataclass(frozen=True)
class IntegerParts:
    """A full-integer model's float parts: the float operators the CPU runs (by opcode), and whether the input is
    8-bit without quantization, cast to float by the model itself (its pixels go in as they are)."""

    float_ops: Counter
    raw_input: bool

    def note(self) -> str | None:
        if not self.float_ops:
            return None
        ops = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(self.float_ops.items()))
        return (f"float operators ({ops}) compute between or after the 8-bit layers, as the file was converted: "
                "they run on the CPU (the Edge TPU computes in 8 bits), on every backend as in TFLite")


@dataclass(frozen=True)
class Recognised:
    """A task read from the graph: its output tensor, the roles model.json names, and why."""

    task: str
    classes: int       # segmentation: the classes of the map; pose: the keypoints
    output: Tensor
    outputs: dict[str, str]
    why: str


def integer_parts(graph: Subgraph, name: str) -> IntegerParts:
    """TaskRefused unless the model's weighted layers are 8-bit and it computes in 8 bits somewhere; else its
    float parts."""
    float_ops: Counter = Counter()
    integer = 0
    for op in graph.operators:
        if op.opcode in OWN_FLOAT_OPS:
            integer += op.opcode == EDGETPU_CUSTOM_OP
            continue
        tensors = [graph.tensors[i] for i in (*op.inputs, *op.outputs) if i >= 0]
        floating = next((t for t in tensors if t.type in FLOAT_TYPES), None)
        if op.opcode in WEIGHTED_OPS and floating is not None:
            raise TaskRefused(_float_model(name, op, graph, floating))
        if op.opcode in EDGE_OPS:
            continue
        if floating is not None:
            float_ops[op.opcode] += 1
        elif any(graph.tensors[i].type in EIGHT_BIT for i in op.outputs):
            integer += 1
    if not integer:
        floating = next((t for t in graph.tensors if t.type in FLOAT_TYPES), None)
        what = f"tensor {floating.name!r} is {floating.type}" if floating is not None else "no operator computes in 8 bits"
        raise TaskRefused(f"{name} is a float model ({what}), not full-integer: {_quantize_advice(name)}")
    return IntegerParts(float_ops, raw_input(graph))


_QUANTIZE_ADVICE = (
    "the Edge TPU and the int8 backends run only full-integer models. Quantize it from the model it was converted "
    "from (Keras, SavedModel, PyTorch or ONNX) with `python -m converter quantize MODEL --calibration photos/ ...`; "
    "a float .tflite itself cannot be calibrated")
# The float and dynamic-range files an Ultralytics TFLite export writes (onnx2tf's names, its _dynamic_range_quant
# renamed _int8), beside the one full-integer file with 8-bit edges that the Edge TPU and the service run.
ULTRALYTICS_SIBLINGS = ("_int8.tflite", "_dynamic_range_quant.tflite", "_float16.tflite", "_float32.tflite")
FULL_INTEGER_SUFFIX = "_full_integer_quant.tflite"


def full_integer_twin(name: str) -> str | None:
    """The full-integer file an Ultralytics export writes beside a float or dynamic-range file of this name."""
    for suffix in ULTRALYTICS_SIBLINGS:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[:-len(suffix)] + FULL_INTEGER_SUFFIX
    return None


def _quantize_advice(name: str) -> str:
    twin = full_integer_twin(name)
    if twin is None:
        return _QUANTIZE_ADVICE
    return (f"the Edge TPU and the int8 backends run only full-integer models. If it comes from an Ultralytics "
            f"TFLite export (int8=True), that export wrote {twin} beside it: the same model, full-integer with int8 "
            f"input and output; import that one. Otherwise: {_QUANTIZE_ADVICE[_QUANTIZE_ADVICE.index('Quantize'):]}")


def _float_model(name: str, op: Operator, graph: Subgraph, floating: Tensor) -> str:
    weights = graph.tensors[op.inputs[1]] if len(op.inputs) > 1 and op.inputs[1] >= 0 else None
    if weights is not None and weights.type in EIGHT_BIT:
        return (f"{name} is dynamic-range quantized, not full-integer: its {op.opcode} #{op.index} has 8-bit weights "
                f"but computes on {floating.type} (tensor {floating.name!r}): {_quantize_advice(name)}")
    return (f"{name} is a float model (tensor {floating.name!r} is {floating.type}), not full-integer: "
            f"{_quantize_advice(name)}")


def raw_input(graph: Subgraph) -> bool:
    """The input is 8-bit without quantization and every operator reading it casts it to float: the model takes
    the values themselves (MoveNet: CAST uint8 -> float32, then its own normalization inside)."""
    if len(graph.inputs) != 1:
        return False
    index = graph.inputs[0]
    tensor = graph.tensors[index]
    if tensor.type not in EIGHT_BIT or tensor.quantization is not None:
        return False
    readers = [op for op in graph.operators if index in op.inputs]
    return bool(readers) and all(op.opcode == "CAST" and graph.tensors[op.outputs[0]].type in FLOAT_TYPES
                                 for op in readers)


def _producer(graph: Subgraph, tensor: int) -> Operator | None:
    return next((op for op in graph.operators if tensor in op.outputs), None)


def _made_by(graph: Subgraph, tensor: int) -> Operator | None:
    """The operator that computes an output's values, looking through reshapes and type edges."""
    op = _producer(graph, tensor)
    while op is not None and op.opcode in (*SHAPE_OPS, *EDGE_OPS):
        op = _producer(graph, op.inputs[0])
    return op


def _describe(tensor: Tensor) -> str:
    return f"{tensor.name!r} {tensor.type.lower()} {list(tensor.shape)}"


def recognise(graph: Subgraph, image: Tensor, name: str, given: str | None = None,
              named: dict[str, str] | None = None, labelled: bool = False) -> Recognised | None:
    """Segmentation, pose or an embedding from the graph's outputs, or None (a classifier or detector: the
    importer's own rules); TaskRefused for what the service cannot serve as it is, and where only --task can tell.
    `named`: the roles --output names (role -> tensor); `labelled`: --labels was given (a classifier's, then)."""
    if given is not None and given not in TASKS:
        raise TaskRefused(f"--task {given!r}: the service serves {', '.join(TASKS)}")
    named = named or {}
    if given == EMBEDDING or (given is None and VECTOR in named):
        return _embedding(graph, name, named.get(VECTOR), "--task embedding" if given else
                          f"--output {VECTOR}={named.get(VECTOR)}")
    decoder = next((op for op in graph.operators if op.opcode == POSENET_DECODER), None)
    if decoder is not None:
        raise TaskRefused(
            f"{name} ends in {POSENET_DECODER} (operator #{decoder.index}), Coral's own custom operator (PoseNet and "
            "BodyPix: libcoral's posenet_decoder.so decodes poses from the heatmaps on the CPU). Neither TFLite's "
            "runtime nor the service's emulator has it, so the model cannot run here on any backend, and the Edge "
            "TPU part alone would give heatmaps, not poses. For pose estimation import MoveNet SinglePose "
            "(movenet_single_pose_lightning_ptq.tflite or _thunder_), which decodes its keypoints with builtin "
            "operators")
    if len(graph.outputs) != 1:
        if given in (SEGMENTATION, POSE):
            raise TaskRefused(f"{name} has {len(graph.outputs)} outputs; --task {given} needs {NEEDS[given]}")
        return None
    index = graph.outputs[0]
    output = graph.tensors[index]
    found = (_class_map(graph, index, output, name) or _keypoints(output, name)
             or _scores_map(output, image, name, given)
             or (None if given or labelled else _pooled_vector(graph, index, output)))
    if found is None:
        if given in (SEGMENTATION, POSE):
            raise TaskRefused(f"{name}'s output {_describe(output)} does not fit --task {given}: it needs "
                              f"{NEEDS[given]}")
        return None
    if given is not None and given != found.task:
        raise TaskRefused(f"{name} is a {found.task} model ({found.why}); --task {given} needs {NEEDS[given]}")
    return found


def _class_map(graph: Subgraph, index: int, output: Tensor, name: str) -> Recognised | None:
    """An ARG_MAX over the channels of [1, H, W, C] scores, int32/int64 [1, H, W] (or [1, H, W, 1])."""
    op = _made_by(graph, index)
    if op is None or op.opcode != "ARG_MAX":
        return None
    scores = graph.tensors[op.inputs[0]]
    axis = graph.tensors[op.inputs[1]].data if len(op.inputs) > 1 else None
    shape = tuple(output.shape)
    if (len(scores.shape) != 4 or axis is None or int(axis.reshape(-1)[0]) not in (3, -1)
            or shape not in ((1, *scores.shape[1:3]), (1, *scores.shape[1:3], 1))):
        raise TaskRefused(f"{name}'s output {_describe(output)} comes from an ARG_MAX over {_describe(scores)} that is "
                          "not a class map: the service reads ARG_MAX over the channels of [1, H, W, C] scores, "
                          "[1, H, W]")
    if output.type not in CLASS_MAP_TYPES:
        raise TaskRefused(f"{name}'s class map {_describe(output)} is not int32 or int64")
    classes = int(scores.shape[3])
    return Recognised(SEGMENTATION, classes, output, {CLASS_MAP: output.name},
                      f"its output {_describe(output)} is an ARG_MAX over the {classes} channels of "
                      f"{_describe(scores)}: a class map, one class per pixel")


def _keypoints(output: Tensor, name: str) -> Recognised | None:
    """MoveNet SinglePose's [1, 1, 17, 3]; MoveNet MultiPose's [1, 6, 56] is refused by name."""
    shape = tuple(output.shape)
    keypoints = len(KEYPOINT_NAMES)
    if len(shape) == 3 and shape[0] == 1 and shape[2] == MULTIPOSE_COLUMNS and output.type in FLOAT_TYPES:
        raise TaskRefused(f"{name}'s output {_describe(output)} is MoveNet MultiPose's (up to {shape[1]} people, "
                          f"{keypoints} keypoints and a box each): the service serves MoveNet SinglePose, [1, 1, "
                          f"{keypoints}, 3]")
    if len(shape) != 4 or shape[:2] != (1, 1) or shape[3] != 3 or shape[2] < 2:
        return None  # [1, 1, 1, 3]: three class scores, a classifier's
    if shape[2] != keypoints:
        raise TaskRefused(f"{name}'s output {_describe(output)} has {shape[2]} keypoints: the service reads "
                          f"{keypoints} COCO keypoints (MoveNet SinglePose, [1, 1, {keypoints}, 3])")
    if output.type not in (*FLOAT_TYPES, *EIGHT_BIT) or (output.type in EIGHT_BIT and output.quantization is None):
        raise TaskRefused(f"{name}'s keypoints {_describe(output)} are neither float nor quantized 8-bit")
    return Recognised(POSE, keypoints, output, {KEYPOINTS: output.name},
                      f"its output {_describe(output)} is MoveNet SinglePose's: {keypoints} keypoints as (y, x, "
                      "score), normalized to the input")


def _scores_map(output: Tensor, image: Tensor, name: str, given: str | None) -> Recognised | None:
    """Per-pixel class scores [1, H, W, C]: segmentation when the map has the input's size (or --task says so)."""
    shape = tuple(output.shape)
    if len(shape) != 4 or shape[0] != 1 or shape[1] * shape[2] < 2 or shape[3] < 2:
        return None
    if output.type not in (*FLOAT_TYPES, *EIGHT_BIT):
        return None
    classes = int(shape[3])
    at_input = tuple(shape[1:3]) == tuple(image.shape[1:3])
    if not at_input and given != SEGMENTATION:
        raise TaskRefused(
            f"{name}'s output {_describe(output)} is a map of {classes} values per position, smaller than the "
            f"{image.shape[1]}x{image.shape[2]} input: per-pixel class scores (segmentation) at a lower resolution, "
            "or heatmaps of some other task (keypoints, detection) that need their own decoding. The file does not "
            "say which: give --task segmentation if it is a segmenter (the service takes the highest-scoring class "
            "per position and scales the map to the image)")
    why = ("at the input's size" if at_input else "--task segmentation as given")
    return Recognised(SEGMENTATION, classes, output, {CLASS_MAP: output.name},
                      f"its output {_describe(output)} holds {classes} class scores per pixel ({why}): the class of "
                      "a pixel is the highest-scoring one")


def _is_vector(tensor: Tensor) -> bool:
    """[1, D] (or [1, 1, 1, D]) of D >= MIN_DIMENSION values, 8-bit quantized or float32."""
    shape = tuple(tensor.shape)
    fits = len(shape) >= 2 and all(d == 1 for d in shape[:-1]) and shape[-1] >= MIN_DIMENSION
    return fits and (tensor.type == "FLOAT32" or tensor.type in EIGHT_BIT and tensor.quantization is not None)


def _embedding(graph: Subgraph, name: str, tensor_name: str | None, asked: str) -> Recognised:
    """The embedding output --task embedding asks for: the one named, else the model's only output vector."""
    outputs = [graph.tensors[i] for i in graph.outputs]
    listed = ", ".join(_describe(t) for t in outputs)
    if tensor_name is not None:
        chosen = [t for t in outputs if t.name == tensor_name]
        if not chosen:
            raise TaskRefused(f"--output {VECTOR}={tensor_name}: {name} has no output {tensor_name!r} (its outputs: "
                              f"{listed})")
        if not _is_vector(chosen[0]):
            raise TaskRefused(f"--output {VECTOR}={tensor_name}: {_describe(chosen[0])} is not an embedding: "
                              f"{NEEDS[EMBEDDING]}")
        why = f"--output {VECTOR}={tensor_name} as given"
    else:
        chosen = [t for t in outputs if _is_vector(t)]
        if len(chosen) != 1:
            if not chosen:
                raise TaskRefused(f"{asked}: {name} has no output an embedding can be ({listed}); it needs "
                                  f"{NEEDS[EMBEDDING]}")
            raise TaskRefused(f"{asked}: {name} has {len(chosen)} outputs that could be the embedding "
                              f"({', '.join(_describe(t) for t in chosen)}): give --output {VECTOR}=TENSOR with the "
                              "one that is")
        why = f"{asked}: its one output vector" if len(outputs) == 1 else \
            f"{asked}: its only output vector among {len(outputs)} outputs ({listed})"
    output = chosen[0]
    dimension = int(output.shape[-1])
    return Recognised(EMBEDDING, dimension, output, {VECTOR: output.name},
                      f"{why}: {_describe(output)}, a {dimension}-value embedding")


def _pooled_vector(graph: Subgraph, index: int, output: Tensor) -> Recognised | None:
    """A vector made by pooling or L2_NORMALIZATION: features, not class scores (Coral's embedding extractor)."""
    op = _made_by(graph, index)
    if op is None or op.opcode not in EMBEDDING_MAKERS or not _is_vector(output):
        return None
    dimension = int(output.shape[-1])
    return Recognised(EMBEDDING, dimension, output, {VECTOR: output.name},
                      f"its one output {_describe(output)} comes from {op.opcode} (operator #{op.index}): "
                      f"{dimension} pooled features, not class scores (a classifier ends in a FULLY_CONNECTED, a "
                      "convolution or a SOFTMAX), as Coral's embedding extractor; --task classification if it is a "
                      "classifier")