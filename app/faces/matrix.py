"""The nearest-neighbour search: one embedder's vectors as one float32 matrix, a row per face, grouped by person.

Vectors are unit length, so cosine similarity is a dot product, and a query against every stored face is one
BLAS matrix-vector product (about 0.1 ms for 10,000 faces of 128 values on one core; bench/face_gallery.py).
A person's similarity is their best face's. Past the caches (several faces a person, 8 MB and more), the search
reads a template per person first and then the faces of only the people who can still be nearest
(app/faces/templates.py): the same answer, with less read. Either way the final step compares the rows within
float32 rounding of the best exactly, so the nearest face and its similarity (the exact cosine of the stored
float32 vectors, correctly rounded) do not depend on the path or on the BLAS kernel. For the k nearest, the
best faces are taken k * (most faces one person has) deep, which cannot miss a person among the k best (the
k-th best person's best face has at most (k - 1) * that many faces above it).

A Matrix is immutable: the gallery swaps a new one in when the database changed, and a search running on the
old one finishes on it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from app.faces.errors import GalleryError, InvalidVector
from app.faces.records import Match
from app.faces.templates import Templates, exact_similarity, nearest_row, rounding
from app.faces.vectors import check_queries


class Matrix:
    """One embedder's vectors: a row per face, each with its person."""

    def __init__(self, embedder: str, dimension: int | None, vectors: np.ndarray, owners: np.ndarray,
                 userids: tuple[str, ...]):
        if len(owners) > 1 and (np.diff(owners) < 0).any():  # each person's rows together, in the order given
            order = np.argsort(owners, kind="stable")
            vectors, owners = np.take(vectors, order, axis=0), owners[order]
        self.embedder = embedder
        self.dimension = dimension
        self.vectors = np.ascontiguousarray(vectors, np.float32)  # (faces, dimension), C order
        self.owners = np.ascontiguousarray(owners, np.int32)  # (faces,): each row's person, into userids
        self.userids = userids
        counts = np.bincount(self.owners, minlength=len(userids)) if len(owners) else np.zeros(0, np.int64)
        self.max_faces = int(counts.max()) if len(counts) else 0
        self.templates = Templates(self.vectors, counts) if Templates.worth(self.vectors, counts) else None

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
        owners_array = np.asarray(owners, np.int32)
        order = np.argsort(owners_array, kind="stable")  # grouped by person here: cheaper than moving rows later
        vectors = np.frombuffer(b"".join([blobs[i] for i in order]), dtype="<f4").reshape(len(blobs), dimension)
        return cls(embedder, dimension, vectors.astype(np.float32, copy=False), owners_array[order], tuple(userids))

    def __len__(self) -> int:
        """The people this embedder can recognize."""
        return len(self.userids)

    def best(self, queries: np.ndarray) -> list[Match | None]:
        """The nearest person to each query face ((D,) or (F, D), unit vectors); None for each when the matrix is
        empty."""
        queries = check_queries(queries, self.dimension)
        if not len(self.userids):
            return [None] * len(queries)
        rows: list[np.ndarray | None] = [None] * len(queries)
        if self.templates is not None and self.templates.attempt():
            template_scores = queries @ self.templates.templates.T
            rows = [self.templates.candidates(template_scores[f], queries[f], self.vectors)
                    for f in range(len(queries))]
            self.templates.record(any(found is not None for found in rows))
        whole = [f for f, found in enumerate(rows) if found is None]
        full = {}
        if len(whole) == 1:
            full[whole[0]] = self.vectors @ queries[whole[0]]
        elif whole:
            full = dict(zip(whole, queries[whole] @ self.vectors.T))
        found = []
        for f, query in enumerate(queries):
            some = rows[f]
            scores = full[f] if some is None else self.vectors[some] @ query
            row, similarity = nearest_row(self.vectors, some, scores, query)
            found.append(Match(self.userids[self.owners[row]], similarity))
        return found

    def ranked(self, query: np.ndarray, k: int) -> list[Match]:
        """The k nearest people to one query face, nearest first (fewer when fewer are registered), with their
        exact similarities; people within float32 rounding of each other are ordered by their exact values."""
        queries = check_queries(query, self.dimension)
        if len(queries) != 1:
            raise InvalidVector(f"ranked() takes one query face; got {len(queries)}")
        query = queries[0]
        if k < 1 or not len(self.userids):
            return []
        scores = self.vectors @ query
        deep = min(len(scores), k * self.max_faces)
        top = np.argpartition(-scores, deep - 1)[:deep]
        keys = scores[top].astype(np.float64)
        order = np.lexsort((top, -keys))
        top, keys = top[order], keys[order]
        close = np.zeros(len(top), bool)  # rows within 2 ROUNDING of a neighbour: their order is decided exactly
        ties = keys[:-1] - keys[1:] <= 2 * rounding(self.vectors.shape[1])
        close[:-1] |= ties
        close[1:] |= ties
        for i in np.flatnonzero(close):
            keys[i] = exact_similarity(self.vectors[top[i]], query)
        order = np.lexsort((top, -keys))
        found: list[Match] = []
        seen: set[int] = set()
        for i in top[order]:
            owner = int(self.owners[i])
            if owner not in seen:
                seen.add(owner)
                found.append(Match(self.userids[owner], exact_similarity(self.vectors[i], query)))
                if len(found) == k:
                    break
        return found
