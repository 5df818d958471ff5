"""Face detectors whose raw outputs are decoded against prior boxes, recognised from their outputs: model.json's
detection decoder `priors` (app/model_dir/schema.py DetectionSpec, app/tasks/priors.py).

    outputs [1, N, 4] and [1, N, 2] (and [1, N, 2L]), told apart by their last dimension (or --output ROLE=TENSOR)
      boxes [1, N, 4]        raw locations against the priors, or corners (an is_test=True export)
      scores [1, N, 2]       background, face: a softmax's probabilities, or logits
      landmarks [1, N, 2L]   RetinaFace's offsets of L points (5: eyes, nose tip, mouth corners)
    the priors: those N count at the model's input size
      Ultra-Light-Fast-Generic-Face-Detector's (RFB-320 and slim: 4420 at 320x240), else RetinaFace's (16800 at
      640x640), else --anchors FILE.json (stored in the model directory as anchors.json)

The two box forms have the same shapes: only the values tell them apart, so the import runs the model once on a
synthetic image (`probe`: the converter runs it on the service's cpu backend) and reads the boxes as corners near
their priors or not (app/tasks/priors.py boxes_form), and says which it found; `--boxes priors|decoded` tells it
instead (a compiled file alone cannot run here). The scores' form is read from the graph: made by a SOFTMAX, or an
8-bit tensor's range (app/tasks/priors.py scores_form); a float tensor's from the run; `--scores` tells it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.importing.detectors import DetectorOptions, DetectorRefused, Family, making_ops
from app.model_dir.schema import (
    ANCHORS,
    ANCHORS_FILE,
    ANCHORS_IN_FILE,
    DECODER_ROLES,
    LANDMARKS,
    PRIORS,
    DetectionSpec,
)
from app.tasks import priors as prior_boxes
from app.tflite_file import Subgraph, Tensor

EIGHT_BIT = ("INT8", "UINT8")
BOXES, SCORES = DECODER_ROLES[PRIORS]
ROLES = (BOXES, SCORES, LANDMARKS)
FACE_LABEL = "face"
# What a detector is called when the prior count names its built-in prior set, and whose priors they are
NAMES = {
    "ultra_light": ("Ultra-Light-Fast-Generic-Face-Detector (ULFD: RFB-320 or slim)", "ULFD's"),
    "retinaface": ("a RetinaFace-style face detector", "RetinaFace's"),
}
# Runs the model once on an input tensor: its outputs by tensor name (raw, as the model gives them)
Probe = Callable[[np.ndarray], dict[str, np.ndarray]]


@dataclass(frozen=True)
class PriorOutputs:
    boxes: Tensor
    scores: Tensor
    landmarks: Tensor | None


@dataclass(frozen=True)
class PriorDetector:
    """A prior-box face detector recognised from its outputs; `family(probe)` settles what only a run can tell
    (the box form, a float tensor's score form) and gives the importer's Family."""

    file_name: str
    outputs: PriorOutputs
    anchors: str                          # a BUILT_IN name, or ANCHORS_IN_FILE
    anchor_spec: prior_boxes.AnchorSpec   # at the model's input size
    anchor_bytes: bytes | None            # the --anchors file as read, stored in the model directory
    anchors_origin: str
    name: str
    options: DetectorOptions
    graph: Subgraph

    @property
    def needs_run(self) -> bool:
        return self.options.boxes is None or self._score_form()[0] is None

    def family(self, probe: Probe | None, image: Tensor) -> Family:
        """The Family, running the model through `probe` on a synthetic image where the box form (or a float
        tensor's score form) is not given: DetectorRefused when it would need a run and `probe` is None."""
        values = None
        if self.needs_run:
            if probe is None:
                raise DetectorRefused(
                    f"{self.file_name} is {self.name}: its boxes may be raw locations against the priors or corners "
                    "decoded in the graph (an is_test=True export), which only a run tells, and this file cannot be "
                    "run here (a compiled file alone needs an Edge TPU): give --boxes priors or --boxes decoded (or "
                    "import the plain .tflite beside it)")
            values = probe(synthetic_input(image))
        priors = self.anchor_spec.priors()
        box_encoding, boxes_origin = self._box_form(values, priors)
        activation, scores_origin = self._score_form(values)
        landmarks = self.outputs.landmarks
        points = int(landmarks.shape[-1]) // 2 if landmarks is not None else None
        spec = DetectionSpec(decoder=PRIORS, classes=1, box_encoding=box_encoding, anchors=self.anchors,
                             variances=[self.anchor_spec.center_variance, self.anchor_spec.size_variance],
                             landmarks=points, score_activation=activation, **self.options.thresholds())
        roles = {BOXES: self.outputs.boxes.name, SCORES: self.outputs.scores.name}
        if landmarks is not None:
            roles[LANDMARKS] = landmarks.name
        facts = [f"boxes {_describe(self.outputs.boxes)}, scores {_describe(self.outputs.scores)}"
                 + (f", landmarks {_describe(landmarks)} ({points} points)" if landmarks is not None else "")
                 + " told apart by their last dimension" + (" and --output" if self.options.outputs else ""),
                 f"{len(priors)} priors: {self.anchors_origin}", boxes_origin, scores_origin]
        files = {ANCHORS: (ANCHORS_FILE, self.anchor_bytes)} if self.anchor_bytes is not None else {}
        return Family(self.name, roles, spec, "; ".join(facts), [FACE_LABEL],
                      f"a face detector: column 1 of its scores is the face, named {FACE_LABEL!r} (--labels to name "
                      "it otherwise)", resize="stretch", files=files)

    def _box_form(self, values: dict[str, np.ndarray] | None, priors: prior_boxes.Priors) -> tuple[str, str]:
        given = self.options.boxes
        if given is not None:
            return given, f"boxes {'decoded corners' if given == 'decoded' else 'raw locations'} (--boxes {given})"
        boxes = self.outputs.boxes
        real = prior_boxes.dequantize(values[boxes.name], _quantization(boxes))
        share = prior_boxes.corner_share(real, priors)
        form = prior_boxes.BOXES_DECODED if share >= prior_boxes.DECODED_SHARE else prior_boxes.BOXES_PRIORS
        what = ("decoded corners, an is_test=True export" if form == prior_boxes.BOXES_DECODED else
                "raw locations against the priors")
        return form, (f"boxes: {what} (a run on a synthetic image: {share:.1%} of the rows read as corners near "
                      f"their priors; --boxes priors|decoded to say otherwise)")

    def _score_form(self, values: dict[str, np.ndarray] | None = None) -> tuple[str | None, str]:
        """(score_activation, why): softmax for logits, none for probabilities; None where only a run tells."""
        given = self.options.scores
        if given is not None:
            return ("softmax" if given == "logits" else "none"), f"scores: {given} (--scores {given})"
        scores = self.outputs.scores
        if "SOFTMAX" in making_ops(self.graph, scores.index):
            return "none", "scores: probabilities, made by a SOFTMAX"
        quantization = _quantization(_eight_bit_source(self.graph, scores))
        if quantization is not None:
            low, high = _range(_eight_bit_source(self.graph, scores))
            form = prior_boxes.scores_form(np.zeros(1, _dtype(_eight_bit_source(self.graph, scores))), quantization)
            return _activation(form), f"scores: {form}, from the tensor's range [{low:.3g}, {high:.3g}]"
        if values is None:
            return None, ""
        form = prior_boxes.scores_form(values[scores.name])
        return _activation(form), f"scores: {form}, from their values on a synthetic image"


def recognise(graph: Subgraph, width: int, height: int, options: DetectorOptions,
              file_name: str) -> PriorDetector | None:
    """A prior-box face detector from its outputs (the module docstring), or None when its outputs are not one's;
    DetectorRefused where they are but something the decoder needs does not fit or cannot be told."""
    outputs = [graph.tensors[i] for i in graph.outputs]
    if not 2 <= len(outputs) <= 3 or any(len(t.shape) != 3 or t.shape[0] != 1 for t in outputs):
        return None
    rows = {int(t.shape[1]) for t in outputs}
    if len(rows) != 1:
        return None
    (n,) = rows
    found = _roles(outputs, options, file_name)
    if found is None:
        return None
    for tensor in (found.boxes, found.scores, found.landmarks):
        if tensor is not None and (tensor.type not in (*EIGHT_BIT, "FLOAT32")
                                   or tensor.type in EIGHT_BIT and tensor.quantization is None):
            raise DetectorRefused(f"{file_name}'s output {_describe(tensor)} is neither quantized 8-bit nor float32")
    anchors, spec, data, origin, name = _anchors(n, width, height, options, file_name)
    return PriorDetector(file_name, found, anchors, spec, data, origin, name, options, graph)


def _roles(outputs: list[Tensor], options: DetectorOptions, file_name: str) -> PriorOutputs | None:
    """boxes, scores and landmarks by their last dimension (4, 2, 2L), or as --output names them; None when the
    outputs are not these."""
    by_name = {t.name: t for t in outputs}
    named = {role: tensor for role, tensor in options.outputs.items() if role in ROLES}
    for role, tensor in named.items():
        if tensor not in by_name:
            raise DetectorRefused(f"--output {role}={tensor}: {file_name} has no output {tensor!r} (its outputs: "
                                  f"{', '.join(_describe(t) for t in outputs)})")
    chosen = {role: by_name[tensor] for role, tensor in named.items()}
    rest = [t for t in outputs if t not in chosen.values()]
    needs = (f"{file_name}'s outputs ({', '.join(_describe(t) for t in outputs)}) with --output "
             f"{', '.join(f'{r}={t}' for r, t in named.items())}: a face detector with prior boxes has boxes "
             "[1, N, 4], scores [1, N, 2] and optionally landmarks [1, N, 2L]")
    for role, last in ((BOXES, 4), (SCORES, 2)):
        if role not in chosen:
            fits = [t for t in rest if t.shape[2] == last]
            if len(fits) != 1:
                if len(fits) > 1:
                    raise DetectorRefused(f"{file_name} has {len(fits)} outputs [1, N, {last}] "
                                          f"({', '.join(_describe(t) for t in fits)}): which holds the {role} cannot "
                                          f"be told by shape; give --output {role}=TENSOR")
                if named:
                    raise DetectorRefused(needs)
                return None
            chosen[role] = fits[0]
            rest.remove(fits[0])
    if LANDMARKS not in chosen and rest:
        chosen[LANDMARKS] = rest[0]
    landmarks = chosen.get(LANDMARKS)
    wrong_landmarks = landmarks is not None and (landmarks.shape[2] % 2 or landmarks.shape[2] < 2)
    if chosen[BOXES].shape[2] != 4 or chosen[SCORES].shape[2] != 2 or (wrong_landmarks and named):
        raise DetectorRefused(needs)
    if wrong_landmarks:
        return None
    return PriorOutputs(chosen[BOXES], chosen[SCORES], landmarks)


def _anchors(n: int, width: int, height: int, options: DetectorOptions,
             file_name: str) -> tuple[str, prior_boxes.AnchorSpec, bytes | None, str, str]:
    """(anchors, the spec at the input size, the file's bytes, why, the detector's name) for N rows."""
    if options.anchors is not None:
        try:
            spec, data = prior_boxes.read_anchor_file(options.anchors)
            spec = spec.for_input(width, height)
        except prior_boxes.PriorsError as e:
            raise DetectorRefused(f"--anchors {options.anchors}: {e}") from None
        if len(spec) != n:
            raise DetectorRefused(f"--anchors {options.anchors}: these priors number {len(spec)} at {file_name}'s "
                                  f"{width}x{height} input; its outputs have {n} rows")
        return (ANCHORS_IN_FILE, spec, data, f"--anchors {options.anchors.name} (stored as {ANCHORS_FILE})",
                f"a prior-box face detector (anchors from {options.anchors.name})")
    counts = {}
    for key, built_in in prior_boxes.BUILT_IN.items():
        spec = built_in.for_input(width, height)
        counts[key] = len(spec)
        if len(spec) == n:
            name, whose = NAMES[key]
            return key, spec, None, f"{whose} at its {width}x{height} input", name
    known = ", ".join(f"{NAMES[key][1]} number {count}" for key, count in counts.items())
    raise DetectorRefused(
        f"{file_name}'s outputs look like a face detector's raw boxes [1, {n}, 4] and scores [1, {n}, 2], decoded "
        f"against {n} prior boxes; at its {width}x{height} input {known}. Give its priors with --anchors FILE.json "
        "(docs/faces.md, \"Anchor files\")")


def synthetic_input(image: Tensor) -> np.ndarray:
    """A synthetic image as the model's input tensor: a dark, smooth scene with a lighter oval, the pixels as the
    input's quantization takes them (q = pixel for uint8, pixel - 128 for int8; (pixel - 127.5) / 127.5 for a float
    input). Any image serves: it is only there to see the form of the boxes."""
    _, height, width, channels = (int(d) for d in image.shape)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    scene = 40 + 30 * (x / max(width - 1, 1)) + 20 * (y / max(height - 1, 1))
    inside = ((x - width / 2) / (width / 6)) ** 2 + ((y - height / 2) / (height / 4)) ** 2 <= 1
    pixels = np.repeat(np.where(inside, 190.0, scene)[:, :, None], channels, 2).round()
    if image.type == "UINT8":
        return pixels.astype(np.uint8)[None]
    if image.type == "INT8":
        return (pixels - 128).astype(np.int8)[None]
    return ((pixels - 127.5) / 127.5).astype(np.float32)[None]


def _activation(form: str) -> str:
    return "softmax" if form == prior_boxes.LOGITS else "none"


def _eight_bit_source(graph: Subgraph, tensor: Tensor) -> Tensor:
    """The tensor itself, or the 8-bit tensor a DEQUANTIZE made a float output from."""
    if tensor.type not in EIGHT_BIT:
        op = next((op for op in graph.operators if tensor.index in op.outputs), None)
        if op is not None and op.opcode == "DEQUANTIZE":
            return graph.tensors[op.inputs[0]]
    return tensor


def _quantization(tensor: Tensor) -> tuple[float, int] | None:
    q = tensor.quantization
    if tensor.type not in EIGHT_BIT or q is None or len(q.scale) != 1:
        return None
    return float(q.scale[0]), int(q.zero_point[0])


def _dtype(tensor: Tensor) -> np.dtype:
    return np.dtype(np.int8) if tensor.type == "INT8" else np.dtype(np.uint8)


def _range(tensor: Tensor) -> tuple[float, float]:
    scale, zero_point = _quantization(tensor)
    info = np.iinfo(_dtype(tensor))
    return scale * (info.min - zero_point), scale * (info.max - zero_point)


def _describe(tensor: Tensor) -> str:
    return f"{tensor.name!r} {tensor.type.lower()} {list(tensor.shape)}"
