"""The confidence a client sees for a recognition, from the cosine similarity, calibrated per embedder; and the
calibration itself, from same-person and different-person similarities.

DeepStack's clients send a `min_confidence` and compare it with the answer's `confidence`: Home Assistant's
client 0.45 by default, others 0.6 to 0.67. A raw cosine means nothing to them (MobileFaceNet's threshold sits
near 0.3-0.4, ArcFace's elsewhere), so the confidence is a map of the similarity s that puts the embedder's
threshold t at 0.5 and is scaled by how that embedder's similarities spread:

    confidence = sigmoid(z),  z = L * (s - t) / (same - t)        for s >= t
                              z = L * (s - t) / (t - different)   for s <  t,     L = logit(0.9) = ln 9

where `same` and `different` are the median same-person and different-person similarities the calibration
measured. So the threshold is 0.5, the typical same-person pair 0.9 and the typical different-person pair
0.1, whatever the embedder's cosine scale. The map is continuous (both halves are 0.5 at t), strictly monotone
(each half increases), and inside [0, 1]. A client's values then read as the issue asks: 0.45 is
z = -0.20, 9 % of the way from the threshold down to the typical stranger ("a little below"); 0.6 and 0.67
are 18 % and 32 % of the way up to the typical same-person pair ("clearly above"). A linear map of [-1, 1]
would have put 0.45 a quarter of the whole cosine range below the threshold instead.

The threshold comes from pairs (`calibrate`): by default the equal-error threshold (false accepts as rare as
false rejects), or the lowest threshold whose false-accept rate is at most a target. A pair is accepted when
s >= t (confidence >= 0.5). The report gives the separation: d', the overlap of the two sets, the error rates
at the threshold and the equal-error rate. `python -m converter face-threshold` calls it and writes
`Calibration.to_json()` into the embedder's model.json.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

LOGIT_TYPICAL = math.log(9.0)  # logit(0.9): a typical same-person pair reads 0.9, a typical stranger 0.1
FACES_MAX = 10_000             # pair_similarities: 50 million pairs at most (200 MB), a block of rows at a time
PAIRS_MAX = 50_000_000         # calibrate: similarities of each kind, at most


class CalibrationError(ValueError):
    """Similarities or a calibration that cannot make a confidence: say what is wrong."""


@dataclass(frozen=True)
class Calibration:
    """One embedder's map from similarity to confidence: its threshold (confidence 0.5) and the typical
    same-person (0.9) and different-person (0.1) similarities, different < threshold < same, all in (-1, 1)."""

    threshold: float
    same: float
    different: float

    def __post_init__(self):
        values = (self.different, self.threshold, self.same)
        if not all(isinstance(v, int | float) and math.isfinite(v) and -1 < v < 1 for v in values):
            raise CalibrationError(f"a calibration's similarities are finite and inside (-1, 1); got {values}")
        if not self.different < self.threshold < self.same:
            raise CalibrationError(f"a calibration has different < threshold < same; got different "
                                   f"{self.different}, threshold {self.threshold}, same {self.same}")

    @classmethod
    def from_threshold(cls, threshold: float) -> Calibration:
        """A threshold set by hand, without pairs: `same` and `different` half-way from it to the nearer end of
        the cosine range, on both sides (0.35 -> 0.025 and 0.675)."""
        if not (isinstance(threshold, int | float) and math.isfinite(threshold) and -1 < threshold < 1):
            raise CalibrationError(f"a threshold is a cosine similarity inside (-1, 1); got {threshold!r}")
        spread = min(1 - threshold, 1 + threshold) / 2
        return cls(float(threshold), threshold + spread, threshold - spread)

    @classmethod
    def from_json(cls, document: object) -> Calibration:
        """model.json's form: {"threshold": t} or {"threshold": t, "same": s, "different": d}."""
        if not isinstance(document, Mapping) or "threshold" not in document:
            raise CalibrationError(f"a calibration is an object with a threshold (and same and different); "
                                   f"got {document!r:.80}")
        unknown = sorted(set(document) - {"threshold", "same", "different"})
        if unknown:
            raise CalibrationError(f"unknown field(s) {unknown} in a calibration: it has threshold, same, different")
        values = [document.get(key) for key in ("threshold", "same", "different")]
        if any(isinstance(v, bool) or not isinstance(v, int | float | type(None)) for v in values):
            raise CalibrationError(f"a calibration's values are numbers; got {dict(document)!r:.120}")
        if values[1] is None and values[2] is None:
            return cls.from_threshold(values[0])
        if values[1] is None or values[2] is None:
            raise CalibrationError("a calibration gives both `same` and `different`, or neither")
        return cls(*(float(v) for v in values))

    def to_json(self) -> dict[str, float]:
        return {"threshold": self.threshold, "same": self.same, "different": self.different}

    def confidence(self, similarity):
        """The confidence of a similarity (a float, or an array of them: the same shape back), in [0, 1]."""
        s = np.asarray(similarity, np.float64)
        t = self.threshold
        scale = np.where(s >= t, LOGIT_TYPICAL / (self.same - t), LOGIT_TYPICAL / (t - self.different))
        out = _sigmoid((s - t) * scale)
        return float(out) if out.ndim == 0 else out

    def similarity(self, confidence: float) -> float:
        """The lowest similarity whose confidence is at least `confidence` (the inverse map): what a request's
        min_confidence asks of the similarity. -inf for 0 or less (everything passes), inf for 1 or more."""
        c = float(confidence)
        if math.isnan(c):
            raise CalibrationError("a confidence is a number in [0, 1]; got NaN")
        if c <= 0:
            return -math.inf
        if c >= 1:
            return math.inf
        z = math.log(c / (1 - c))
        t = self.threshold
        return t + z * ((self.same - t) if z >= 0 else (t - self.different)) / LOGIT_TYPICAL


def _sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-z) without overflow: e^-log(1 + e^-z)."""
    return np.exp(-np.logaddexp(0.0, -z))


@dataclass(frozen=True)
class ThresholdReport:
    """What calibrate found: the threshold, the error rates there, and how well the two sets separate."""

    calibration: Calibration
    rule: str                 # "equal error" or "false accepts <= X"
    same_pairs: int
    different_pairs: int
    false_accept_rate: float  # different-person pairs with similarity >= threshold
    false_reject_rate: float  # same-person pairs below it
    equal_error_rate: float   # where the two rates meet (the larger of the two at the equal-error threshold)
    equal_error_threshold: float
    d_prime: float            # (mean same - mean different) / sqrt((var same + var different) / 2)
    overlap: tuple[float, float] | None  # [lowest same, highest different] when they cross, else None
    overlap_share: float      # pairs of either kind inside that interval, over all pairs
    same_median: float
    different_median: float

    @property
    def threshold(self) -> float:
        return self.calibration.threshold

    def lines(self) -> list[str]:
        """The report as the converter prints it."""
        overlap = ("none: every same-person pair scores above every different-person pair" if self.overlap is None
                   else f"[{self.overlap[0]:.4f}, {self.overlap[1]:.4f}], {self.overlap_share:.2%} of the pairs")
        return [
            f"pairs: {self.same_pairs} same-person, {self.different_pairs} different-person",
            f"similarity medians: same {self.same_median:.4f}, different {self.different_median:.4f}; "
            f"d' {self.d_prime:.2f}",
            f"overlap: {overlap}",
            f"equal-error rate {self.equal_error_rate:.2%} at {self.equal_error_threshold:.4f}",
            f"threshold ({self.rule}): {self.threshold:.4f}: false accepts {self.false_accept_rate:.2%}, "
            f"false rejects {self.false_reject_rate:.2%}",
        ]


def calibrate(same: Sequence[float] | np.ndarray, different: Sequence[float] | np.ndarray, *,
              false_accept_rate: float | None = None) -> ThresholdReport:
    """The threshold and calibration from same-person and different-person similarities: the equal-error
    threshold, or with `false_accept_rate` the lowest threshold whose false-accept rate is at most that (fewest
    false rejects under it). A threshold is placed in the middle of the gap between the two similarities it
    falls between, so that it does not sit on a measured pair."""
    same, different = _similarities(same, "same-person"), _similarities(different, "different-person")
    if false_accept_rate is not None and not 0 <= false_accept_rate < 1:
        raise CalibrationError(f"a false-accept rate is in [0, 1); got {false_accept_rate!r}")
    same.sort()
    different.sort()
    values = np.unique(np.concatenate([same, different]))
    # candidate k accepts similarities >= values[k] (k = len(values): accepts none)
    accepted_different = len(different) - np.searchsorted(different, values, "left")
    far = np.append(accepted_different / len(different), 0.0)
    frr = np.append(np.searchsorted(same, values, "left") / len(same), 1.0)
    thresholds = np.empty(len(values) + 1)
    thresholds[0] = values[0]
    thresholds[1:-1] = (values[:-1] + values[1:]) / 2
    thresholds[-1] = np.nextafter(values[-1], np.inf)
    worst = np.maximum(far, frr)
    eer_k = _middle_of_best(worst, far + frr)
    if false_accept_rate is None:
        k, rule = eer_k, "equal error"
    else:
        k, rule = int(np.flatnonzero(far <= false_accept_rate)[0]), f"false accepts <= {false_accept_rate:g}"
    threshold = float(np.clip(thresholds[k], -1 + 1e-6, 1 - 1e-6))
    same_median, different_median = float(np.median(same)), float(np.median(different))
    fallback = Calibration.from_threshold(threshold)
    calibration = Calibration(threshold, same_median if same_median > threshold else fallback.same,
                              different_median if different_median < threshold else fallback.different)
    spread = math.sqrt((float(same.var()) + float(different.var())) / 2)
    gap = float(same.mean() - different.mean())
    d_prime = gap / spread if spread > 0 else math.copysign(math.inf, gap) if gap else 0.0
    low, high = float(same[0]), float(different[-1])
    if low <= high:
        inside = (np.searchsorted(same, high, "right") + len(different) - np.searchsorted(different, low, "left"))
        overlap, share = (low, high), float(inside) / (len(same) + len(different))
    else:
        overlap, share = None, 0.0
    return ThresholdReport(calibration, rule, len(same), len(different), float(far[k]), float(frr[k]),
                           float(worst[eer_k]), float(thresholds[eer_k]), d_prime, overlap, share, same_median,
                           different_median)


def _middle_of_best(primary: np.ndarray, secondary: np.ndarray) -> int:
    """The index minimising `primary`, then `secondary`; among indices tied on both, the middle one."""
    best = np.flatnonzero(primary == primary.min())
    best = best[secondary[best] == secondary[best].min()]
    return int(best[len(best) // 2])


def _similarities(values: object, kind: str) -> np.ndarray:
    array = np.asarray(values, np.float64).ravel()
    if array.size == 0:
        raise CalibrationError(f"no {kind} similarities: a calibration needs pairs of both kinds")
    if array.size > PAIRS_MAX:
        raise CalibrationError(f"{array.size} {kind} similarities; a calibration takes at most {PAIRS_MAX}")
    if not np.isfinite(array).all() or array.min() < -1.001 or array.max() > 1.001:
        raise CalibrationError(f"{kind} similarities are cosines in [-1, 1]; got values in "
                               f"[{np.nanmin(array):.4g}, {np.nanmax(array):.4g}] or not finite")
    return np.clip(array, -1.0, 1.0)


def pair_similarities(embeddings: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every same-person pair's and every different-person pair's cosine similarity, from each person's unit
    embeddings ([faces, D]): the input of calibrate. float32, each pair once."""
    people = [(name, np.asarray(vectors, np.float32).reshape(len(vectors), -1)) for name, vectors in
              embeddings.items()]
    if len(people) < 2:
        raise CalibrationError(f"a calibration needs at least two people; got {len(people)}")
    dimensions = {vectors.shape[1] for _, vectors in people}
    if len(dimensions) != 1:
        raise CalibrationError(f"embeddings of one embedder have one dimension; got {sorted(dimensions)}")
    total = sum(len(vectors) for _, vectors in people)
    if total > FACES_MAX:
        raise CalibrationError(f"{total} faces; a calibration takes at most {FACES_MAX}")
    if not any(len(vectors) >= 2 for _, vectors in people):
        raise CalibrationError("no person has two faces: a calibration needs same-person pairs")
    matrix = np.concatenate([vectors for _, vectors in people])
    owner = np.repeat(np.arange(len(people)), [len(vectors) for _, vectors in people])
    same, different = [], []
    for start in range(0, total, 1024):  # a block of rows at a time: the pairs (i, j > i) of those rows
        block = matrix[start:start + 1024] @ matrix.T
        for offset, row in enumerate(block):
            i = start + offset
            later = row[i + 1:]
            mine = owner[i + 1:] == owner[i]
            same.append(later[mine])
            different.append(later[~mine])
    return np.concatenate(same), np.concatenate(different)
