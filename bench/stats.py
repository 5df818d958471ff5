"""The statistics every benchmark reports, computed one way: percentile, median, ratio.

Before this module the scripts computed percentiles three ways (numpy's linear interpolation,
nearest rank, and a rounded index), so two tables could disagree on the same samples. Now
every script imports these. (wrk and h2load compute their own percentiles inside the tool:
bench/device_capacity.py's wrk figures are wrk's.)
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def percentile(values: Iterable[float], p: float) -> float:
    """The p-th percentile (0-100) of a non-empty sample, by linear interpolation between the two
    nearest order statistics: numpy's default `method="linear"` (Hyndman & Fan type 7, also R's
    and pandas' default, and Excel's PERCENTILE.INC).

    Chosen over nearest rank because it moves smoothly with the sample (nearest rank jumps from
    one sample to the next as n changes, which makes p99 of 50 requests simply the maximum or
    the second largest), because anyone can recompute a figure with np.percentile, and because
    most of the scripts (service_overhead, load, emulator_bench, hostile) already used it, so
    their published figures stay as they were. It is monotone: if every request's a <= b, then
    percentile(a, p) <= percentile(b, p) for every p, an ordering the tests rely on.
    """
    sample = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    if sample.size == 0:
        raise ValueError("percentile of an empty sample")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile p must be within 0..100, got {p}")
    return float(np.percentile(sample, p))


def median(values: Iterable[float]) -> float:
    """The 50th percentile (the mean of the two middle values when n is even)."""
    return percentile(values, 50)


def percentile_or_none(values: Iterable[float], p: float) -> float | None:
    """percentile(), or None for an empty sample (a table cell then shows "-")."""
    sample = list(values)
    return percentile(sample, p) if sample else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0: a
    speed-up or overhead figure that cannot be computed is shown as missing, never as inf."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator
