"""app/faces/confidence.py: the similarity -> confidence map's properties, the threshold from pairs against a
count over every possible threshold, and the separation it reports."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.faces.confidence import (FACES_MAX, Calibration, CalibrationError, calibrate, pair_similarities)

MOBILEFACENET_LIKE = Calibration(threshold=0.35, same=0.65, different=0.05)


def test_the_map_is_monotone_continuous_in_0_1_and_puts_the_threshold_at_half():
    c = MOBILEFACENET_LIKE
    s = np.linspace(-1, 1, 200_001)
    confidence = c.confidence(s)
    assert confidence.min() >= 0 and confidence.max() <= 1
    assert (np.diff(confidence) > 0).all()  # strictly increasing
    assert np.abs(np.diff(confidence)).max() < 1e-4  # no jump anywhere, the threshold included
    assert c.confidence(0.35) == 0.5
    assert c.confidence(0.35 - 1e-12) == pytest.approx(0.5, abs=1e-10)
    assert c.confidence(0.65) == pytest.approx(0.9) and c.confidence(0.05) == pytest.approx(0.1)
    assert isinstance(c.confidence(0.4), float) and c.confidence(np.array([[0.1, 0.9]])).shape == (1, 2)


def test_clients_values_mean_what_they_should():
    c = MOBILEFACENET_LIKE
    below, above_low, above_high = c.similarity(0.45), c.similarity(0.6), c.similarity(0.67)
    # 0.45: a little below the threshold, well above the typical stranger
    assert c.different < below < c.threshold and (c.threshold - below) < 0.1 * (c.threshold - c.different)
    # 0.6 - 0.67: clearly above the threshold, short of the typical same-person pair
    assert c.threshold + 0.15 * (c.same - c.threshold) < above_low < above_high < c.same
    assert above_high - c.threshold < 0.35 * (c.same - c.threshold)


@pytest.mark.parametrize("confidence", [1e-9, 0.01, 0.1, 0.45, 0.5, 0.6, 0.67, 0.9, 0.999])
def test_similarity_inverts_the_map(confidence):
    s = MOBILEFACENET_LIKE.similarity(confidence)
    assert MOBILEFACENET_LIKE.confidence(s) == pytest.approx(confidence, rel=1e-9)
    assert MOBILEFACENET_LIKE.confidence(s - 1e-9) < confidence <= MOBILEFACENET_LIKE.confidence(s + 1e-12) + 1e-12


def test_the_ends_of_the_inverse():
    assert MOBILEFACENET_LIKE.similarity(0) == -math.inf and MOBILEFACENET_LIKE.similarity(1) == math.inf
    with pytest.raises(CalibrationError, match="NaN"):
        MOBILEFACENET_LIKE.similarity(float("nan"))


def test_a_threshold_alone_spreads_halfway_to_the_nearer_end():
    c = Calibration.from_threshold(0.35)
    assert (c.threshold, c.same, c.different) == pytest.approx((0.35, 0.675, 0.025))
    c = Calibration.from_threshold(-0.6)
    assert (c.same, c.different) == pytest.approx((-0.4, -0.8))
    assert Calibration.from_json({"threshold": 0.35}) == Calibration.from_threshold(0.35)
    assert Calibration.from_json(MOBILEFACENET_LIKE.to_json()) == MOBILEFACENET_LIKE


@pytest.mark.parametrize("document, message", [
    (None, "an object with a threshold"),
    ({"same": 0.5}, "an object with a threshold"),
    ({"threshold": 0.3, "same": 0.6}, "both `same` and `different`"),
    ({"threshold": 0.3, "margin": 1}, r"unknown field\(s\) \['margin'\]"),
    ({"threshold": True}, "are numbers"),
    ({"threshold": "0.3"}, "are numbers"),
    ({"threshold": 1.0}, "inside \\(-1, 1\\)"),
    ({"threshold": 0.3, "same": 0.2, "different": 0.1}, "different < threshold < same"),
    ({"threshold": 0.3, "same": 0.6, "different": float("nan")}, "finite"),
])
def test_a_bad_calibration_says_what_is_wrong(document, message):
    with pytest.raises(CalibrationError, match=message):
        Calibration.from_json(document)


def rates(same, different, threshold):
    same, different = np.asarray(same), np.asarray(different)
    return float((different >= threshold).mean()), float((same < threshold).mean())


def test_separable_sets_get_the_middle_of_the_gap():
    report = calibrate([0.5, 0.7, 0.6], [0.1, -0.2, 0.3])
    assert report.threshold == pytest.approx(0.4)
    assert (report.false_accept_rate, report.false_reject_rate, report.equal_error_rate) == (0, 0, 0)
    assert report.overlap is None and report.overlap_share == 0
    assert report.calibration == Calibration(0.4, 0.6, 0.1)
    spread = math.sqrt((np.var([.5, .7, .6]) + np.var([.1, -.2, .3])) / 2)
    assert report.d_prime == pytest.approx((0.6 - 0.0667) / spread, rel=1e-3)
    assert any("overlap: none" in line for line in report.lines())


def test_the_equal_error_threshold_is_the_best_of_every_possible_one():
    rng = np.random.default_rng(11)
    same, different = np.clip(rng.normal(0.6, 0.12, 3000), -1, 1), rng.normal(0.1, 0.12, 20000)
    report = calibrate(same, different)
    # every distinct threshold, counted directly
    candidates = np.unique(np.concatenate([same, different, [2.0]]))
    worst = min(max(rates(same, different, t)) for t in candidates)
    assert max(report.false_accept_rate, report.false_reject_rate) == pytest.approx(worst)
    assert (report.false_accept_rate, report.false_reject_rate) == pytest.approx(rates(same, different,
                                                                                        report.threshold))
    assert report.equal_error_rate == pytest.approx(worst)
    # two normals of equal spread, d' = 0.5 / 0.12: the equal-error rate is Phi(-d'/2), at the mid-point
    assert report.equal_error_rate == pytest.approx(0.5 * math.erfc(0.5 / 0.12 / 2 / math.sqrt(2)), abs=0.01)
    assert report.threshold == pytest.approx(0.35, abs=0.02)
    assert report.d_prime == pytest.approx(0.5 / 0.12, rel=0.05)
    low, high = report.overlap
    assert low == same.min() and high == different.max()
    inside = ((same >= low) & (same <= high)).sum() + ((different >= low) & (different <= high)).sum()
    assert report.overlap_share == pytest.approx(inside / 23000)
    assert report.calibration.same == pytest.approx(np.median(same))
    assert report.calibration.different == pytest.approx(np.median(different))


def test_a_false_accept_target_gives_the_lowest_threshold_that_meets_it():
    rng = np.random.default_rng(12)
    same, different = np.clip(rng.normal(0.6, 0.12, 2000), -1, 1), rng.normal(0.1, 0.12, 10000)
    report = calibrate(same, different, false_accept_rate=0.001)
    far, frr = rates(same, different, report.threshold)
    assert far <= 0.001 and (far, frr) == pytest.approx((report.false_accept_rate, report.false_reject_rate))
    # one distinct similarity lower and the target is missed
    below = different[different < report.threshold].max()
    assert rates(same, different, below)[0] > 0.001
    assert report.threshold > calibrate(same, different).threshold
    assert report.rule == "false accepts <= 0.001"
    assert calibrate(same, different, false_accept_rate=0).false_accept_rate == 0


def test_a_useless_embedder_still_gets_a_valid_calibration():
    report = calibrate([0.1, 0.2, 0.3], [0.1, 0.2, 0.3])
    c = report.calibration
    assert c.different < c.threshold < c.same
    assert report.overlap == (0.1, 0.3) and report.overlap_share == 1.0 and report.d_prime == 0


@pytest.mark.parametrize("same, different, message", [
    ([], [0.1], "no same-person similarities"),
    ([0.5], [], "no different-person similarities"),
    ([0.5, float("nan")], [0.1], "cosines in"),
    ([0.5, 1.5], [0.1], "cosines in"),
])
def test_bad_similarities_say_what_is_wrong(same, different, message):
    with pytest.raises(CalibrationError, match=message):
        calibrate(same, different)
    with pytest.raises(CalibrationError, match="false-accept rate"):
        calibrate([0.5], [0.1], false_accept_rate=1.0)


def unit_rows(rng, count, dimension=16):
    rows = rng.standard_normal((count, dimension)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_pairs_are_every_pair_once():
    rng = np.random.default_rng(13)
    people = {"ann": unit_rows(rng, 3), "bob": unit_rows(rng, 1), "cy": unit_rows(rng, 4)}
    same, different = pair_similarities(people)
    assert len(same) == 3 + 0 + 6 and len(different) == (8 * 7 // 2) - 9
    everyone = np.concatenate(list(people.values()))
    owner = [0, 0, 0, 1, 2, 2, 2, 2]
    expected_same = sorted(float(everyone[i] @ everyone[j]) for i in range(8) for j in range(i + 1, 8)
                           if owner[i] == owner[j])
    expected_different = sorted(float(everyone[i] @ everyone[j]) for i in range(8) for j in range(i + 1, 8)
                                if owner[i] != owner[j])
    np.testing.assert_allclose(sorted(same), expected_same, atol=1e-6)
    np.testing.assert_allclose(sorted(different), expected_different, atol=1e-6)


def test_pairs_need_two_people_and_someone_with_two_faces():
    rng = np.random.default_rng(14)
    with pytest.raises(CalibrationError, match="at least two people"):
        pair_similarities({"ann": unit_rows(rng, 3)})
    with pytest.raises(CalibrationError, match="no person has two faces"):
        pair_similarities({"ann": unit_rows(rng, 1), "bob": unit_rows(rng, 1)})
    with pytest.raises(CalibrationError, match="one dimension"):
        pair_similarities({"ann": unit_rows(rng, 2, 8), "bob": unit_rows(rng, 2, 16)})
    with pytest.raises(CalibrationError, match=f"at most {FACES_MAX}"):
        pair_similarities({"ann": np.zeros((FACES_MAX, 2), np.float32), "bob": np.zeros((1, 2), np.float32)})
