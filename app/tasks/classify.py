"""Classification: the model's class scores -> the top-k classes with their labels.

One role, `scores`: the output tensor of class scores (model.json `outputs.scores` names it; a model
with one output needs no name). Dequantized (real = scale * (q - zero_point)), then softmax when
model.json says the model gives logits. Options: `top_k` (at most MAX_TOP_K), `threshold`. Its result
(`Classification`): `predictions`, best first. As named tensors (OIP v2): `scores` (FP32, what /v1 reports) and
`raw` (the tensor as the model gave it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import numpy as np
from pydantic import Field

from app.tasks.base import NamedOutput, OutputRoles, Outputs, Task
from app.tasks.results import AtMost, Label

if TYPE_CHECKING:
    from app.model_dir.reading import ModelDir

SCORES = "scores"


@dataclass(frozen=True)
class Prediction:
    index: Annotated[int, Field(description="the class's index among the model's scores")]
    label: Label
    score: Annotated[float, Field(description="dequantized (softmax for a model giving logits), 0 to 1")]


@dataclass(frozen=True)
class Classification:
    """The top classes, best first."""

    predictions: Annotated[list[Prediction], Field(description="best first")]


@dataclass(frozen=True)
class ClassifyOptions:
    top_k: Annotated[int, Field(ge=1, description="how many classes to return (at most EDGETPU_SERVE_MAX_TOP_K)"),
                     AtMost("max_top_k")] = 5
    threshold: Annotated[float, Field(ge=0.0, le=1.0, description="drop classes scoring below this")] = 0.0


class ClassificationTask(Task, name="classification", verb="classify", summary="Classify an image"):
    roles = (SCORES,)

    def read(self, outputs: Outputs, options: ClassifyOptions) -> Classification:
        """A run's outputs -> the top-k classes scoring at least threshold, labelled."""
        model_dir = outputs.model_dir
        spec = outputs.spec(SCORES)
        values = scores(outputs.of(SCORES), spec.scale, spec.zero_point, model_dir)
        return Classification(top_predictions(values, model_dir.labels, options.top_k, options.threshold))

    def named_outputs(self, roles: OutputRoles) -> list[NamedOutput]:
        spec = roles.specs[SCORES]
        classes = int(np.prod(spec.shape[1:]))
        return [NamedOutput("scores", np.dtype(np.float32), (classes,)),
                NamedOutput("raw", spec.dtype, (classes,), spec.scale, spec.zero_point)]

    def named_values(self, outputs: Outputs) -> dict[str, np.ndarray]:
        output, spec = outputs.of(SCORES), outputs.spec(SCORES)
        return {"scores": scores(output, spec.scale, spec.zero_point, outputs.model_dir).astype(np.float32),
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
