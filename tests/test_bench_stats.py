"""bench/stats.py: the one way every benchmark computes its percentiles, medians and ratios."""

import re

import numpy as np
import pytest

from bench.stats import median, percentile, percentile_or_none, ratio
from tests.conftest import ROOT


def test_percentile_interpolates_linearly_between_order_statistics():
    values = [40.0, 10.0, 30.0, 20.0]  # sorted: 10 20 30 40; rank p/100 * (n - 1)
    assert percentile(values, 0) == 10 and percentile(values, 100) == 40
    assert percentile(values, 50) == pytest.approx(25.0)
    assert percentile(values, 90) == pytest.approx(37.0)  # rank 2.7: 30 + 0.7 * 10
    assert percentile([7.0], 99) == 7.0


def test_percentile_agrees_with_numpy_default_and_accepts_any_iterable():
    sample = np.random.default_rng(1).lognormal(size=101)
    for p in (1, 50, 90, 99):
        assert percentile(iter(sample.tolist()), p) == float(np.percentile(sample, p))
        assert percentile(sample, p) == float(np.percentile(sample, p))


def test_percentile_keeps_request_by_request_order():
    """If each request's inference <= its total, every percentile of inference <= that of total."""
    rng = np.random.default_rng(2)
    inference = rng.uniform(1, 5, 37)
    total = inference + rng.uniform(0, 3, 37)
    for p in range(0, 101, 5):
        assert percentile(inference, p) <= percentile(total, p)


def test_median_of_an_even_sample_is_the_mean_of_the_middle_two():
    assert median([1, 2, 3, 10]) == 2.5
    assert median(x for x in (3, 1, 2)) == 2


def test_empty_samples_and_bad_ranks_are_refused_or_missing():
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match="0..100"):
        percentile([1.0], 101)
    assert percentile_or_none([], 99) is None
    assert percentile_or_none([2.0, 4.0], 50) == 3.0


def test_ratio_is_missing_rather_than_infinite():
    assert ratio(6.0, 3.0) == 2.0
    assert ratio(None, 3.0) is None and ratio(3.0, None) is None and ratio(3.0, 0) is None


def test_no_bench_script_computes_a_percentile_or_median_of_its_own():
    """One definition: a script that brings its own back (np.percentile, statistics.median, a
    sorted-and-indexed rank) would compute the README's figures another way."""
    own = re.compile(r"def (_?percentile|pct_rank)\b|np\.percentile|np\.median|np\.quantile|statistics\.")
    offenders = [f"{path.name}:{n}" for path in (ROOT / "bench").glob("*.py") if path.name != "stats.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if own.search(line)]
    assert not offenders, offenders
