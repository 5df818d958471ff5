"""Embeddings as the gallery stores them: float32 vectors, L2-normalized by the caller, tagged with the sha256 of
the embedder that made them.

The gallery checks rather than repairs: a vector that is not unit length means the caller skipped a step (or
handed over the wrong output), and normalizing it here would hide that. Cosine similarity is then a dot product,
which is what makes the search one matrix-vector product (app/faces/matrix.py).
"""

from __future__ import annotations

import re

import numpy as np

from app.faces.errors import DimensionMismatch, InvalidEmbedderId, InvalidVector

DIMENSION_MIN = 2
DIMENSION_MAX = 4096   # face embedders give 128 (MobileFaceNet, FaceNet) to 512 (ArcFace); room for bigger ones
NORM_TOLERANCE = 1e-3  # float32 normalization is exact to ~1e-7; a caller that forgot it is off by far more

_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_embedder_id(embedder: object) -> str:
    """The embedder's sha256 as lowercase hex (model.json's form), or InvalidEmbedderId."""
    if not isinstance(embedder, str) or not _SHA256.fullmatch(embedder.lower()):
        raise InvalidEmbedderId(f"an embedder is named by its model file's sha256 (64 hexadecimal digits); "
                                f"got {embedder!r:.80}")
    return embedder.lower()


def check_vector(vector: object, dimension: int | None = None) -> np.ndarray:
    """The vector as a C-contiguous float32 array of shape (D,), if it is one the gallery stores: a float array
    of shape (D,) or (1, D), finite, of unit L2 norm, and of `dimension` when given. InvalidVector otherwise."""
    if not isinstance(vector, np.ndarray) or vector.dtype.kind != "f":
        kind = f"an array of {vector.dtype}" if isinstance(vector, np.ndarray) else type(vector).__name__
        raise InvalidVector(f"an embedding is a numpy array of floats; got {kind}")
    if vector.ndim == 2 and vector.shape[0] == 1:
        vector = vector[0]
    if vector.ndim != 1:
        raise InvalidVector(f"an embedding has shape (D,) or (1, D); got {vector.shape}")
    if not DIMENSION_MIN <= vector.shape[0] <= DIMENSION_MAX:
        raise InvalidVector(f"an embedding has {DIMENSION_MIN} to {DIMENSION_MAX} values; got {vector.shape[0]}")
    _check_dimension(vector.shape[0], dimension)
    return _check_values(np.ascontiguousarray(vector[None, :], dtype=np.float32))[0]


def check_queries(queries: object, dimension: int) -> np.ndarray:
    """Query embeddings for a search as a C-contiguous float32 array of shape (F, D) (one (D,) vector becomes
    (1, D)), each checked as a stored one is, in one pass over the array."""
    if not isinstance(queries, np.ndarray) or queries.dtype.kind != "f" or queries.ndim not in (1, 2):
        what = f"{queries.dtype} array of shape {queries.shape}" if isinstance(queries, np.ndarray) else \
            type(queries).__name__
        raise InvalidVector(f"query embeddings are a float array of shape (D,) or (F, D); got {what}")
    queries = queries[None, :] if queries.ndim == 1 else queries
    _check_dimension(queries.shape[1], dimension)
    return _check_values(np.ascontiguousarray(queries, dtype=np.float32))


def _check_dimension(got: int, dimension: int | None) -> None:
    if dimension is not None and got != dimension:
        raise DimensionMismatch(f"the embedding has {got} values; this embedder's vectors in the gallery have "
                                f"{dimension}: two models under one sha256?")


def _check_values(rows: np.ndarray) -> np.ndarray:
    if not np.isfinite(rows).all():
        raise InvalidVector("the embedding holds NaN or infinite values")
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows, dtype=np.float64))
    off = np.abs(norms - 1.0) > NORM_TOLERANCE
    if off.any():
        raise InvalidVector(f"an embedding's L2 norm is {norms[off.argmax()]:.6g}; the gallery stores unit "
                            "vectors: divide each by its norm first")
    return rows
