"""The nearest-neighbour search: one embedder's vectors as one float32 matrix, searched with one product.

Vectors are unit length, so cosine similarity is a dot product, and a query against every stored face is one
BLAS matrix-vector product (about 0.1 ms for 10,000 faces of 128 values on one core; bench/face_gallery.py).
A person's similarity is their best face's. For the single nearest person that is the person of the best face,
an argmax; for the k nearest, the best faces are taken k * (most faces one person has) deep, which cannot miss
a person among the k best (the k-th best person's best face has at most (k - 1) * that many faces above it).

A Matrix is immutable: the gallery swaps a new one in when the database changed, and a search running on the
old one finishes on it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from app.faces.errors import GalleryError, InvalidVector
from app.faces.records import Match
from app.faces.vectors import check_queries


class Matrix:
    """One embedder's vectors: a row per face, each with its person."""

    def __init__(self, embedder: str, dimension: int | None, vectors: np.ndarray, owners: np.ndarray,
                 userids: tuple[str, ...]):
        self.embedder = embedder
        self.dimension = dimension
        self.vectors = vectors  # (faces, dimension) float32, C order
        self.owners = owners    # (faces,) int32: each row's person, an index into userids
        self.userids = userids
        self.max_faces = int(np.bincount(owners).max()) if len(owners) else 0

    @classmethod
    def from_rows(cls, embedder: str, dimension: int | None, rows: Iterable[tuple[int, str, bytes]]) -> Matrix:
        """From (person id, userid, vector bytes) rows, in any order (a sort of the blobs in SQL would cost more
        than the whole read)."""
        index: dict[int, int] = {}
        userids: list[str] = []
        owners: list[int] = []
        blobs: list[bytes] = []
        for person, userid, blob in rows:
            owner = index.get(person)
            if owner is None:
                owner = index[person] = len(userids)
                userids.append(userid)
            owners.append(owner)
            blobs.append(blob)
        if dimension is None or not blobs:
            return cls(embedder, dimension, np.empty((0, dimension or 0), np.float32), np.empty(0, np.int32), ())
        if any(len(blob) != 4 * dimension for blob in blobs):
            raise GalleryError(f"a stored vector of the embedder {embedder[:12]}... is not {dimension} float32 values")
        vectors = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), dimension)
        return cls(embedder, dimension, vectors.astype(np.float32, copy=False), np.asarray(owners, np.int32),
                   tuple(userids))

    def __len__(self) -> int:
        """The people this embedder can recognize."""
        return len(self.userids)

    def best(self, queries: np.ndarray) -> list[Match | None]:
        """The nearest person to each query face ((D,) or (F, D), unit vectors); None for each when the matrix is
        empty."""
        queries = check_queries(queries, self.dimension)
        if not len(self.userids):
            return [None] * len(queries)
        if len(queries) == 1:
            scores = self.vectors @ queries[0]
            i = int(scores.argmax())
            return [Match(self.userids[self.owners[i]], float(scores[i]))]
        scores = queries @ self.vectors.T
        rows = scores.argmax(axis=1)
        return [Match(self.userids[self.owners[i]], float(scores[f, i])) for f, i in enumerate(rows)]

    def ranked(self, query: np.ndarray, k: int) -> list[Match]:
        """The k nearest people to one query face, nearest first (fewer when fewer are registered)."""
        queries = check_queries(query, self.dimension)
        if len(queries) != 1:
            raise InvalidVector(f"ranked() takes one query face; got {len(queries)}")
        query = queries[0]
        if k < 1 or not len(self.userids):
            return []
        scores = self.vectors @ query
        deep = min(len(scores), k * self.max_faces)
        top = np.argpartition(-scores, deep - 1)[:deep]
        top = top[np.argsort(-scores[top], kind="stable")]
        found: list[Match] = []
        seen: set[int] = set()
        for i in top:
            owner = int(self.owners[i])
            if owner not in seen:
                seen.add(owner)
                found.append(Match(self.userids[owner], float(scores[i])))
                if len(found) == k:
                    break
        return found
