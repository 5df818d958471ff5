"""Classification: the model's class scores -> the top-k classes with their labels.

One role, `scores`: the output tensor of class scores (model.json `outputs.scores` names it; a model
with one output needs no name). Dequantized (real = scale * (q - zero_point)), then softmax when
model.json says the model gives logits. Its routes: app/api/classify.py (which reads a run's outputs
with `ClassificationTask.predictions`); as named tensors (OIP v2): `scores` (FP32, what /v1 reports)
and `raw` (the tensor as the model gave it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from app.tasks.base import Answer, NamedOutput, OutputRoles, Task

if TYPE_CHECKING:
    from app.model_dir.reading import ModelDir

SCORES = "scores"


@dataclass(frozen=True)
class Prediction:
    index: int
    label: str
    score: float


@dataclass(frozen=True)
class Classification(Answer):
    predictions: list[Prediction]


class ClassificationTask(Task):
    name = "classification"
    roles = (SCORES,)
    routes = ("app.api.classify:router",)

    def predictions(self, roles: OutputRoles, outputs: Sequence[np.ndarray], model_dir: ModelDir, top_k: int,
                    threshold: float) -> list[Prediction]:
        """A run's outputs -> the top-k classes scoring at least threshold, labelled."""
        spec = roles.specs[SCORES]
        values = scores(roles.of(outputs, SCORES), spec.scale, spec.zero_point, model_dir)
        return top_predictions(values, model_dir.labels, top_k, threshold)

    def named_outputs(self, roles: OutputRoles) -> list[NamedOutput]:
        spec = roles.specs[SCORES]
        classes = int(np.prod(spec.shape[1:]))
        return [NamedOutput("scores", np.dtype(np.float32), (classes,)),
                NamedOutput("raw", spec.dtype, (classes,), spec.scale, spec.zero_point)]

    def named_values(self, roles: OutputRoles, outputs: Sequence[np.ndarray], model_dir: ModelDir) -> dict[str, np.ndarray]:
        output, spec = roles.of(outputs, SCORES), roles.specs[SCORES]
        return {"scores": scores(output, spec.scale, spec.zero_point, model_dir).astype(np.float32),
                "raw": output.reshape(-1)}


TASK = ClassificationTask()


def scores(output: np.ndarray, scale: float, zero_point: int, model_dir: ModelDir) -> np.ndarray:
    """Dequantize (real = scale * (q - zero_point)) and, for logits, softmax."""
    values = output.reshape(-1).astype(np.float64)
    if scale > 0:  # quantized output; a float output has scale 0
        values = (values - zero_point) * scale
    if model_dir.manifest.output.scores == "logits":
        values = np.exp(values - values.max())
        values /= values.sum()
    return values


def top_predictions(values: np.ndarray, labels: tuple[str, ...], top_k: int, threshold: float) -> list[Prediction]:
    """The k best scores at or above threshold; equal scores in class order."""
    order = top_order(values, top_k)
    # Python ints and floats at once: numpy scalars cost a microsecond each to index and compare
    return [
        Prediction(i, labels[i] if i < len(labels) else str(i), score)
        for i, score in zip(order.tolist(), values[order].tolist())
        if score >= threshold
    ]


def top_order(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, largest first, equal values in index order: the first k
    of a stable descending sort, without sorting all of them (1000 classes: a partition and a
    sort of k, about a fifth of the full sort's time)."""
    n = values.shape[0]
    if k >= n or not np.isfinite(values).all():  # NaN has no place in a partition: sort all
        return np.argsort(-values, kind="stable")[:k]
    kth = np.partition(values, n - k)[n - k]        # the k-th largest value
    candidates = np.flatnonzero(values >= kth)       # every value tied with it too, in index order
    return candidates[np.argsort(-values[candidates], kind="stable")][:k]
