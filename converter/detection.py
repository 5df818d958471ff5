"""A detector's int8 model: what it is made of, its outputs by role, and how it compares with its float original.

The comparison is box for box on real photos. Both models see the same pixels (app.imaging's resize); the int8
model runs in TFLite's interpreter as the service's `cpu` backend runs it, its outputs found by role on its
TFLite_Detection_PostProcess op. The float model's objects over a score threshold are matched one to one with the
int8 model's (same class, best IoU first): how many it finds, how well the boxes overlap, how far the scores moved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.detection_postprocess import find_postprocess_op, outputs_by_role
from app.model_dir.records import DetectionAgreement
from app.model_dir.schema import InputSpec
from app.tflite_file import read_tflite


@dataclass(frozen=True)
class Detections:
    """One image's detections: boxes [N, 4] as ymin, xmin, ymax, xmax normalized to the image; class ids as the
    TFLite op numbers them (from 0, background skipped); scores."""

    boxes: np.ndarray
    classes: np.ndarray
    scores: np.ndarray

    def at_least(self, score: float) -> Detections:
        keep = self.scores >= score
        return Detections(self.boxes[keep], self.classes[keep], self.scores[keep])

    def __len__(self) -> int:
        return len(self.scores)


def postprocess_outputs(tflite: bytes | Path) -> dict[str, str]:
    """model.json's `outputs`: role (boxes, classes, scores, count) -> output tensor name, read from the post-process
    op's own outputs (ValueError when the model has not exactly one such op with its four outputs)."""
    return {role: tensor.name for role, tensor in outputs_by_role(read_tflite(tflite).graph).items()}


def describe(tflite: bytes) -> dict:
    """model.json's `quantization` of a detector: operators, the integer input, and a check that float tensors appear
    only where the post-process op needs them (its dequantized inputs, its anchors, its outputs)."""
    graph = read_tflite(tflite).graph
    postprocess = find_postprocess_op(graph)
    allowed = set(postprocess.inputs) | set(postprocess.outputs)
    stray = [t.name for t in graph.tensors if t.type.startswith("FLOAT") and t.index not in allowed]
    if stray:
        raise ValueError(f"not a full-integer detector: float tensors before the post-process op: {stray[:5]}")
    if len(graph.inputs) != 1:
        raise ValueError(f"expected one input, found {len(graph.inputs)}")
    inp = graph.tensors[graph.inputs[0]]
    if inp.type not in ("UINT8", "INT8") or inp.quantization is None or inp.is_dynamic:
        raise ValueError(f"the input {inp.name} is {inp.type} {inp.shape_signature}: expected a static 8-bit tensor")
    counts: dict[str, int] = {}
    for op in graph.operators:
        counts[op.opcode] = counts.get(op.opcode, 0) + 1
    return {"operators": dict(sorted(counts.items())),
            "input": {"dtype": inp.type.lower(), "shape": list(inp.shape),
                      "scale": float(inp.quantization.scale[0]), "zero_point": int(inp.quantization.zero_point[0])}}


def int8_detector(tflite_path: Path, spec: InputSpec) -> Callable[[np.ndarray], Detections]:
    """uint8 HxWxC pixels -> the int8 model's detections, on the CPU runtime the service uses."""
    from ai_edge_litert.interpreter import Interpreter

    from app.imaging.quantization import InputQuantizer

    interpreter = Interpreter(model_path=str(tflite_path), num_threads=1)
    interpreter.allocate_tensors()
    inp = interpreter.get_input_details()[0]
    by_name = {d["name"]: d["index"] for d in interpreter.get_output_details()}
    index = {role: by_name[name] for role, name in postprocess_outputs(Path(tflite_path)).items()}
    to_input = InputQuantizer(spec, inp["dtype"], *inp["quantization"])

    def detect(pixels: np.ndarray) -> Detections:
        interpreter.set_tensor(inp["index"], to_input(pixels))
        interpreter.invoke()
        n = int(interpreter.get_tensor(index["count"])[0])
        return Detections(interpreter.get_tensor(index["boxes"])[0, :n].copy(),
                          interpreter.get_tensor(index["classes"])[0, :n].astype(np.int64),
                          interpreter.get_tensor(index["scores"])[0, :n].copy())

    return detect


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two ymin, xmin, ymax, xmax boxes, each clipped to the image first (the float
    graph clips its boxes to the image; TFLite's op does not)."""
    a, b = np.clip(a, 0.0, 1.0).astype(np.float64), np.clip(b, 0.0, 1.0).astype(np.float64)
    height = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    width = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = height * width
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def match(reference: Detections, candidate: Detections, iou_threshold: float) -> list[tuple[int, int, float]]:
    """One-to-one matches (reference index, candidate index, IoU), same class and IoU >= iou_threshold, best first."""
    pairs = [(iou(reference.boxes[i], candidate.boxes[j]), i, j)
             for i in range(len(reference)) for j in range(len(candidate))
             if reference.classes[i] == candidate.classes[j]]
    pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
    taken_ref, taken_cand, found = set(), set(), []
    for overlap, i, j in pairs:
        if overlap < iou_threshold or i in taken_ref or j in taken_cand:
            continue
        taken_ref.add(i)
        taken_cand.add(j)
        found.append((i, j, overlap))
    return found


def compare(inputs: Iterable[tuple[str, np.ndarray]], float_detect: Callable[[np.ndarray], Detections],
            int8_detect: Callable[[np.ndarray], Detections], score_threshold: float,
            iou_threshold: float) -> DetectionAgreement:
    """int8 vs float over the named inputs (name, uint8 pixels)."""
    photos, objects, extra, ious, score_errors, per_photo = 0, 0, 0, [], [], {}
    for name, pixels in inputs:
        photos += 1
        reference = float_detect(pixels).at_least(score_threshold)
        candidate = int8_detect(pixels).at_least(score_threshold)
        found = sorted(match(reference, candidate, iou_threshold))  # in the float model's (score) order
        objects += len(reference)
        extra += len(candidate) - len(found)
        ious += [overlap for _, _, overlap in found]
        score_errors += [abs(float(reference.scores[i]) - float(candidate.scores[j])) for i, j, _ in found]
        per_photo[name] = [round(overlap, 4) for _, _, overlap in found]
    rounded = lambda value: None if value is None else round(float(value), 4)  # noqa: E731
    return DetectionAgreement(
        photos=photos, score_threshold=score_threshold, iou_threshold=iou_threshold,
        float_objects=objects, found=len(ious), recall=rounded(len(ious) / objects if objects else None),
        int8_extra=extra,
        iou_min=rounded(min(ious) if ious else None), iou_median=rounded(np.median(ious) if ious else None),
        iou_mean=rounded(np.mean(ious) if ious else None),
        max_score_error=rounded(max(score_errors) if score_errors else None), per_photo=per_photo)
