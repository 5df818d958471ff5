"""A .tflite file read and checked: what its graph is, or why the service cannot serve it (ImportRefused).

Moved here from converter/importer.py, whose `import` calls it, so that the service checks an uploaded file
the same way without importing the converter.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.detection_postprocess import (
    OUTPUT_ROLES,
    POSTPROCESS_OP,
    PostProcessError,
    outputs_by_role,
    postprocess_ops,
    read_options,
)
from app.edgetpu.compat import EIGHT_BIT
from app.edgetpu.compiled_model import EDGETPU_CUSTOM_OP
from app.importing import faces
from app.importing.detectors import DetectorOptions, DetectorRefused, Family, postprocess_family
from app.importing.detectors import recognise as recognise_detector
from app.importing.metadata import Metadata, MetadataError, read_metadata
from app.importing.tasks import NEEDS, TaskRefused, integer_parts
from app.importing.tasks import recognise as recognise_task
from app.tflite_file import Subgraph, Tensor, TfliteFileError, TfliteModel, read_tflite

# The edges of a float-I/O model (a QUANTIZE in, a DEQUANTIZE out).
EDGE_OPS = ("QUANTIZE", "DEQUANTIZE")


class ImportRefused(Exception):
    """The file cannot be imported as it is; the message says why and what would work."""


@dataclass(frozen=True)
class TfliteSource:
    """One file handed over, read and parsed once. `path` names it in messages (an upload: its name only)."""

    path: Path
    data: bytes
    model: TfliteModel
    metadata: Metadata  # its TFLite metadata (labels, normalization, ...; empty when it has none)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def compiled(self) -> bool:
        return any(op.opcode == EDGETPU_CUSTOM_OP for op in self.model.graph.operators)

    @property
    def graph(self) -> Subgraph:
        return self.model.graph


def read_tflite_source(path: Path, data: bytes) -> TfliteSource:
    """The bytes of a .tflite file parsed; ImportRefused with the reason if they are empty, truncated or not TFLite."""
    path = Path(path)
    if len(data) < 8 or data[4:8] != b"TFL3":
        kind = "an empty file" if not data else "not a TFLite model (no TFL3 identifier at byte 4)"
        raise ImportRefused(f"{path} is {kind}: give the .tflite file itself (a model zoo download, Model "
                            "Maker's export, or what TFLiteConverter wrote)")
    try:
        model = read_tflite(data)
        if not model.subgraphs:
            raise TfliteFileError("it has no subgraph")
    except TfliteFileError as e:
        raise ImportRefused(f"{path} is not a readable TFLite model ({e}); if it was downloaded, the download "
                            "may be truncated: download it again") from None
    except Exception as e:  # a flatbuffer cut short fails deep in its reader
        raise ImportRefused(f"{path} is not a readable TFLite model ({type(e).__name__}: {e}); it may be "
                            "truncated: download it again") from None
    try:
        metadata = read_metadata(data)
    except MetadataError as e:
        raise ImportRefused(f"{path}: {e}") from None
    except Exception as e:  # the model's own table, read lazily for its metadata list
        raise ImportRefused(f"{path} is not a readable TFLite model ({type(e).__name__}: {e}); it may be "
                            "truncated: download it again") from None
    return TfliteSource(path, data, model, metadata)


@dataclass(frozen=True)
class GraphFacts:
    input: Tensor
    task: str                 # classification | detection | segmentation | pose | embedding
    classes: int              # classification: outputs; detection: the model's classes; segmentation: classes;
                              # pose: keypoints; embedding: its dimension
    output: Tensor | None     # a classifier's, segmenter's, pose model's or embedder's output
    detector: Family | None   # a detector: its family, outputs by role and decoding (app/importing/detectors.py)
    outputs: dict[str, str] = field(default_factory=dict)  # segmentation, pose, embedding: role -> tensor name
    why: str = ""             # how the task was read from the graph
    raw_input: bool = False   # an 8-bit input without quantization, cast to float by the model (MoveNet)
    notes: tuple[str, ...] = ()


def producer(graph: Subgraph, tensor: int):
    """The operator that writes `tensor` (None for a graph input or a constant)."""
    return next((op for op in graph.operators if tensor in op.outputs), None)


def graph_facts(source: TfliteSource, detector: DetectorOptions | None = None, task: str | None = None,
                probe: faces.Probe | None = None, labelled: bool = False) -> GraphFacts:
    """What the graph is (the task `--task` names, when the graph alone cannot tell), or ImportRefused saying why
    the service cannot serve it. `probe` runs the model once (a face detector's box form is told by a run:
    app/importing/faces.py); without it such a detector is refused unless --boxes says its form. `labelled`:
    --labels was given (a model with labels is a classifier, never an embedder, unless --task says so)."""
    detector = detector or DetectorOptions()
    graph, name = source.graph, source.path.name
    if len(source.model.subgraphs) != 1 and not source.compiled:
        raise ImportRefused(f"{name} has {len(source.model.subgraphs)} subgraphs (control flow): the Edge TPU and "
                            "the service run single-graph models")
    if len(graph.inputs) != 1:
        names = ", ".join(f"{graph.tensors[i].name!r} {list(graph.tensors[i].shape)}" for i in graph.inputs)
        raise ImportRefused(f"{name} has {len(graph.inputs)} inputs ({names}): the service feeds a model one "
                            "image; import a model with a single image input")
    tensor = graph.tensors[graph.inputs[0]]
    shape = list(tensor.shape)
    if len(shape) != 4 or shape[0] != 1 or shape[3] not in (1, 3) or min(shape[1:3]) < 1:
        raise ImportRefused(f"{name}'s input {tensor.name!r} has shape {shape}, type {tensor.type}: not an image "
                            "input. The service feeds images as [1, height, width, 3] (RGB) or [1, height, width, 1] "
                            "(grey)")
    if tensor.type not in (*EIGHT_BIT, "FLOAT32"):
        raise ImportRefused(f"{name}'s input {tensor.name!r} is {tensor.type}: the service feeds uint8, int8 or "
                            "float32 images")
    if tensor.is_dynamic:
        raise ImportRefused(f"{name}'s input {tensor.name!r} has a dynamic shape {list(tensor.shape_signature)}: "
                            "the Edge TPU needs a fixed size; export the model with batch 1 and a fixed image size")
    try:  # app/importing/tasks.py: float parts around 8-bit layers, segmentation and pose
        parts = integer_parts(graph, name)
        recognised = recognise_task(graph, tensor, name, task, detector.outputs, labelled)
    except TaskRefused as e:
        raise ImportRefused(str(e)) from None
    if tensor.type in EIGHT_BIT and tensor.quantization is None and not parts.raw_input:
        raise ImportRefused(f"{name}'s input {tensor.name!r} is {tensor.type} without quantization parameters: "
                            "not a quantized model")
    notes = tuple(note for note in [parts.note()] if note)
    detectors = postprocess_ops(graph)
    if detectors:
        _given(name, task, "detection", f"it ends in {POSTPROCESS_OP}")
        family = _detector(name, graph, detectors, detector)
        return GraphFacts(tensor, "detection", family.classes, None, family, why=f"it ends in {POSTPROCESS_OP}",
                          raw_input=parts.raw_input, notes=notes)
    if recognised is not None:
        return GraphFacts(tensor, recognised.task, recognised.classes, recognised.output, None, recognised.outputs,
                          recognised.why, parts.raw_input, notes)
    try:
        face_detector = faces.recognise(graph, shape[2], shape[1], detector, name)
        if face_detector is not None:
            family = face_detector.family(None if source.compiled else probe, tensor)
        else:
            family = recognise_detector(graph, shape[2], shape[1], source.metadata, detector, name, source.compiled)
    except DetectorRefused as e:
        raise ImportRefused(str(e)) from None
    if family is not None:
        _given(name, task, "detection", f"its outputs are a {family.name} head")
        return GraphFacts(tensor, "detection", family.classes, None, family, why=family.origin,
                          raw_input=parts.raw_input, notes=notes)
    _given(name, task, "classification", "one output of class scores")
    if len(graph.outputs) != 1:
        names = ", ".join(repr(graph.tensors[i].name) for i in graph.outputs)
        raise ImportRefused(f"{name} has {len(graph.outputs)} outputs ({names}) and no {POSTPROCESS_OP} op: the "
                            "service serves classifiers (one output of class scores), SSD-style detectors "
                            f"ending in {POSTPROCESS_OP}, YOLO heads (Ultralytics' one tensor [1, 4 + C, N], or "
                            "class logits [1, N, C] with DFL boxes [1, N, 64]), face detectors with prior boxes "
                            "(boxes [1, N, 4] and scores [1, N, 2]), segmenters (one class map or per-pixel scores), "
                            "MoveNet SinglePose (one output of 17 keypoints) and embedders (--task embedding: an "
                            "output vector [1, D], e.g. MobileFaceNet's 128 values beside a [1, 2] mask output)")
    output = graph.tensors[graph.outputs[0]]
    if len(output.shape) < 2 or int(np.prod(output.shape[:-1])) != 1 or output.shape[-1] < 2:
        raise ImportRefused(f"{name}'s output {output.name!r} has shape {list(output.shape)}: a classifier's output "
                            "is one score per class, [1, classes]")
    if output.type not in (*EIGHT_BIT, "FLOAT32"):
        raise ImportRefused(f"{name}'s output {output.name!r} is {output.type}: expected uint8, int8 or float32 scores")
    return GraphFacts(tensor, "classification", int(output.shape[-1]), output, None,
                      why=f"its one output {output.name!r} {list(output.shape)} holds a score per class",
                      raw_input=parts.raw_input, notes=notes)


def _given(name: str, given: str | None, task: str, why: str) -> None:
    """ImportRefused when --task names another task than the graph is."""
    if given is not None and given != task:
        raise ImportRefused(f"{name} is a {task} model ({why}); --task {given} needs {NEEDS[given]}")


def _detector(name: str, graph: Subgraph, ops, detector: DetectorOptions) -> Family:
    if len(ops) != 1:
        raise ImportRefused(f"{name} has {len(ops)} {POSTPROCESS_OP} ops: a detector has one")
    op = ops[0]
    try:
        outputs = {role: tensor.name for role, tensor in outputs_by_role(graph, op).items()}
    except PostProcessError:
        raise ImportRefused(f"{name}'s {POSTPROCESS_OP} has {len(op.outputs)} outputs, not the 4 of the op "
                            f"({', '.join(OUTPUT_ROLES)})") from None
    if sorted(op.outputs) != sorted(graph.outputs):
        listed = [graph.tensors[t].name for t in graph.outputs]
        raise ImportRefused(f"{name}'s outputs {listed} are not the 4 outputs of its {POSTPROCESS_OP} op "
                            f"({list(outputs.values())}): the service reads boxes, classes, scores and count from it")
    try:
        options = read_options(op)
    except TfliteFileError as e:
        raise ImportRefused(f"{name}'s {POSTPROCESS_OP} op has options its kernel cannot read ({e}): cannot map its "
                            "classes") from None
    if options.num_classes < 1:
        raise ImportRefused(f"{name}'s {POSTPROCESS_OP} op has no num_classes in its options: cannot map its classes")
    return postprocess_family(outputs, options.num_classes, detector)
