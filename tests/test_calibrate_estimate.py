"""converter.calibrate_estimate: the published figures and their sources, the architectures built for them,
the fit, and the leave-one-architecture-out error it states by link and model size.

Nothing here builds a Keras model: the architectures' features are committed
(converter/data/estimate_features.json) and the fit runs on them.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.detection_postprocess import POSTPROCESS_OP
from converter import calibrate_estimate as calibrate
from converter import estimate
from converter.estimate_architectures import ARCHITECTURES, SSD_CLASSES
from converter.estimate_features import ModelFeatures

MEDIAN_TARGET_PCT = 20.0  # leave-one-out, per calibrated link and over every small model
MAX_RATIO_TARGET = 3.0    # no left-out figure off by more than this
BAR = 1.25                # the bars: within 25%


@pytest.fixture(scope="module")
def data():
    return calibrate.measurements()


@pytest.fixture(scope="module")
def features():
    return calibrate.read_features()


@pytest.fixture(scope="module")
def refit(data, features):
    return calibrate.fit_calibration(data, features)


def _figures(data, architecture, link, source=None):
    return [f for f in data["figures"] if f["architecture"] == architecture and f["link"] == link
            and (source is None or f["source"] == source)]


# ---- the data: every figure with its source ---------------------------------------------------------------------

def test_every_source_says_where_what_and_on_which_host(data):
    for name, source in data["sources"].items():
        assert source["url"].startswith("https://"), name
        assert source["title"] and source["timed"] and source["hosts"], name


def test_every_figure_has_its_source_quote_host_and_link(data):
    for figure in data["figures"]:
        assert figure["source"] in data["sources"], figure
        assert figure["quote"] and figure["host"] and figure["model"], figure
        assert figure["link"] in estimate.CALIBRATED_LINKS, figure
        assert figure["ms"] > 0, figure
        # the quoted line carries the figure itself (as printed there: 2.4, 6.212595004999457, 1,000...)
        assert f"{figure['ms']:g}" in figure["quote"].replace(",", "") or str(figure["ms"]) in figure["quote"], figure
        if not figure.get("fit", True):
            assert figure["why"], figure
        assert figure["architecture"] is None or figure["architecture"] in ARCHITECTURES, figure
        if figure["architecture"] is None:
            assert figure.get("fit") is False, f"{figure['model']}: not built, so not fitted: say why"


def test_the_set_reaches_small_models_usb2_and_other_usb3_hosts(data, features):
    points = calibrate.calibration_points(data, features)
    links = {p.link for p in points}
    assert links == set(estimate.CALIBRATED_LINKS)
    assert len(points) >= 90 and len({p.architecture for p in points}) >= 18
    assert len({p.figure["source"] for p in points}) >= 6
    assert sum(p.size == "small" for p in points) >= 30
    assert {"rp3b", "rp3b+"} <= {p.figure["host"] for p in points if p.link == "usb2"}
    assert len({p.figure["host"] for p in points if p.link == "usb3"}) >= 4  # Coral's desktops, an iMac, a MacBook


def test_every_fitted_architecture_is_built_at_its_size(data, features):
    for figure in data["figures"]:
        key = figure["architecture"]
        if key is None or not figure.get("fit", True):
            continue
        assert key in features, f"{key}: run python -m converter.calibrate_estimate features --only {key}"
        assert features[key]["input_size"] == ARCHITECTURES[key].input_size


@pytest.mark.parametrize("key, macs, params", [
    # published counts: the MobileNet v1 paper (table 8 and the slim checkpoints: 14 M / 0.47 M, 77 M / 1.34 M,
    # 233 M / 2.59 M), slim's Inception v1 (1.5 G, 6.6 M) and v4 (12.3 G, 42.7 M), EfficientNet-EdgeTPU-S (5.4 M)
    ("MobileNet_0.25_128", 14e6, 0.47e6), ("MobileNet_0.5_160", 77e6, 1.33e6), ("MobileNet_0.75_192", 233e6, 2.59e6),
    ("InceptionV1", 1.5e9, 6.6e6), ("InceptionV4", 12.3e9, 42.7e6), ("EfficientNetEdgeTPU_S", None, 5.4e6),
])
def test_built_architectures_match_their_papers(features, key, macs, params):
    summary = features[key]["summary"]
    if macs:
        assert summary["macs"] == pytest.approx(macs, rel=0.05)
    # int8 weights and int32 biases: parameter bytes are a little above the count, and 1000 against 1001 classes
    assert summary["param_bytes"] == pytest.approx(params, rel=0.06)


@pytest.mark.parametrize("key", ["SSDMobileNetV1", "SSDMobileNetV2"])
def test_ssd_detectors_end_in_the_postprocess_op_on_the_cpu(features, key):
    model = ModelFeatures.from_dict(features[key]["features"])
    tail = model.ops[-1]
    assert tail.opcode == POSTPROCESS_OP and not tail.on_tpu
    assert all(op.on_tpu for op in model.ops[:-1])
    # 1917 anchors at 300x300; box encodings and 91 class scores cross back over the link as uint8
    assert tail.in_elements == 1917 * (4 + SSD_CLASSES) == model.tpu_handoff_bytes


def test_with_postprocess_appends_the_op_and_hands_back_the_head():
    from converter.estimate_features import OpFeatures

    head = ModelFeatures(ops=(OpFeatures(0, "CONV_2D", "conv", 100, 10, 50, True, 9, 4, 20),),
                         input_bytes=20, output_bytes=50, peak_activation_bytes=70)
    detector = calibrate.with_postprocess(head, anchors=10, classes=3)
    assert [op.opcode for op in detector.ops] == ["CONV_2D", POSTPROCESS_OP]
    assert detector.ops[-1].in_elements == 10 * 7 and detector.tpu_handoff_bytes == 50


# ---- the fit ------------------------------------------------------------------------------------------------------

def test_committed_calibration_is_what_the_fit_gives(refit):
    committed = estimate.calibration()
    assert committed["calibration_set"] == refit["calibration_set"]
    for name in estimate.SHARED:
        assert committed["params"][name] == pytest.approx(refit["params"][name], rel=1e-3)
    for link in estimate.CALIBRATED_LINKS:
        for name in estimate.PER_LINK[link]:
            assert committed["params"][link][name] == pytest.approx(refit["params"][link][name], rel=1e-3)
        stated, again = committed["leave_one_out_error"]["by_link"][link], refit["leave_one_out_error"]["by_link"][link]
        assert stated["figures"] == again["figures"]  # the same up to the last printed digit (another BLAS, scipy)
        assert stated["median_abs_pct"] == pytest.approx(again["median_abs_pct"], abs=0.3)
        assert stated["max_ratio"] == pytest.approx(again["max_ratio"], abs=0.03)


def test_leave_one_out_error_by_link_and_size_meets_the_targets(refit):
    errors = refit["leave_one_out_error"]
    for link in estimate.CALIBRATED_LINKS:
        stats = errors["by_link"][link]
        assert stats["median_abs_pct"] <= MEDIAN_TARGET_PCT, (link, stats)
        assert set(errors["by_link_and_size"][link]) == set(estimate.SIZES)
    assert errors["by_size"]["small"]["median_abs_pct"] <= MEDIAN_TARGET_PCT, errors["by_size"]
    assert errors["all"]["max_ratio"] <= MAX_RATIO_TARGET, errors["all"]
    assert all(errors["by_size"][size]["figures"] for size in estimate.SIZES)


def test_leave_one_out_leaves_the_whole_architecture_out(data, features, monkeypatch):
    """A left-out architecture's figures on every link and from every source get no say in its estimate."""
    points = calibrate.calibration_points(data, features)
    evaluator = calibrate.Evaluator(features, {p.architecture for p in points})
    trained_on = []
    committed = estimate.calibration()["params"]
    monkeypatch.setattr(calibrate, "fit", lambda pts, ev, start=None: trained_on.append(pts) or committed)
    rows = calibrate.leave_one_out(points, evaluator, estimate.calibration()["params"])
    architectures = sorted({p.architecture for p in points})
    assert len(trained_on) == len(architectures) and len(rows) == len(points)
    for held, training in zip(architectures, trained_on):
        assert held not in {p.architecture for p in training}
        assert len(training) == sum(p.architecture != held for p in points)


def test_fitted_hardware_is_physical():
    p = estimate.calibration()["params"]
    assert 0 < p["conv_efficiency"] <= 1 and 0 < p["depthwise_efficiency"] <= 1
    for link in estimate.CALIBRATED_LINKS:
        assert 0 < p[link]["bytes_per_s"] <= estimate.LINK_CEILING_BYTES_PER_S[link]
        assert 0 < p[link]["invoke_s"] < 10e-3
    # USB 2's bulk rate is far below USB 3's, and a Raspberry Pi 3's fixed cost per invoke above a desktop's
    assert p["usb2"]["bytes_per_s"] < p["usb3"]["bytes_per_s"] / 5
    assert p["usb2"]["invoke_s"] > p["usb3"]["invoke_s"]


# ---- the two bars -----------------------------------------------------------------------------------------

def _within(estimated: float, measured: float) -> bool:
    """|estimated / measured - 1| <= 25%: the percentage error the docs state."""
    return abs(estimated / measured - 1) <= BAR - 1


def test_coral_mobilenet_v1_on_usb2_is_within_25_percent(data):
    """Coral's own mobilenet_v1_1.0_224_quant figures on its USB 2 hosts (Raspberry Pi 3 B and B+): the committed
    fit, and the fit that never saw MobileNet v1 on any link."""
    committed = estimate.calibration()
    figures = _figures(data, "MobileNet", "usb2", "coral-reference")
    assert {f["host"] for f in figures} == {"rp3b", "rp3b+"}
    rows = [r for r in committed["in_sample"] if r["architecture"] == "MobileNet" and r["link"] == "usb2"]
    left_out = [r for r in committed["leave_one_out"] if r["architecture"] == "MobileNet" and r["link"] == "usb2"]
    for figure in figures:
        assert _within(rows[0]["estimated_ms"], figure["ms"]), (rows[0], figure)
        assert _within(left_out[0]["estimated_ms"], figure["ms"]), (left_out[0], figure)


def test_a_width_quarter_mobilenet_at_128_is_within_25_percent(data, features):
    """Coral's 0.9 ms for MobileNet V1 0.25 at 128 (USB 3), from the committed calibration's own estimate of the
    built model. Left out, the fit puts it near 0.4 ms: it is the only published figure this small, and nothing
    else pins the fixed cost per invoke that makes up most of it (docs/estimate.md says so)."""
    (figure,) = _figures(data, "MobileNet_0.25_128", "usb3")
    model = ModelFeatures.from_dict(features["MobileNet_0.25_128"]["features"])
    hw = estimate.hardware()
    ms = estimate.invoke_seconds(estimate.Arrays.of(model), hw, hw.links["usb3"]) * 1e3
    assert _within(ms, figure["ms"]), (ms, figure)
    left_out = [r for r in estimate.calibration()["leave_one_out"] if r["architecture"] == "MobileNet_0.25_128"]
    assert left_out and left_out[0]["estimated_ms"] < figure["ms"]  # stated in the docs, not hidden


def test_the_report_states_the_error_by_link_and_size(refit):
    report = calibrate.calibration_report(refit)
    for link in estimate.CALIBRATED_LINKS:
        assert f"| {estimate.LINK_SHORT[link]} |" in report
    assert "| link | small | medium | large | all sizes |" in report
    assert "Not fitted" in report and "SqueezeNet" in report
    assert np.isfinite([r["estimated_ms"] for r in refit["leave_one_out"]]).all()


def test_the_calibration_file_reads_back_as_written(refit):
    import json

    assert json.loads(calibrate.dump_calibration(refit)) == refit
    committed = estimate.PARAMS_FILE.read_text(encoding="utf-8")
    assert committed.count("\n") < 1000  # one line per row of its per-figure tables
