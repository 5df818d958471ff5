"""TFLite_Detection_PostProcess, the op that ends SSD-style detectors: what the service and the converter know about it.

The custom operator (tensorflow/lite/kernels/detection_postprocess.cc) decodes an SSD head's box
encodings against its anchors and keeps the best boxes by non-maximum suppression. It runs on the
CPU: an accelerator's compiler leaves it after the part it maps, by design. Three facts about it are used
all over the project, so they live here, once:

- its name, the custom code a file gives it (POSTPROCESS_OP);
- its four outputs, always in the kernel's order (OUTPUT_ROLES), whatever order a file lists its
  subgraph's outputs in (TF1 exports list them as the op writes them, TF2 and Model Maker exports
  shuffle them): a detector's outputs are found by role on the op itself, never by position;
- its options, a flexbuffer map, read as the kernel's Init reads them (PostProcessOptions): the same
  conversions of stored types and the same defaults for missing keys.

Used by the emulator's kernel, the CPU engines (regular NMS runs on one thread), the Edge TPU
analysis (a host op after the Edge TPU's part), the converter (import, recipe, estimate, segment)
and the detection task. It reads graphs parsed by app/tflite_file.py and imports nothing else of
the project.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.tflite_file import Operator, Subgraph, Tensor, TfliteFileError

POSTPROCESS_OP = "TFLite_Detection_PostProcess"
# The op's outputs, in the order its kernel writes them: boxes [1, M, 4] (ymin, xmin, ymax, xmax, normalized),
# class ids [1, M] (from 0, the background skipped), scores [1, M], and the detection count [1], all float32.
OUTPUT_ROLES = ("boxes", "classes", "scores", "count")
# Init()'s defaults for the two options a file may leave out (kNumDetectionsPerClass; fast NMS); any other
# missing option reads 0, as flexbuffers reads a missing key.
DEFAULT_DETECTIONS_PER_CLASS = 100
DEFAULT_USE_REGULAR_NMS = False


class PostProcessError(TfliteFileError, ValueError):
    """A graph's post-process op is not what a detector has (missing, repeated, without its four outputs), or
    one of its options is stored as something the kernel cannot read as a number."""


# ---- options: flexbuffers' As* conversions, as the kernel's Init reads them ----

def as_int32(value) -> int:
    """flexbuffers Reference::AsInt32: a missing key is 0, a bool 0/1, a float truncated, the rest wrapped to int32."""
    if value is None:
        return 0
    if isinstance(value, float):
        if not np.isfinite(value) or abs(value) >= 2.0**63:
            raise PostProcessError(f"option value {value} does not convert to an integer")
        value = int(value)  # static_cast<int64_t>: toward zero
    if not isinstance(value, (bool, int)):
        raise PostProcessError(f"option value {value!r} is not a number")
    return int(np.array(int(value) & 0xFFFFFFFF, np.uint32).view(np.int32))


def as_float(value) -> np.float32:
    """flexbuffers Reference::AsFloat: a missing key is 0, ints and bools converted, doubles rounded to float."""
    if value is None:
        return np.float32(0.0)
    if not isinstance(value, (bool, int, float)):
        raise PostProcessError(f"option value {value!r} is not a number")
    return np.float32(float(value))


def as_bool(value) -> bool:
    """flexbuffers Reference::AsBool: a bool as stored, anything else AsUInt64() != 0 (0.5 is false)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float):
        return bool(np.isfinite(value)) and int(value) != 0
    if isinstance(value, int):
        return value != 0
    raise PostProcessError(f"option value {value!r} is not a boolean")


@dataclass(frozen=True)
class PostProcessOptions:
    """The kernel's OpData (its field names), as its Init() reads the operator's flexbuffer options."""

    max_detections: int
    max_classes_per_detection: int
    detections_per_class: int
    use_regular_non_max_suppression: bool
    non_max_suppression_score_threshold: np.float32
    intersection_over_union_threshold: np.float32
    num_classes: int
    scale_values: tuple[np.float32, np.float32, np.float32, np.float32]  # y, x, h, w

    @classmethod
    def read(cls, values: dict) -> PostProcessOptions:
        """From the options map (key -> stored value); PostProcessError for a value that is no number."""
        per_class = values.get("detections_per_class")
        regular = values.get("use_regular_nms")
        return cls(
            max_detections=as_int32(values.get("max_detections")),
            max_classes_per_detection=as_int32(values.get("max_classes_per_detection")),
            detections_per_class=DEFAULT_DETECTIONS_PER_CLASS if per_class is None else as_int32(per_class),
            use_regular_non_max_suppression=DEFAULT_USE_REGULAR_NMS if regular is None else as_bool(regular),
            non_max_suppression_score_threshold=as_float(values.get("nms_score_threshold")),
            intersection_over_union_threshold=as_float(values.get("nms_iou_threshold")),
            num_classes=as_int32(values.get("num_classes")),
            scale_values=tuple(as_float(values.get(key)) for key in ("y_scale", "x_scale", "h_scale", "w_scale")),
        )

    @property
    def num_detected_boxes(self) -> int:
        """Rows of the boxes, classes and scores outputs (both modes)."""
        return self.max_detections * self.max_classes_per_detection


def read_options(op: Operator) -> PostProcessOptions:
    """The op's options as its kernel reads them; TfliteFileError when they are not a readable flexbuffer map,
    PostProcessError when a value is no number."""
    return PostProcessOptions.read(op.custom_options_map())


# ---- the op in a graph ----

def postprocess_ops(graph: Subgraph) -> list[Operator]:
    """Every post-process op of the graph, in execution order: a detector has one, a classifier none."""
    return [op for op in graph.operators if op.opcode == POSTPROCESS_OP]


def find_postprocess_op(graph: Subgraph) -> Operator:
    """The graph's one post-process op; PostProcessError when it has none or several."""
    ops = postprocess_ops(graph)
    if len(ops) != 1:
        raise PostProcessError(f"expected one {POSTPROCESS_OP} op, found {len(ops)}")
    return ops[0]


def outputs_by_role(graph: Subgraph, op: Operator | None = None) -> dict[str, Tensor]:
    """Role (boxes, classes, scores, count) -> the output tensor, read from the op's own outputs (the graph's one
    post-process op unless `op` is given); PostProcessError when the op has not four outputs."""
    op = find_postprocess_op(graph) if op is None else op
    if len(op.outputs) != len(OUTPUT_ROLES):
        raise PostProcessError(f"{POSTPROCESS_OP} has {len(op.outputs)} outputs, expected {len(OUTPUT_ROLES)}")
    return {role: graph.tensors[index] for role, index in zip(OUTPUT_ROLES, op.outputs)}
