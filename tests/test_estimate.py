"""converter.estimate: the Edge TPU hardware model and its cost, the estimate of a model, and `converter estimate`.

The calibration (published figures, the fit, its stated error) is tested in tests/test_calibrate_estimate.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.detection_postprocess import POSTPROCESS_OP
from app.model_dir.reading import read_model_dir
from app.model_dir.schema import Manifest
from converter import estimate
from converter.__main__ import main
from converter.estimate_features import ModelFeatures, OpFeatures, features, features_of_file
from app.tflite_file import read_tflite
from tests.detection_models import OUTPUT_ORDERS, tiny_detector
from tests.tflite_builder import conv_chain

ROOT = Path(__file__).resolve().parents[1]
MOBILENET_V2 = ROOT / "models" / "mobilenet_v2"
EFFICIENTNET_LITE0 = ROOT / "models" / "efficientnet_lite0"
CORAL_MOBILENET_V2_USB3_MS = 2.6  # Table 1


# ---- the cost model on synthetic structures -------------------------------------------------------------------

def _model(param_bytes: list[int], peak_activation_bytes: int = 0, on_tpu: list[bool] | None = None) -> ModelFeatures:
    on_tpu = on_tpu or [True] * len(param_bytes)
    ops = tuple(OpFeatures(i, "CONV_2D", "conv", macs=1_000_000, param_bytes=b, out_elements=10_000,
                           on_tpu=t, depth=576, channels=64) for i, (b, t) in enumerate(zip(param_bytes, on_tpu)))
    return ModelFeatures(ops=ops, input_bytes=150_528, output_bytes=1000, peak_activation_bytes=peak_activation_bytes)


def test_parameters_are_cached_first_come_and_the_rest_streamed():
    mib = 2**20
    placement = estimate.place_parameters(_model([3 * mib, 3 * mib, 3 * mib, 1 * mib]))
    assert placement.cache_bytes == estimate.SRAM_BYTES - estimate.SRAM_RESERVE_BYTES
    # the third op does not fit in what is left; the fourth, smaller, still does
    assert list(placement.on_chip) == [3 * mib, 3 * mib, 0, 1 * mib]
    assert list(placement.streamed) == [0, 0, 3 * mib, 0]


def test_activations_take_their_share_of_the_on_chip_memory():
    mib = 2**20
    roomy = estimate.place_parameters(_model([5 * mib]))
    crowded = estimate.place_parameters(_model([5 * mib], peak_activation_bytes=4 * mib))
    assert roomy.streamed_bytes == 0 and crowded.streamed_bytes == 5 * mib


def test_streamed_parameters_cost_link_time():
    hw = estimate.hardware()
    small = estimate.Arrays.of(_model([2**20] * 4))
    large = estimate.Arrays.of(_model([2**20] * 4 + [20 * 2**20]))
    usb3 = hw.links["usb3"]
    extra = estimate.invoke_seconds(large, hw, usb3) - estimate.invoke_seconds(small, hw, usb3)
    # 20 MiB streamed over the link, and the op's own overhead
    assert extra == pytest.approx(20 * 2**20 / usb3.bytes_per_s + hw.op_overhead_s, rel=0.01)
    usb2 = hw.links["usb2"]
    assert estimate.invoke_seconds(large, hw, usb2) > 5 * estimate.invoke_seconds(large, hw, usb3)


def test_streaming_overlaps_the_work_before_the_op_that_needs_it():
    """The link delivers parameters ahead while the array works: streaming hides under earlier ops, not later."""
    hw = estimate.Hardware(conv_efficiency=1.0, depthwise_efficiency=1.0, elements_per_s=1e9, op_overhead_s=0.0,
                           links={})
    link = estimate.Link(invoke_s=0.0, bytes_per_s=100e6, cpu_macs_per_s=1e9, cpu_elements_per_s=1e9)
    heavy = OpFeatures(0, "CONV_2D", "conv", macs=400_000_000_000, param_bytes=0, out_elements=1, on_tpu=True,
                       depth=64, channels=64)  # 0.2 s of work at 2e12 MAC/s
    streamed = OpFeatures(1, "CONV_2D", "conv", macs=0, param_bytes=10 * 2**20, out_elements=1, on_tpu=True,
                          depth=64, channels=64)  # 0.105 s over a 100 MB/s link, no work
    link_s = 10 * 2**20 / 100e6

    def seconds(*ops):
        model = ModelFeatures(ops=tuple(ops), input_bytes=0, output_bytes=0, peak_activation_bytes=6 * 2**20)
        return estimate.tpu_seconds(estimate.Arrays.of(model), hw, link)

    assert seconds(heavy, streamed) == pytest.approx(0.2)            # arrived while the heavy op ran
    assert seconds(streamed, heavy) == pytest.approx(link_s + 0.2)  # the heavy op waits for it


def test_array_fill_counts_partly_empty_tiles():
    assert estimate.fill([64, 128, 32, 65, 3]).tolist() == pytest.approx([1, 1, 0.5, 65 / 128, 3 / 64])


# ---- features of real models ------------------------------------------------------------------------------------

def test_features_of_a_small_graph_by_hand():
    model = features(read_tflite(conv_chain("HARD_SWISH")))
    assert [op.opcode for op in model.ops] == ["QUANTIZE", "CONV_2D", "HARD_SWISH", "CONV_2D", "QUANTIZE"]
    conv1, conv2 = model.ops[1], model.ops[3]
    assert conv1.macs == 8 * 8 * 4 * (3 * 3 * 4) and (conv1.depth, conv1.channels) == (36, 4)
    assert conv1.param_bytes == 4 * 3 * 3 * 4 + 4 * 4  # int8 weights + int32 bias
    assert conv2.macs == 8 * 8 * 4 * 4 and conv2.param_bytes == 16 + 16
    # HARD_SWISH (no Edge TPU operation) ends the Edge TPU's part: it and everything after run on the CPU
    assert [op.on_tpu for op in model.ops] == [True, True, False, False, False]
    assert model.input_bytes == 8 * 8 * 4 and model.output_bytes == 8 * 8 * 4
    # live at once at most: the conv1 output and the HARD_SWISH output (uint8 input freed after QUANTIZE)
    assert model.peak_activation_bytes == 2 * 8 * 8 * 4


def test_features_of_mobilenet_v2_match_its_architecture():
    model = features_of_file(read_model_dir(MOBILENET_V2).file("int8"))
    # MobileNetV2 1.0 224: 300 M MACs, 3.5 M parameters (the paper: 300 M multiply-adds, 3.4 M parameters)
    assert model.macs == pytest.approx(300e6, rel=0.01)
    assert 3.4e6 < model.param_bytes < 3.7e6
    assert all(op.on_tpu for op in model.ops)
    assert round(json.loads(json.dumps(model.to_dict()))["input_bytes"]) == 224 * 224 * 3
    assert ModelFeatures.from_dict(model.to_dict()) == model


# ---- the estimate on the committed models ----------------------------------------------------------------------

def test_mobilenet_v2_estimate_is_near_corals_measurement():
    result = estimate.estimate(MOBILENET_V2)
    usb3 = result["latency_ms"]["usb3"]
    assert CORAL_MOBILENET_V2_USB3_MS / 2 < usb3 < CORAL_MOBILENET_V2_USB3_MS * 2
    assert result["parameters"]["streamed_bytes"] == 0  # 3.5 MB fits on chip
    assert result["ops"] == {"edgetpu": 69, "cpu": 0}
    # USB 2 on a Raspberry Pi 3 moves the 150 KB input at ~33 MB/s, with a slower host: Coral's own MobileNet
    # figures there are 9-11 ms
    assert result["latency_ms"]["usb2"] > usb3 + 5
    assert usb3 < result["latency_ms"]["rpi4"] < result["latency_ms"]["usb2"]
    assert result["size"] == "small" and "leave-one-architecture-out" in result["error"]["text"]
    assert result["error"]["by_link_for_size"]["usb2"]["figures"] > 0


def test_efficientnet_lite0_estimate_is_plausible():
    result = estimate.estimate(EFFICIENTNET_LITE0)
    mobilenet = estimate.estimate(MOBILENET_V2)
    # 385 M MACs and 4.7 MB of parameters: a little slower than MobileNetV2, the same order
    assert mobilenet["latency_ms"]["usb3"] < result["latency_ms"]["usb3"] < 4 * mobilenet["latency_ms"]["usb3"]
    assert result["parameters"]["bytes"] == pytest.approx(4.7e6, rel=0.02)


def test_segment_costs_are_per_op_in_order():
    costs = estimate.segment_costs(MOBILENET_V2)
    model = features_of_file(read_model_dir(MOBILENET_V2).file("int8"))
    assert len(costs) == len(model.ops) and all(c >= 0 for c in costs)
    # layout ops (PAD, QUANTIZE, RESHAPE) cost nothing; the sum is below the whole invoke (no link, no overhead)
    assert all(c == 0 for c, op in zip(costs, model.ops) if op.kind == "layout")
    assert model.ops[int(np.argmax(costs))].kind != "layout"
    assert sum(costs) < estimate.estimate(MOBILENET_V2)["latency_ms"]["usb3"]


def test_cpu_ops_are_costed_on_the_host():
    model = features(read_tflite(conv_chain("HARD_SWISH")))
    result = estimate.estimate_features(model)
    assert result["ops"] == {"edgetpu": 2, "cpu": 3}
    hw = estimate.hardware()
    arrays = estimate.Arrays.of(model)
    # the Dev Board's Cortex-A53 is slower at the CPU ops than the desktop, a Raspberry Pi 3 slower still
    assert (estimate.cpu_seconds(arrays, hw.links["usb2"]) > estimate.cpu_seconds(arrays, hw.links["devboard"])
            > estimate.cpu_seconds(arrays, hw.links["usb3"]) > 0)
    # the Edge TPU part hands conv1's output to the CPU's HARD_SWISH: that crosses the link, not the model's output
    assert model.tpu_handoff_bytes == 8 * 8 * 4 and arrays.output_bytes == 8 * 8 * 4
    assert [op["opcode"] for op in result["cpu_ops"]] == ["HARD_SWISH", "CONV_2D", "QUANTIZE"]


# ---- a model whose last op runs on the CPU: a detector's TFLite_Detection_PostProcess ---------------------------

@pytest.mark.parametrize("order", sorted(OUTPUT_ORDERS))
@pytest.mark.parametrize("feed", ["dequantize", "uint8"])
def test_a_detector_is_the_edge_tpu_part_plus_the_postprocess_op_on_the_cpu(order, feed):
    model = features(read_tflite(tiny_detector(order=order, feed=feed)))
    result = estimate.estimate_features(model)
    assert result["ops"]["cpu"] == (3 if feed == "dequantize" else 1)
    (tail,) = [op for op in result["cpu_ops"] if op["opcode"] == POSTPROCESS_OP]
    assert tail["index"] == len(model.ops) - 1
    for link in estimate.LINKS:
        assert tail["ms"][link] > 0 and result["latency_ms"][link] > sum(op["ms"][link] for op in result["cpu_ops"])
    # the CPU reads the box encodings and class scores: 16 anchors x (4 + 2 classes + background) bytes come back
    assert model.tpu_handoff_bytes == 16 * (4 + 3)
    text = estimate.render(result, "tiny")
    assert f"on the CPU after the Edge TPU: {POSTPROCESS_OP}" in text and "included above" in text


def test_the_postprocess_op_costs_more_with_more_anchors_and_on_slower_hosts():
    small = estimate.estimate_features(features(read_tflite(tiny_detector(size=16))))
    large = estimate.estimate_features(features(read_tflite(tiny_detector(size=64))))
    def cost(result, link):
        return next(op["ms"][link] for op in result["cpu_ops"] if op["opcode"] == POSTPROCESS_OP)

    assert cost(large, "usb3") > 5 * cost(small, "usb3")  # 256 anchors against 16
    assert cost(large, "usb2") > cost(large, "rpi4") > cost(large, "usb3")


def test_coral_ssd_estimate_includes_its_stated_postprocess_cost():
    """SSD MobileNet v1 as built for the calibration: the post-process op over 1917 anchors x 95 values."""
    from converter.calibrate_estimate import read_features

    model = ModelFeatures.from_dict(read_features()["SSDMobileNetV1"]["features"])
    result = estimate.estimate_features(model)
    (tail,) = result["cpu_ops"]
    assert tail["opcode"] == POSTPROCESS_OP
    assert 0.1 < tail["ms"]["usb3"] < 5 and tail["ms"]["usb2"] > 3 * tail["ms"]["usb3"]
    # Coral's reference figures for this model: 10.02 ms (Xeon, USB 3) and 62.6 ms (Raspberry Pi 3 B, USB 2)
    assert 10.02 / 2 < result["latency_ms"]["usb3"] < 10.02 * 2
    assert 62.6 / 1.5 < result["latency_ms"]["usb2"] < 62.6 * 1.5


def test_segment_costs_cost_a_cpu_tail_at_its_host_time(tmp_path):
    path = tmp_path / "detector.tflite"
    path.write_bytes(tiny_detector())
    costs = estimate.segment_costs(path)
    model = features_of_file(path)
    assert len(costs) == len(model.ops) and costs[-1] > 0 and model.ops[-1].opcode == POSTPROCESS_OP


def test_size_classes():
    mib = 2**20
    assert estimate.size_class(_model([mib])) == "small"
    big = _model([mib] * 2)
    assert estimate.size_class(ModelFeatures(ops=tuple(
        OpFeatures(i, "CONV_2D", "conv", 600_000_000, mib, 10, True, 576, 64) for i in range(2)),
        input_bytes=1, output_bytes=1, peak_activation_bytes=0)) == "medium"
    assert estimate.size_class(_model([5 * mib, 5 * mib])) == "large" and big.macs < estimate.SMALL_MAX_MACS


def test_estimate_row_is_labelled_as_an_estimate():
    row = estimate.estimate_row(MOBILENET_V2)
    assert "estimated" in row["backend"] and "not measured" in row["backend"] and row["estimated"] is True
    assert row["device_req_s"] == pytest.approx(1000 / row["inference_ms"])


def test_a_compiled_model_is_refused(tmp_path):
    from app.edgetpu.compiled_model import EDGETPU_CUSTOM_OP
    from tests.tflite_builder import GraphBuilder

    g = GraphBuilder()
    image = g.activation("image", [1, 8, 8, 4], "UINT8")
    scores = g.activation("scores", [1, 10], "UINT8")
    g.op("CUSTOM", [image], [scores], custom_code=EDGETPU_CUSTOM_OP)
    compiled = tmp_path / "model_edgetpu.tflite"
    compiled.write_bytes(g.build([image], [scores]))
    with pytest.raises(estimate.EstimateError, match="already compiled"):
        estimate.estimate(compiled)
    with pytest.raises(estimate.EstimateError, match="neither a model directory"):
        estimate.estimate(tmp_path / "missing.tflite")


# ---- model.json and the CLI -------------------------------------------------------------------------------------

def test_manifest_carries_the_estimate_and_reads_old_ones():
    raw = json.loads((MOBILENET_V2 / "model.json").read_text())
    raw.pop("edgetpu_estimate", None)
    assert Manifest.model_validate(raw).edgetpu_estimate is None
    raw["edgetpu_estimate"] = estimate.estimate(MOBILENET_V2)
    again = Manifest.model_validate_json(Manifest.model_validate(raw).to_json())
    assert again.edgetpu_estimate.latency_ms["usb3"] == raw["edgetpu_estimate"]["latency_ms"]["usb3"]


def test_cli_prints_every_link_and_the_stated_error(capsys):
    assert main(["estimate", str(MOBILENET_V2)]) == 0
    out = capsys.readouterr().out
    for title in estimate.LINK_TITLES.values():
        assert title in out
    assert "ESTIMATED" in out and "stated error" in out and "on chip" in out
    assert "size class: small" in out and "for small models:" in out
    for link in estimate.CALIBRATED_LINKS:
        assert estimate.LINK_SHORT[link] in out.split("stated error:")[1]


def test_cli_json_and_record(tmp_path, capsys):
    import shutil

    target = tmp_path / "mobilenet_v2"
    shutil.copytree(MOBILENET_V2, target)
    assert main(["estimate", str(target), "--json", "--record"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed["latency_ms"]) == set(estimate.LINKS)
    recorded = read_model_dir(target).manifest.edgetpu_estimate
    assert recorded.latency_ms == printed["latency_ms"]


def test_cli_bad_input_fails_with_a_message(tmp_path, capsys):
    assert main(["estimate", str(tmp_path / "nothing")]) == 1
    assert "neither a model directory nor a .tflite" in capsys.readouterr().err
    bare = tmp_path / "model.tflite"
    bare.write_bytes(conv_chain())
    assert main(["estimate", str(bare), "--record"]) == 1
    assert "--record needs a model directory" in capsys.readouterr().err


def test_v1_models_shows_the_recorded_estimate(models_copy, capsys):
    import httpx

    from bench.service import ServiceProcess

    model_dir = models_copy / "efficientnet_lite0"
    assert main(["estimate", str(model_dir), "--record"]) == 0
    capsys.readouterr()
    recorded = read_model_dir(model_dir).manifest.edgetpu_estimate
    service = ServiceProcess({"EDGETPU_SERVE_MODEL_DIR": str(models_copy), "EDGETPU_SERVE_BACKENDS": "cpu"},
                             inherit_settings=False)
    try:
        service.wait_ready()
        detail = httpx.get(f"{service.url}/v1/models/efficientnet_lite0", timeout=30).json()
    finally:
        service.stop()
    shown = detail["edgetpu_estimate"]
    assert shown["latency_ms"] == recorded.latency_ms and "not a measurement" in shown["method"]


def test_curl_table_adds_a_labelled_estimated_row_only_without_a_measured_edgetpu(tmp_path):
    from bench import curl_table

    described = {"edgetpu_estimate": estimate.estimate(EFFICIENTNET_LITE0)}
    cpu = {"backend": "cpu", "warm": 5, "inference_p50": 5.0}
    row = curl_table.estimated_row([cpu], described)
    assert row["backend"].startswith("estimated Edge TPU") and "not measured" in row["backend"]
    assert row["inference_p50"] == described["edgetpu_estimate"]["latency_ms"]["usb3"]
    assert row["speedup"] == pytest.approx(5.0 / row["inference_p50"])
    assert row["total_p50"] is None and row["rps"] is None  # nothing else is claimed
    measured = {"backend": "edgetpu", "warm": 5, "inference_p50": 3.0}
    assert curl_table.estimated_row([cpu, measured], described) is None
    assert curl_table.estimated_row([cpu], {}) is None
    saved = tmp_path / "described.json"
    saved.write_text("not json")
    assert curl_table.described_model(str(saved)) == {}


def test_estimate_help_has_an_example_and_is_listed(capsys):
    from converter import __main__ as cli

    with pytest.raises(SystemExit) as done:
        cli.main(["estimate", "--help"])
    assert done.value.code == 0
    assert "example:\n  python -m converter estimate " in capsys.readouterr().out
    assert "python -m converter estimate " in cli.__doc__
    subparsers = next(a for a in cli._parser()._actions if a.dest == "command")  # noqa: SLF001
    assert [a.dest for a in subparsers.choices["estimate"]._actions if not a.help] == []  # noqa: SLF001


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_lite0", "fashion_mnist"])
def test_committed_models_carry_the_current_estimate(name):
    """model.json's edgetpu_estimate is what the committed calibration gives (re-record after a refit)."""
    model_dir = ROOT / "models" / name
    recorded = read_model_dir(model_dir).manifest.edgetpu_estimate
    assert recorded is not None, f"python -m converter estimate models/{name} --record"
    assert recorded.model_dump() == estimate.estimate(model_dir)


def test_the_converter_writes_the_estimate_at_build(tmp_path):
    from app.model_dir.schema import Build, InputSpec
    from converter.writing import write_int8_model

    tflite = conv_chain()
    spec = InputSpec(width=8, height=8, channels=3, mean=[0.0], std=[1.0])
    target = write_int8_model(tmp_path, "tiny", tflite, [f"class {i}" for i in range(4)], spec, description="",
                              source="tests", licence="MIT", build=Build(command="tests"))
    written = read_model_dir(target).manifest.edgetpu_estimate
    assert written is not None and written.model_dump() == estimate.estimate_features(features(read_tflite(tflite)))
