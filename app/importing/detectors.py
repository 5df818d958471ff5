"""Which detector a .tflite is, read from the file itself: its output tensors (shapes, types, quantization), the
ops that make them, and its metadata; written to model.json as `outputs` (role -> tensor name) and `detection`
(the decoder and its parameters, app/model_dir/schema.py DetectionSpec).

The families a Coral owner brings:

- **SSD / EfficientDet-Lite** ending in TFLite_Detection_PostProcess (TF1, TF2 object-detection API and Model
  Maker exports alike): the op decodes; its four outputs are read from the op (converter/importer.py). Decoder
  `postprocess`.
- **Ultralytics' one tensor** (YOLOv8, v11 and later; YOLOv5 with its objectness): one output [1, 4 + C, N], or
  [1, N, 4 + C] transposed. N, the candidates, is the anchor count of strides 8, 16, 32 (and 64 for the P6
  models) at the input's size: N anchors mean one per grid cell (box, then C class scores), 3N mean YOLOv5's
  three anchors per cell (box, objectness, C class scores). Boxes are xywh; their scale (fractions of the input,
  as Ultralytics' TFLite exports write them, or pixels) is read from the output's quantization range (a range
  topping out near 1 cannot hold pixels, one of a hundred cannot be fractions); a float output gives no range,
  and then Ultralytics' own metadata says fractions, or --box-scale tells. Decoder `yolo`.
- **The Coral layout Frigate serves** (YOLOv9 and others exported for the Edge TPU): class logits [1, N, C] and
  DFL box distributions [1, N, 64] (4 sides x reg_max 16 bins), told apart by shape, not by order; a third
  [1, N, 1] output (a max-score tensor some exports add) is not read. Decoder `yolo_dfl`.

Class scores are probabilities when the tensor is made by a LOGISTIC (looked for through the edge, shape and
concatenation ops before it, not further: a SiLU backbone is full of LOGISTICs), logits when its range
reaches well below 0, else as the family writes them. Where the file cannot tell (a class count, which of two
[1, N, 64] tensors holds the classes, pixels or fractions in a float output), the import stops with the reason
and the flag that tells: --classes, --output ROLE=TENSOR, --box-scale, --strides, --scores.

Ultralytics exports carry their metadata in the zip appended to the file (names, imgsz, stride, task):
`temp_meta.txt`, a Python dict's repr with int keys (8.2-8.3), or `metadata.json` (8.4). Its names become the labels,
a file whose task is not `detect` is left to other importers, and it names the model's maker: Ultralytics, whose
preprocessing the model then follows (Family.maker; app/importing/preprocessing.py). So does YOLOv5's layout, three
anchors a cell with an objectness, which only its exports write and which carry no metadata.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.importing.metadata import Metadata
from app.importing.preprocessing import Maker
from app.model_dir.schema import (
    DECODER_ROLES,
    DEFAULT_REG_MAX,
    DEFAULT_STRIDES,
    POSTPROCESS,
    ULTRALYTICS,
    YOLO,
    YOLO_DFL,
    DetectionSpec,
    grid_cells,
)
from app.tflite_file import Subgraph, Tensor

EIGHT_BIT = ("INT8", "UINT8")
# The strides YOLO heads use: P3-P5, and P3-P6 for the P6 models ("yolov8n-p6").
STRIDE_SETS = (DEFAULT_STRIDES, (8, 16, 32, 64))
ANCHORS_PER_CELL_V5 = 3
# Ops between a head's last computing op and the output that move values without computing them.
PASS_THROUGH = frozenset({"TRANSPOSE", "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "QUANTIZE", "DEQUANTIZE", "CONCATENATION",
                          "STRIDED_SLICE", "SLICE", "PACK", "GATHER"})
# A quantized output range reaching this far: what it can hold (fractions of the input top out near 1, logits
# go well below 0, pixels reach a good part of the input's size).
NORMALIZED_MAX = 2.5
LOGITS_MIN = -1.0
ULTRALYTICS_METADATA, ULTRALYTICS_LITERAL = "metadata.json", "temp_meta.txt"
PREDICTIONS, = DECODER_ROLES[YOLO]
CLASS_LOGITS, BOX_DISTRIBUTIONS = DECODER_ROLES[YOLO_DFL]
# values per row of an export that suppresses inside the model: x1, y1, x2, y2, score, class (and a batch index)
END_TO_END_ROW = (6, 7)
# the most objects its maker's predictor keeps: `yolo predict`'s max_det, YOLOv5's detect.py's
ULTRALYTICS_MAX_DET, YOLOV5_MAX_DET = 300, 1000


class DetectorRefused(ValueError):
    """The file looks like a detector the service decodes, but something it needs cannot be read from it (or
    does not fit); the message names what and the flag that tells it."""


@dataclass
class DetectorOptions:
    """What a user can tell the importer about a detector (the `converter import` flags); None: read the file."""

    classes: int | None = None
    box_scale: str | None = None          # normalized | pixels
    box_format: str | None = None         # xywh | xyxy
    scores: str | None = None             # logits | probabilities
    strides: list[int] | None = None
    reg_max: int | None = None
    outputs: dict[str, str] = field(default_factory=dict)  # role -> tensor name, where shapes cannot tell
    min_score: float | None = None
    nms_iou: float | None = None
    max_detections: int | None = None
    class_agnostic: bool | None = None
    boxes: str | None = None              # a prior-box detector's: priors (raw locations) | decoded (corners)
    anchors: Path | None = None           # a prior-box detector's anchor file (docs/faces.md "Anchor files")

    def thresholds(self) -> dict:
        return {k: v for k, v in dict(min_score=self.min_score, nms_iou=self.nms_iou,
                                      max_detections=self.max_detections,
                                      class_agnostic=self.class_agnostic).items() if v is not None}


@dataclass(frozen=True)
class Family:
    """A detector recognised: what it is, its outputs by role, its decoding, and what the file says besides."""

    name: str                                  # said to the user: "Ultralytics YOLO (one tensor)", ...
    outputs: dict[str, str]                    # role -> tensor name
    spec: DetectionSpec
    origin: str                                # how each decoding fact was decided, recorded in model.json
    labels: list[str] | None = None            # the class names the file carries (Ultralytics' metadata)
    labels_origin: str | None = None
    resize: str = "letterbox"                  # how images meet the input: YOLO heads are trained letterboxed
    notes: tuple[str, ...] = ()
    maker: Maker | None = None                 # whose preprocessing the file says it follows (Ultralytics')
    files: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # kind -> (file name, bytes) it brings along

    @property
    def classes(self) -> int:
        return self.spec.classes


def postprocess_family(outputs: dict[str, str], num_classes: int, options: DetectorOptions) -> Family:
    """An SSD-style detector ending in TFLite_Detection_PostProcess (its outputs read from the op)."""
    kept = {k: v for k, v in options.thresholds().items() if k in ("min_score", "max_detections")}
    ignored = sorted(set(options.thresholds()) - set(kept))
    notes = (f"{', '.join(ignored)}: the post-process op's own options decide its NMS",) if ignored else ()
    return Family("SSD-style, ending in TFLite_Detection_PostProcess", outputs,
                  DetectionSpec(decoder=POSTPROCESS, classes=num_classes, **kept),
                  "TFLite_Detection_PostProcess decodes the boxes and suppresses overlaps inside the model",
                  resize="stretch", notes=notes)


# ---- what the file says besides its tensors -------------------------------------------------------------------

@dataclass(frozen=True)
class UltralyticsMetadata:
    names: list[str] | None
    task: str | None
    facts: dict
    source: str = ULTRALYTICS_METADATA   # the packed file it was read from

    @property
    def maker(self) -> Maker:
        version = self.facts.get("version")
        made = f", Ultralytics {version}" if isinstance(version, str) and version else ""
        return Maker(ULTRALYTICS, f"Ultralytics' metadata ({self.source} packed in the file{made})")


def ultralytics_metadata(metadata: Metadata) -> UltralyticsMetadata | None:
    """Ultralytics' export metadata: `metadata.json` in the appended zip (8.4), or (8.2-8.3) `temp_meta.txt`, a
    Python dict's repr with int keys (another packed .txt holding one is read too); None when the file has neither."""
    raw = metadata.packed.get(ULTRALYTICS_METADATA)
    found, source = None, ULTRALYTICS_METADATA
    if raw is not None:
        try:
            found = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            found = None
    if found is None:
        texts = sorted(metadata.packed, key=lambda name: name != ULTRALYTICS_LITERAL)  # temp_meta.txt first
        for name in texts:
            data = metadata.packed[name]
            if name.lower().endswith(".txt") and data.lstrip().startswith(b"{"):
                try:
                    found = ast.literal_eval(data.decode("utf-8"))
                except (UnicodeDecodeError, ValueError, SyntaxError, MemoryError, RecursionError):
                    continue
                source = name
                break
    if not isinstance(found, dict) or "names" not in found and "task" not in found:
        return None
    names = found.get("names")
    if isinstance(names, dict):
        try:
            by_id = {int(k): str(v) for k, v in names.items()}
        except (TypeError, ValueError):
            by_id = {}
        names = [by_id.get(i, "") for i in range(max(by_id) + 1)] if by_id else None
    elif isinstance(names, list):
        names = [str(n) for n in names]
    else:
        names = None
    return UltralyticsMetadata(names, found.get("task"), found, source)


# ---- reading the graph ------------------------------------------------------------------------------------------

def _producer(graph: Subgraph, tensor: int):
    return next((op for op in graph.operators if tensor in op.outputs), None)


def making_ops(graph: Subgraph, tensor: int) -> set[str]:
    """The ops that compute a tensor's values, found through the ops that only move values (PASS_THROUGH)."""
    found, seen, todo = set(), set(), [tensor]
    while todo:
        index = todo.pop()
        if index in seen or index < 0:
            continue
        seen.add(index)
        op = _producer(graph, index)
        if op is None:
            continue
        if op.opcode in PASS_THROUGH:
            inputs = op.inputs if op.opcode in ("CONCATENATION", "PACK") else op.inputs[:1]
            todo.extend(i for i in inputs if not graph.tensors[i].is_constant)
        else:
            found.add(op.opcode)
    return found


def value_range(graph: Subgraph, tensor: Tensor) -> tuple[float, float] | None:
    """The real range an 8-bit output (or the 8-bit tensor a DEQUANTIZE made a float output from) can hold."""
    if tensor.type not in EIGHT_BIT:
        op = _producer(graph, tensor.index)
        if op is None or op.opcode != "DEQUANTIZE":
            return None
        tensor = graph.tensors[op.inputs[0]]
    q = tensor.quantization
    if tensor.type not in EIGHT_BIT or q is None or len(q.scale) != 1:
        return None
    low, high = (-128, 127) if tensor.type == "INT8" else (0, 255)
    scale, zero_point = float(q.scale[0]), int(q.zero_point[0])
    return scale * (low - zero_point), scale * (high - zero_point)


def _shape(tensor: Tensor) -> tuple[int, ...]:
    """The shape without leading 1s beyond a rank of 2 ([1, 84, 2100] -> (84, 2100))."""
    shape = tuple(tensor.shape)
    while len(shape) > 2 and shape[0] == 1:
        shape = shape[1:]
    return shape


def _describe(tensors: Sequence[Tensor]) -> str:
    return ", ".join(f"{t.name!r} {t.type.lower()} {list(t.shape)}" for t in tensors)


# ---- recognition --------------------------------------------------------------------------------------------------

def recognise(graph: Subgraph, width: int, height: int, metadata: Metadata, options: DetectorOptions,
              file_name: str, compiled: bool = False) -> Family | None:
    """The YOLO family of a graph without TFLite_Detection_PostProcess, or None when its outputs are not a YOLO
    head's (a classifier's, or a task another importer reads). DetectorRefused where it is one but the file
    cannot tell something the decoder needs."""
    meta = ultralytics_metadata(metadata)
    if meta is not None and meta.task not in (None, "detect"):
        return None  # Ultralytics' segment, pose, classify, obb: not this importer's
    outputs = [graph.tensors[i] for i in graph.outputs]
    shaped = [t for t in outputs if len(_shape(t)) == 2 and min(_shape(t)) >= 1]
    if not shaped or len(shaped) != len(outputs):
        return None
    yolo_roles = DECODER_ROLES[YOLO] + DECODER_ROLES[YOLO_DFL]
    unknown = sorted(set(options.outputs) - set(yolo_roles))
    if unknown:
        raise DetectorRefused(f"--output {unknown[0]}=...: {file_name}'s outputs ({_describe(outputs)}) are not a "
                              f"detector's that reads {unknown[0]!r}; a YOLO detector's roles are {yolo_roles}, a "
                              f"face detector's with prior boxes boxes, scores and landmarks ([1, N, 4], [1, N, 2], "
                              f"[1, N, 2L]), an embedder's embedding (with --task embedding)")
    if len(outputs) == 1 and _one_head_tensor(outputs[0]):
        return _one_tensor(graph, outputs[0], width, height, meta, options, file_name, compiled)
    if len(outputs) in (2, 3):
        return _dfl_pair(graph, outputs, width, height, meta, options, file_name, compiled)
    return None


def _one_head_tensor(tensor: Tensor) -> bool:
    """[1, A, N] or [1, N, A] of 8-bit or float values, A of at least a box and a class and N well above it: the
    shape of Ultralytics' one output (not a classifier's [1, C], a keypoint list or a segmentation map)."""
    if len(tensor.shape) != 3 or tensor.shape[0] != 1 or tensor.type not in (*EIGHT_BIT, "FLOAT32"):
        return False
    small, large = sorted(tensor.shape[1:])
    return small >= 5 and large >= 2 * small


def _anchor_counts(width: int, height: int, strides: list[int] | None) -> dict[int, tuple[tuple[int, ...], int]]:
    """Candidate count -> (strides, anchors per cell) for the stride sets a head may have at this input size."""
    sets = (tuple(strides),) if strides else STRIDE_SETS
    counts = {}
    for stride_set in sets:
        n = grid_cells(width, height, stride_set)
        counts.setdefault(n, (stride_set, 1))
        counts.setdefault(ANCHORS_PER_CELL_V5 * n, (stride_set, ANCHORS_PER_CELL_V5))
    return counts


def _one_tensor(graph: Subgraph, tensor: Tensor, width: int, height: int, meta: UltralyticsMetadata | None,
                options: DetectorOptions, file_name: str, compiled: bool) -> Family:
    """Ultralytics' [1, 4 + C, N] (or [1, N, 4 + C]; YOLOv5: [1, N, 5 + C])."""
    a, b = _shape(tensor)
    counts = _anchor_counts(width, height, options.strides)
    facts = []
    if b in counts and a not in counts:
        layout, n, attributes = "attributes_first", b, a
    elif a in counts and b not in counts:
        layout, n, attributes = "anchors_first", a, b
    elif a in counts and b in counts:
        raise DetectorRefused(f"{file_name}'s output {tensor.name!r} {list(tensor.shape)}: both sides are an anchor "
                              f"count at {width}x{height}, so which one lists the candidates cannot be told")
    elif min(a, b) in END_TO_END_ROW and options.strides is None:
        raise DetectorRefused(
            f"{file_name}'s output {tensor.name!r} {list(tensor.shape)} looks like detections already suppressed "
            f"inside the model ({max(a, b)} rows of box, score and class: Ultralytics' nms=True, or an end-to-end "
            "head such as YOLOv10's or YOLO26's), not a head's candidates. Export without it (Ultralytics: nms=False, "
            "end2end=False): this service decodes the head and runs NMS on the CPU")
    else:
        expected = ", ".join(f"{n} (strides {list(s)}{', 3 anchors a cell' if k > 1 else ''})"
                             for n, (s, k) in sorted(counts.items()))
        raise DetectorRefused(
            f"{file_name}'s output {tensor.name!r} {list(tensor.shape)} is not a YOLO head's at its "
            f"{width}x{height} input: a head lists one candidate per grid cell of each stride, {expected}; "
            "give --strides if the model uses others")
    facts.append(f"{layout.replace('_', ' ')}: [{'1, ' if len(tensor.shape) == 3 else ''}"
                 f"{a}, {b}] holds {n} candidates")
    strides, per_cell = counts[n]
    classes, origin = _class_count(options, meta, attributes - 4 - (per_cell > 1), "the shape")
    objectness = attributes - 4 - classes
    if objectness not in (0, 1) or classes < 1:
        raise DetectorRefused(f"{file_name}'s output {tensor.name!r} holds {attributes} values per candidate, which "
                              f"is not 4 box values{' and an objectness' if per_cell > 1 else ''} and {classes} "
                              "classes: give --classes with the model's class count")
    if per_cell > 1 and not objectness:
        raise DetectorRefused(f"{file_name}'s output lists {n} candidates, three a grid cell (YOLOv5's anchors), but "
                              f"{attributes} values per candidate leave no objectness beside {classes} classes")
    facts.append(f"{classes} classes ({origin})" + (", YOLOv5's objectness after the box" if objectness else ""))
    box_scale, scale_origin = _box_scale(graph, tensor, width, height, meta, options, file_name)
    facts.append(f"boxes {options.box_format or 'xywh'} {box_scale} ({scale_origin})")
    activation, activation_origin = _activation(graph, tensor, options, "none", compiled,
                                                "class scores as Ultralytics' exports give them, after a sigmoid")
    facts.append(f"class scores {'logits' if activation == 'sigmoid' else 'probabilities'} ({activation_origin})")
    maker = meta.maker if meta is not None else None
    if maker is None and per_cell > 1:
        maker = Maker(ULTRALYTICS, f"YOLOv5's layout: [1, {n}, {attributes}], three anchors a grid cell of strides "
                                   f"{list(strides)} with an objectness, which only Ultralytics' YOLOv5 exports "
                                   "write (they carry no metadata)")
    spec = DetectionSpec(decoder=YOLO, classes=classes, layout=layout, box_format=options.box_format or "xywh",
                         box_scale=box_scale, objectness=bool(objectness), score_activation=activation,
                         **_makers_thresholds(options, maker, per_cell > 1))
    notes = [f"strides {list(strides)}" + (", 3 anchors a cell" if per_cell > 1 else "")]
    labels, labels_origin = _labels(meta, classes)
    name = "YOLOv5 (one tensor, objectness)" if objectness else "Ultralytics YOLO (one tensor)"
    return Family(name, {PREDICTIONS: tensor.name}, spec, "; ".join(facts), labels, labels_origin,
                  notes=tuple(notes), maker=maker)


def _makers_thresholds(options: DetectorOptions, maker: Maker | None, yolov5: bool) -> dict:
    """The thresholds given, and where its maker's predictor keeps more objects than DEFAULT_MAX_DETECTIONS, its
    own cap (`yolo predict`'s max_det 300, YOLOv5's detect.py 1000)."""
    given = options.thresholds()
    if maker is not None and maker.convention == ULTRALYTICS:
        given.setdefault("max_detections", YOLOV5_MAX_DET if yolov5 else ULTRALYTICS_MAX_DET)
    return given


def _class_count(options: DetectorOptions, meta: UltralyticsMetadata | None, from_shape: int,
                 shape_origin: str) -> tuple[int, str]:
    if options.classes is not None:
        return options.classes, "--classes as given"
    if meta is not None and meta.names:
        return len(meta.names), f"the {len(meta.names)} names in Ultralytics' metadata"
    return from_shape, shape_origin


def _box_scale(graph: Subgraph, tensor: Tensor, width: int, height: int, meta: UltralyticsMetadata | None,
               options: DetectorOptions, file_name: str) -> tuple[str, str]:
    if options.box_scale:
        return options.box_scale, "--box-scale as given"
    found = value_range(graph, tensor)
    if found is not None:
        low, high = found
        if high <= NORMALIZED_MAX:
            return "normalized", (f"the output's quantization holds values up to {high:.3g}: fractions of the "
                                  "input, not pixels")
        if high >= min(width, height) / 4:
            return "pixels", f"the output's quantization holds values up to {high:.4g}: pixels of the input"
        if meta is not None:
            return "normalized", (f"Ultralytics' metadata: its TFLite exports write boxes as fractions of the input "
                                  f"(ultralytics#7371); the output's quantization, up to {high:.3g}, does not tell")
        raise DetectorRefused(f"{file_name}'s output {tensor.name!r} holds values up to {high:.3g}, which fits "
                              f"neither boxes in fractions of the input nor in pixels of its {width}x{height}: "
                              "give --box-scale normalized or --box-scale pixels")
    if meta is not None:
        return "normalized", ("Ultralytics' metadata: its TFLite exports write boxes as fractions of the input "
                              "(ultralytics#7371)")
    raise DetectorRefused(f"{file_name}'s output {tensor.name!r} is float32, so its range does not say whether "
                          "the boxes are fractions of the input (Ultralytics' TFLite exports) or its pixels: give "
                          "--box-scale normalized or --box-scale pixels")


def _activation(graph: Subgraph, tensor: Tensor, options: DetectorOptions, default: str, compiled: bool,
                default_origin: str) -> tuple[str, str]:
    """sigmoid (the tensor holds logits) or none (probabilities), and why."""
    if options.scores:
        return ("sigmoid" if options.scores == "logits" else "none"), f"--scores {options.scores} as given"
    if not compiled:
        makers = making_ops(graph, tensor.index)
        if "LOGISTIC" in makers:
            return "none", "made by a LOGISTIC: probabilities"
    found = value_range(graph, tensor)
    if found is not None and found[0] < LOGITS_MIN:
        return "sigmoid", f"the tensor's quantization reaches {found[0]:.3g}: logits, the decoder applies a sigmoid"
    if found is not None and found[0] >= -0.05 and found[1] <= NORMALIZED_MAX:
        return "none", f"the tensor's quantization holds {found[0]:.2g}..{found[1]:.3g}: probabilities"
    return default, default_origin


def _labels(meta: UltralyticsMetadata | None, classes: int) -> tuple[list[str] | None, str | None]:
    if meta is None or not meta.names:
        return None, None
    if len(meta.names) != classes:
        return None, None
    return meta.names, f"Ultralytics' metadata ({meta.source} packed in the file: {classes} names)"


def _dfl_pair(graph: Subgraph, outputs: list[Tensor], width: int, height: int, meta: UltralyticsMetadata | None,
              options: DetectorOptions, file_name: str, compiled: bool) -> Family | None:
    """Class logits [1, N, C] and DFL distributions [1, N, 4 x reg_max], told apart by shape (or --output)."""
    rows = {_shape(t)[0] for t in outputs}
    if len(rows) != 1 or any(len(t.shape) != 3 for t in outputs):
        return None
    reg_max = options.reg_max or DEFAULT_REG_MAX
    by_name = {t.name: t for t in outputs}
    for role, name in options.outputs.items():
        if name not in by_name:
            raise DetectorRefused(f"--output {role}={name}: {file_name} has no output {name!r} (its outputs: "
                                  f"{_describe(outputs)})")
    named = {role: by_name[name] for role, name in options.outputs.items() if role in DECODER_ROLES[YOLO_DFL]}
    rest = [t for t in outputs if t not in named.values()]
    if BOX_DISTRIBUTIONS not in named:
        boxes = [t for t in rest if t.shape[-1] == 4 * reg_max]
        if len(boxes) != 1:
            if not boxes:
                return None
            raise DetectorRefused(f"{file_name} has {len(boxes)} outputs of {4 * reg_max} values per candidate "
                                  f"({_describe(boxes)}): which holds the DFL box distributions and which the "
                                  f"{4 * reg_max} classes cannot be told by shape; give --output "
                                  f"class_logits=TENSOR (and --output box_distributions=TENSOR)")
        named[BOX_DISTRIBUTIONS] = boxes[0]
        rest = [t for t in rest if t is not boxes[0]]
    if CLASS_LOGITS not in named:
        scores = [t for t in rest if t.shape[-1] > 1] or ([rest[0]] if len(rest) == 1 else [])
        if len(scores) != 1:
            raise DetectorRefused(f"{file_name}'s outputs ({_describe(outputs)}) hold DFL box distributions but "
                                  "not one class tensor [1, N, C] beside them: give --output class_logits=TENSOR")
        named[CLASS_LOGITS] = scores[0]
    logits, boxes = named[CLASS_LOGITS], named[BOX_DISTRIBUTIONS]
    if boxes.shape[-1] != 4 * reg_max:
        raise DetectorRefused(f"{file_name}'s box distributions {boxes.name!r} {list(boxes.shape)} are not 4 sides x "
                              f"{reg_max} bins: give --reg-max")
    n = _shape(boxes)[0]
    counts = {k: v for k, v in _anchor_counts(width, height, options.strides).items() if v[1] == 1}
    if n not in counts:
        expected = ", ".join(f"{count} for strides {list(s)}" for count, (s, _) in sorted(counts.items()))
        raise DetectorRefused(f"{file_name}'s outputs list {n} candidates; at its {width}x{height} input a head has "
                              f"one per grid cell: {expected}. Give --strides if the model uses others")
    strides = list(counts[n][0])
    classes = logits.shape[-1]
    if options.classes is not None and options.classes != classes:
        raise DetectorRefused(f"--classes {options.classes}, but {file_name}'s class tensor {logits.name!r} has "
                              f"{classes} per candidate")
    activation, activation_origin = _activation(graph, logits, options, "sigmoid", compiled,
                                                "class logits, as Frigate's yolo-generic reads them")
    facts = [f"class logits {logits.name!r} {list(logits.shape)} and DFL box distributions {boxes.name!r} "
             f"{list(boxes.shape)}, told apart by shape" if not options.outputs else "roles by --output",
             f"{n} anchors at strides {strides}, reg_max {reg_max}",
             f"class scores {'logits' if activation == 'sigmoid' else 'probabilities'} ({activation_origin})"]
    unused = [t for t in outputs if t not in (logits, boxes)]
    notes = [f"output {t.name!r} {list(t.shape)} is not read (a max-score tensor some exports add)" for t in unused]
    maker = meta.maker if meta is not None else None
    spec = DetectionSpec(decoder=YOLO_DFL, classes=classes, strides=strides, reg_max=reg_max,
                         score_activation=activation, **_makers_thresholds(options, maker, yolov5=False))
    labels, labels_origin = _labels(meta, classes)
    return Family("YOLO in the Coral layout (class logits + DFL, as Frigate's yolo-generic)",
                  {CLASS_LOGITS: logits.name, BOX_DISTRIBUTIONS: boxes.name}, spec, "; ".join(facts),
                  labels, labels_origin, notes=tuple(notes), maker=maker)
