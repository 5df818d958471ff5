"""Embedding: the model's one output vector -> the image's embedding, dequantized and L2-normalized, for similarity
search (cosine similarity is then a dot product) and the face gallery (app/faces/vectors.py stores unit vectors).

One role, `embedding`: an output of D >= MIN_DIMENSION values, [1, D] (or [1, 1, 1, D]), 8-bit quantized or float32
(model.json `outputs.embedding` names it in a model with several outputs: MobileFaceNet exports that carry a mask
classifier [1, 2] beside their 128 values; Coral's embedding extractor gives [1, 1024]). Dequantized as TFLite's
DEQUANTIZE does (real = float32(scale) * (q - zero_point), in float32), divided by its L2 norm (in float64), then
float32. A vector whose values are all 0 (every value at its zero point) has no direction: it stays the zero vector,
with `norm` 0, as numpy's, FAISS's and PyTorch's normalizations leave it; a caller that needs a unit vector checks
`norm` (the gallery refuses a vector that is not unit length).

No options. Its result (`Embedding`): `embedding`, `dimension`, `norm` (the dequantized vector's L2 norm before
normalizing, in the output's units: how strongly the model responded). As named tensors (OIP v2): `embedding` (FP32 [D], normalized, what /v1 reports) and `raw` (the tensor as the
model gave it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import numpy as np
from pydantic import Field

from app.errors import ModelDirError, ServeError
from app.model_dir.schema import EMBEDDING
from app.tasks.base import NamedOutput, OutputRoles, Outputs, Task
from app.tasks.results import Vector

if TYPE_CHECKING:
    from app.engines import TensorSpec
    from app.model_dir.reading import ModelDir

VECTOR = "embedding"  # the role
MIN_DIMENSION = 32    # fewer values are a classifier's scores or a head's, not an embedding
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


@dataclass(frozen=True)
class Embedding:
    """The image's embedding: the unit vector (the zero vector when the model gave zeros) and the norm it had."""

    embedding: Annotated[Vector, Field(description="the model's output vector, dequantized and L2-normalized "
                                                   "(float32 values); all zeros when the model gave zeros (then "
                                                   "`norm` is 0)")]
    dimension: Annotated[int, Field(description="the embedding's length")]
    norm: Annotated[float, Field(description="the dequantized vector's L2 norm before normalizing, in the model's "
                                             "output units")]


class EmbeddingTask(Task, name=EMBEDDING, verb="embed", summary="Embed an image"):
    roles = (VECTOR,)

    def read(self, outputs: Outputs, options) -> Embedding:
        return embedding_of(outputs.of(VECTOR), outputs.spec(VECTOR))

    def check(self, model_dir: ModelDir, roles: OutputRoles) -> None:
        spec = roles.specs[VECTOR]
        shape = tuple(spec.shape)
        vector = len(shape) >= 2 and all(d == 1 for d in shape[:-1]) and shape[-1] >= MIN_DIMENSION
        quantized = spec.dtype in EIGHT_BIT and spec.scale > 0
        if not vector or not (quantized or spec.dtype == np.float32):
            raise ModelDirError(
                f"model {model_dir.name!r} (embedding): its embedding output {spec.name!r} is {spec.dtype.name} "
                f"{list(shape)}; an embedding is one vector [1, D] of D >= {MIN_DIMENSION} values, 8-bit quantized "
                "or float32 (model.json `outputs.embedding` names it in a model with several outputs)")

    def named_outputs(self, roles: OutputRoles) -> list[NamedOutput]:
        spec = roles.specs[VECTOR]
        dimension = int(spec.shape[-1])
        return [NamedOutput("embedding", np.dtype(np.float32), (dimension,)),
                NamedOutput("raw", spec.dtype, (dimension,), spec.scale, spec.zero_point)]

    def named_values(self, outputs: Outputs) -> dict[str, np.ndarray]:
        output = outputs.of(VECTOR)
        return {"embedding": embedding_of(output, outputs.spec(VECTOR)).embedding, "raw": output.reshape(-1)}


TASK = EmbeddingTask()


def embedding_of(output: np.ndarray, spec: TensorSpec) -> Embedding:
    """The output -> its unit vector and norm (module docstring)."""
    values = output.reshape(-1)
    if spec.dtype in EIGHT_BIT:  # TFLite's DEQUANTIZE: float32 scale times (q - zero point), in float32
        real = np.float32(spec.scale) * (values.astype(np.int32) - spec.zero_point).astype(np.float32)
    else:
        real = values.astype(np.float32)
    wide = real.astype(np.float64)
    norm = float(np.sqrt(np.dot(wide, wide)))
    if not np.isfinite(norm):  # only a float output can: a fault of the model, not of the request
        raise ServeError(f"the model's embedding output {spec.name!r} holds NaN or infinite values")
    if norm == 0.0:
        return Embedding(np.zeros(len(real), np.float32), len(real), 0.0)
    return Embedding((wide / norm).astype(np.float32), len(real), norm)
