"""Per-person templates: a search of one vector per person first, then the faces of only the people who can still
be nearest. The answer is the exhaustive search's, bit for bit; only the work changes.

Why: a search reads the whole matrix, faces x dimension x 4 bytes, and once that passes what the CPU's caches
keep it runs at memory bandwidth: 10,000 people with 3 faces of 128 values is 15 MB and 0.5 to 1.4 ms here,
with one face 5 MB and 0.1 ms (bench/face_gallery.py). A template per person (the normalized mean of their faces,
5 MB for 10,000 people) is read first; then only the people whose faces could still beat the best face found.

**The bound.** For unit vectors the angle is a distance on the sphere, so the triangle inequality holds:
angle(q, f) >= angle(q, t) - angle(t, f). Let theta_p be the widest angle between person p's template t and
any of their faces, and c = cos angle(q, t). Every face f of p then has
    q . f <= 1                                       when angle(q, t) <= theta_p (c >= cos theta_p)
    q . f <= cos(angle(q, t) - theta_p) = c cos theta_p + sqrt(1 - c^2) sin theta_p     otherwise.
Vectors are stored unit length to 1e-3, not exactly: the bound is scaled by the norms (|q| and each person's
largest or smallest face norm), and c is raised by what float32 rounding can have taken from it.

**The search.** The template scores C = T q (one product over the people); the faces of the best template's
person give a similarity L; every person whose bound is below L (with room for rounding, below) cannot hold
the nearest face, and is skipped. When the people left hold over CANDIDATE_SHARE of the faces, the bound has not
paid and the whole matrix is read instead: for a face of someone registered the bound leaves a few people (in
the bench's 10,000 people whose faces agree to cosine 0.7, a median of 6 faces to compare), for a stranger
nearly everyone, because in 128 dimensions a stranger is about as far from every template (c near 0) and a
cone of theta_p around it reaches down to cos(90 - theta_p).

**The backoff.** A stranger's search pays the template pass and then reads the whole matrix anyway, and in a
stream of strangers (or of people whose faces disagree) it would every time. So after a search where the
templates did not pay, the next 1, then 2, 4 ... up to BACKOFF_MAX searches read the whole matrix directly, and
a search where they paid starts over: a stranger costs at most 1 / (1 + BACKOFF_MAX) of a template pass more
in a long run of them. The state is the process's, per matrix; races between threads only change which path a
search takes, never its answer.

**Exactness.** A float32 dot product of D values is off by at most ROUNDING = 1.01 D 2^-24 (in any order of
summation; unit vectors to 1e-3). So the rows whose float32 similarity is within 2 ROUNDING of the best are
compared exactly (math.fsum of the exact float64 products: correctly rounded, in any order), the nearest face is
the one of the greatest exact similarity (on a tie, the first row), and that exact value is the answer. A person
is skipped only when their bound is 4 ROUNDING below L: then neither their faces nor the rows they could tie
with matter. The exhaustive search makes the same final step over all rows, so both give the same face and
the same float, which the tests check on galleries built to make ties and near-ties.
"""

from __future__ import annotations

import math

import numpy as np

TEMPLATE_MIN_BYTES = 8 << 20  # a matrix smaller than this stays in the caches here: a plain product is faster
CANDIDATE_SHARE = 0.25        # past this share of the faces to compare, reading everything costs less
BACKOFF_MAX = 16              # searches read whole, at most, after templates that did not pay
BOUND_SLACK = 1e-9            # over the float64 arithmetic of the bound (a dozen operations on values under 1.01)


def rounding(dimension: int) -> float:
    """The most a float32 dot product of two near-unit vectors of `dimension` values can be off."""
    return 1.01 * dimension * 2.0 ** -24 * (1 + 3e-3)


def exact_similarity(vector: np.ndarray, query: np.ndarray) -> float:
    """The dot product of two float32 vectors, correctly rounded: the float64 products are exact (24-bit
    mantissas), math.fsum adds them without error in any order."""
    return math.fsum(np.multiply(vector, query, dtype=np.float64).tolist())


def nearest_row(vectors: np.ndarray, rows: np.ndarray | None, scores: np.ndarray, query: np.ndarray) -> tuple[int, float]:
    """The row of the greatest exact similarity among `rows` (None: all) given their float32 `scores`, and that
    similarity: the rows within 2 ROUNDING of the best score compared exactly, a tie to the first row."""
    window = 2 * rounding(vectors.shape[1])
    near = np.flatnonzero(scores >= scores.max() - window)
    best_row, best = -1, -math.inf
    for i in near:  # in row order: the first of equal ones is kept
        row = int(i) if rows is None else int(rows[i])
        value = exact_similarity(vectors[row], query)
        if value > best or (value == best and row < best_row):
            best_row, best = row, value
    return best_row, best


class Templates:
    """One template per person over a matrix whose rows are grouped by person (`counts` rows each, in order),
    and each person's bound parameters."""

    def __init__(self, vectors: np.ndarray, counts: np.ndarray):
        self.counts = np.asarray(counts, np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self.rows = int(self.counts.sum())
        self.dimension = vectors.shape[1]
        # float32 over the matrix (a float64 copy of a large one costs more than the search saves); what float32
        # rounding can move is taken off the cosines and put on the norms, so that the bound only grows
        norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))
        # each person's k-th faces at a time (k < their count): a person's rows are consecutive
        sums = np.zeros((len(self.counts), self.dimension), np.float32)
        for k, people, rows in self._kth_faces():
            sums[people] += vectors[rows] / norms[rows, None]
        lengths = np.sqrt(np.einsum("ij,ij->i", sums, sums))
        templates = sums / np.where(lengths > 0, lengths, 1)[:, None]  # faces that cancel: any t, cos -1 below
        cosines = np.empty(self.rows, np.float32)
        for k, people, rows in self._kth_faces():
            cosines[rows] = np.einsum("ij,ij->i", vectors[rows], templates[people]) / norms[rows]
        slack = rounding(self.dimension) + 1e-6
        cos = np.clip(np.minimum.reduceat(cosines, self.starts).astype(np.float64) - slack, -1.0, 1.0)
        cos[lengths <= 1e-3] = -1.0
        self.cos = cos
        self.sin = np.sqrt((1.0 - cos) * (1.0 + cos))
        self.norm_max = np.maximum.reduceat(norms, self.starts).astype(np.float64) * (1 + 1e-6)
        self.norm_min = np.minimum.reduceat(norms, self.starts).astype(np.float64) * (1 - 1e-6)
        self.templates = np.ascontiguousarray(templates, np.float32)
        self._skip, self._backoff = 0, 1
        self.paid = 0  # searches the templates answered without reading the whole matrix (bench/face_gallery.py)

    def _kth_faces(self):
        """(k, the people with more than k faces, their k-th face's row) for k = 0, 1, ..."""
        for k in range(int(self.counts.max()) if len(self.counts) else 0):
            people = np.flatnonzero(self.counts > k)
            yield k, people, self.starts[people] + k

    def attempt(self) -> bool:
        """Whether the next search should try the templates: not for the few after one where they did not pay."""
        if self._skip:
            self._skip -= 1
            return False
        return True

    def record(self, paid: bool) -> None:
        """After a search that tried them: a search whose bound left few people resets the backoff; one that read
        the whole matrix anyway has the next 1, 2, 4 ... BACKOFF_MAX searches read it directly."""
        if paid:
            self.paid += 1
            self._backoff = 1
        else:
            self._skip, self._backoff = self._backoff, min(2 * self._backoff, BACKOFF_MAX)

    @staticmethod
    def worth(vectors: np.ndarray, counts: np.ndarray) -> bool:
        """Whether templates pay for this matrix: several faces a person (everyone with one at least), and a
        matrix past the caches."""
        return len(vectors) > len(counts) and vectors.nbytes >= TEMPLATE_MIN_BYTES and bool(counts.min() > 0)

    def candidates(self, template_scores: np.ndarray, query: np.ndarray, vectors: np.ndarray) -> np.ndarray | None:
        """The rows that can hold the face nearest `query` (ascending), given the query's template scores; None
        when they are too many to be worth gathering (read the whole matrix)."""
        best = int(template_scores.argmax())
        start = int(self.starts[best])
        seed = vectors[start:start + int(self.counts[best])] @ query
        floor = float(seed.max()) - 4 * rounding(self.dimension)
        keep = self.bounds(template_scores, float(np.sqrt(np.dot(query.astype(np.float64), query)))) >= floor
        if int(self.counts @ keep) > CANDIDATE_SHARE * self.rows:
            return None
        return np.flatnonzero(np.repeat(keep, self.counts))

    def bounds(self, template_scores: np.ndarray, query_norm: float) -> np.ndarray:
        """Each person's upper bound on the similarity of any of their faces to the query (module docstring), in
        float64 (1 - c^2 as (1 - c)(1 + c): no cancellation near c = -1, where the cone is steepest)."""
        # the cosine to each template, raised past what float32 rounding (of q . t, of t's length) can take
        c = (template_scores.astype(np.float64) + (rounding(self.dimension) + 1e-7)) / query_norm
        c += np.abs(c) * 2e-6
        np.clip(c, -1.0, 1.0, out=c)
        cone = np.sqrt((1.0 - c) * (1.0 + c))
        cone *= self.sin
        cone += c * self.cos
        cone[c >= self.cos] = 1.0
        cone *= np.where(cone >= 0, self.norm_max, self.norm_min)
        cone *= query_norm
        cone += BOUND_SLACK
        return cone
