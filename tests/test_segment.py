"""converter/segment_plan.py: where a model can be cut and how the cuts are balanced; converter/segment.py: that
the segments of the committed models are valid int8 models that, chained, compute the whole model's
output byte for byte (here on the TFLite CPU kernels; served, in tests/test_pipeline.py).

The Edge TPU compiler is tests/doubles/edgetpu_compiler_double.py, a TEST DOUBLE: it compiles
nothing, and only the hand-over to the compiler and the placement of its output are tested.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from app.model_dir.reading import read_model_dir
from app.model_dir.schema import segment_kind
from app.tflite_file import read_tflite
from converter.__main__ import main
from converter.model_dir import add_files
from converter.segment import segment_bytes, segment_filename, segment_model_dir
from converter.segment_plan import (
    COST_ESTIMATE,
    COST_PARAMS_MACS,
    Cut,
    SegmentError,
    balance,
    cut_points,
    params_and_macs,
)
from tests.conftest import MODELS
from tests.doubles import edgetpu_compiler_double
from tests.tflite_builder import GraphBuilder

REAL = ("efficientnet_lite0", "mobilenet_v2")


def residual_graph() -> bytes:
    """image -Q-> x -conv1-> y -conv2-> z, add(y, z) -> w -conv3-> v -Q-> out: between conv1
    and the ADD both y and z are live, so the only cuts are at x, y, w and v."""
    g = GraphBuilder()
    image = g.activation("image", [1, 8, 8, 4], "UINT8", zero_point=128)
    x = g.activation("x", [1, 8, 8, 4])
    g.op("QUANTIZE", [image], [x])
    names = {}
    for name in ("conv1", "conv2", "conv3"):
        names[name] = (g.constant(f"{name}/w", np.ones((4, 1, 1, 4)), "INT8"), g.constant(f"{name}/b", np.zeros(4)))
    y, z, w, v = (g.activation(n, [1, 8, 8, 4]) for n in ("y", "z", "w", "v"))
    conv = dict(padding=0, strideW=1, strideH=1, dilationWFactor=1, dilationHFactor=1)
    g.op("CONV_2D", [x, *names["conv1"]], [y], **conv)
    g.op("CONV_2D", [y, *names["conv2"]], [z], **conv)
    g.op("ADD", [y, z], [w])
    g.op("CONV_2D", [w, *names["conv3"]], [v], **conv)
    out = g.activation("out", [1, 8, 8, 4], "UINT8", zero_point=128)
    g.op("QUANTIZE", [v], [out])
    return g.build([image], [out])


def test_cuts_fall_only_where_one_tensor_carries_all_live_state():
    cuts = cut_points(read_tflite(residual_graph()))
    assert [(c.after, c.name) for c in cuts] == [(0, "x"), (1, "y"), (3, "w"), (4, "v")]


def test_balance_makes_the_slowest_segment_as_fast_as_it_can_be():
    costs = [1.0, 1.0, 1.0, 1.0, 4.0, 1.0, 1.0]
    every = [Cut(j, j, f"t{j}") for j in range(6)]
    assert [c.after for c in balance(costs, every, 2)] == [3]        # 4 | 6
    assert [c.after for c in balance(costs, every, 3)] == [3, 4]     # 4 | 4 | 2
    # fewer cut points: the best among them, not an even split of operators
    assert [c.after for c in balance(costs, [every[2], every[4]], 2)] == [2]  # 3 | 7 beats 8 | 2
    with pytest.raises(SegmentError, match=r"3 segments need 2 cut points, the model has 1"):
        balance(costs, every[:1], 3)


def test_costs_count_parameters_and_macs_of_each_operator():
    model = read_tflite(residual_graph())
    pairs = params_and_macs(model)
    # conv 1x1, 4->4 channels on 8x8: 64 * 4 * 4 MACs; 16 int8 weights + 4 int32 biases
    assert pairs[1] == (16 + 16, 64 * 4 * 4)
    assert pairs[3] == (0, 64 * 4)  # ADD: one operation per output value, no parameters


def _run(path_or_bytes, x: np.ndarray) -> np.ndarray:
    if isinstance(path_or_bytes, bytes):
        it = Interpreter(model_content=path_or_bytes, num_threads=1)
    else:
        it = Interpreter(model_path=str(path_or_bytes), num_threads=1)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"]).copy()


@pytest.fixture(scope="module")
def photo_tensors(cat_png, china_jpg):
    """The real photos as each real model's input tensor (the service's own preprocessing)."""
    from app.imaging import prepare
    from app.imaging.quantization import InputQuantizer

    out = {}
    for name in REAL:
        model = read_model_dir(MODELS / name)
        spec = model.manifest.input
        q = model.manifest.quantization.input
        quantizer = InputQuantizer(spec, np.dtype(q.dtype), q.scale, q.zero_point)
        out[name] = [quantizer(prepare(p.read_bytes(), spec, 50_000_000)) for p in (cat_png, china_jpg)]
    return out


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("k", [2, 3])
def test_segments_of_the_real_models_chain_to_the_whole_models_bytes(name, k, photo_tensors):
    path = MODELS / name / f"{name}_int8.tflite"
    whole = read_tflite(path)
    result = segment_bytes(path.read_bytes(), path, k)
    assert len(result.files) == k and result.cost_kind in (COST_ESTIMATE, COST_PARAMS_MACS)
    assert sum(p.last - p.first + 1 for p in result.parts) == len(whole.graph.operators)
    by_name = {t.name: t for t in whole.graph.tensors}
    for data, (in_name, out_name) in zip(result.files, result.names):
        graph = read_tflite(data).graph
        assert len(graph.inputs) == len(graph.outputs) == 1
        for index, name_ in ((graph.inputs[0], in_name), (graph.outputs[0], out_name)):
            tensor, original = graph.tensors[index], by_name[name_]
            assert tensor.name == original.name and tensor.type == original.type and tensor.shape == original.shape
            assert np.array_equal(tensor.quantization.scale, original.quantization.scale)
            assert np.array_equal(tensor.quantization.zero_point, original.quantization.zero_point)
    for x in photo_tensors[name]:
        y = x
        for data in result.files:
            y = _run(data, y)
        assert y.dtype == _run(path, x).dtype and y.tobytes() == _run(path, x).tobytes()


def test_the_command_writes_a_model_directory_listing_its_segments(tmp_path):
    out = tmp_path / "mobilenet_v2_x2"
    assert main(["segment", str(MODELS / "mobilenet_v2"), "--segments", "2", "--out", str(out)]) == 0
    model, original = read_model_dir(out), read_model_dir(MODELS / "mobilenet_v2")
    assert model.name == "mobilenet_v2_x2" and model.labels == original.labels
    assert model.manifest.input == original.manifest.input
    assert model.manifest.quantization == original.manifest.quantization
    segments = model.manifest.segments
    assert segments.count == 2 and segments.balanced_by == COST_ESTIMATE  # converter.estimate is there
    assert segments.source_sha256 == original.manifest.files["int8"].sha256
    assert segments.items[0].input == segments.items[0].input and segments.items[0].output == segments.items[1].input
    files = model.segment_files("int8")  # sha256 checked
    assert [f.name for f in files] == [segment_filename("mobilenet_v2_int8", i, 2) for i in range(2)]
    assert not model.has("int8") and "segment" in model.manifest.build.command
    assert main(["segment", str(out), "--segments", "2", "--out", str(tmp_path / "again")]) == 1
    # segmented again into the same directory: the new segments replace the old ones, none left over
    assert main(["segment", str(MODELS / "mobilenet_v2"), "--segments", "3", "--out", str(out)]) == 0
    again = read_model_dir(out)
    assert again.manifest.segments.count == 3 and len(again.segment_files("int8")) == 3
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["model.json", "labels.txt", *(segment_filename("mobilenet_v2_int8", i, 3) for i in range(3))])
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.png").write_bytes(b"not a model directory")
    assert main(["segment", str(MODELS / "mobilenet_v2"), "--segments", "2", "--out", str(tmp_path / "photos")]) == 1
    assert [p.name for p in (tmp_path / "photos").iterdir()] == ["cat.png"]


def test_a_bare_tflite_gives_segment_files_and_segments_json(tmp_path):
    path = MODELS / "efficientnet_lite0" / "efficientnet_lite0_int8.tflite"
    assert main(["segment", str(path), "--segments", "3", "--out", str(tmp_path / "parts")]) == 0
    listing = json.loads((tmp_path / "parts" / "segments.json").read_text())
    assert [s["file"] for s in listing["segments"]] == [segment_filename(path.stem, i, 3) for i in range(3)]
    assert all((tmp_path / "parts" / s["file"]).is_file() for s in listing["segments"])


def test_cuts_at_named_tensors_and_a_clear_error_where_none_can_be(tmp_path, capsys):
    path = residual_graph()
    (tmp_path / "r.tflite").write_bytes(path)
    assert main(["segment", str(tmp_path / "r.tflite"), "--at", "y,w", "--out", str(tmp_path / "at")]) == 0
    listing = json.loads((tmp_path / "at" / "segments.json").read_text())["segments"]
    assert [(s["input"], s["output"]) for s in listing] == [("image", "y"), ("y", "w"), ("w", "out")]
    assert main(["segment", str(tmp_path / "r.tflite"), "--at", "z", "--out", str(tmp_path / "bad")]) == 1
    assert "no cut point at tensor(s) ['z']" in capsys.readouterr().err
    assert main(["segment", str(tmp_path / "r.tflite"), "--segments", "9", "--out", str(tmp_path / "many")]) == 1
    assert "9 segments need 8 cut points, the model has 4" in capsys.readouterr().err


def test_the_estimate_balances_when_it_is_there(tmp_path, monkeypatch):
    """converter.estimate.segment_costs (the estimate helper's) replaces params+MACs when importable."""
    calls = []

    def segment_costs(model_path):
        calls.append(Path(model_path))
        return [0.0, 0.0, 0.0, 0.0, 10.0, 10.0]  # all the time in the last two operators

    monkeypatch.setitem(sys.modules, "converter.estimate", types.SimpleNamespace(segment_costs=segment_costs))
    (tmp_path / "r.tflite").write_bytes(residual_graph())
    result = segment_bytes(residual_graph(), tmp_path / "r.tflite", 2)
    assert calls == [tmp_path / "r.tflite"] and result.cost_kind == COST_ESTIMATE
    assert result.names[0] == ("image", "v")  # 10 | 10: cut between the two costly operators


def test_compile_hands_each_segment_to_the_compiler_double(tmp_path):
    compiler = edgetpu_compiler_double.install(tmp_path)  # TEST DOUBLE of edgetpu_compiler
    out = tmp_path / "efficientnet_lite0_x2"
    assert main(["segment", str(MODELS / "efficientnet_lite0"), "--segments", "2", "--out", str(out), "--compile",
                 "--compiler", str(compiler)]) == 0
    model = read_model_dir(out)
    compiled = model.segment_files("edgetpu")
    assert [p.name for p in compiled] == [segment_filename("efficientnet_lite0_int8", i, 2, compiled=True)
                                          for i in range(2)]
    compiles = [c for c in edgetpu_compiler_double.calls(compiler) if "-v" not in c]
    assert [Path(c[-1]).name for c in compiles] == [segment_filename("efficientnet_lite0_int8", i, 2)
                                                    for i in range(2)]
    assert all("--min_runtime_version" in c for c in compiles)
    record = model.manifest.edgetpu_compile
    assert record.segments == 2 and record.compiler_version == edgetpu_compiler_double.PINNED
    assert len(record.segment_reports) == 2 and record.int8_sha256 == model.manifest.segments.source_sha256


def _coral_segment(inputs_name: str, output_name: str) -> bytes:
    """A compiled-segment TEST DOUBLE whose tensors are named as Coral's compiler names them (the cut tensors)."""
    import flatbuffers

    from app.tflite_file import schema
    from tests.doubles.compiled_model_double import compiled_model_bytes

    model = schema().ModelT.InitFromPackedBuf(compiled_model_bytes(), 0)
    tensors = model.subgraphs[0].tensors
    tensors[0].name, tensors[1].name = inputs_name, output_name
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def test_coral_num_segments_output_is_followed(tmp_path):
    """A directory compiled with `converter compile --num-segments 2`: cut where the compiler cut,
    its compiled segments kept as the Edge TPU files."""
    import shutil

    shutil.copytree(MODELS / "efficientnet_lite0", tmp_path / "efficientnet_lite0")
    source = tmp_path / "efficientnet_lite0"
    whole = read_tflite(source / "efficientnet_lite0_int8.tflite").graph
    cut = cut_points(read_tflite(source / "efficientnet_lite0_int8.tflite"))[20].name
    first, last = whole.tensors[whole.inputs[0]].name, whole.tensors[whole.outputs[0]].name
    coral = {segment_kind("edgetpu", i): (f"efficientnet_lite0_int8_segment_{i}_of_2_edgetpu.tflite", data)
             for i, data in enumerate([_coral_segment(first, cut), _coral_segment(cut, last)])}
    add_files(source, coral)
    out = tmp_path / "coral_x2"
    assert main(["segment", str(source), "--out", str(out)]) == 0
    model = read_model_dir(out)
    assert [s.output for s in model.manifest.segments.items] == [cut, last]
    assert model.manifest.segments.balanced_by == "edgetpu_compiler's own cuts"
    assert [p.read_bytes() for p in model.segment_files("edgetpu")] == [data for _, data in coral.values()]
    assert main(["segment", str(source), "--segments", "3", "--out", str(tmp_path / "other")]) == 1


def test_model_json_without_segments_reads_as_before_and_bad_segments_are_refused(tmp_path):
    import shutil

    from app.errors import ModelDirError

    whole = read_model_dir(MODELS / "mobilenet_v2")
    assert whole.manifest.segments is None and '"segments"' not in whole.manifest.to_json()
    with pytest.raises(ModelDirError, match="is not segmented"):
        whole.segment_files("int8")
    out = tmp_path / "m_x2"
    segment_model_dir(MODELS / "mobilenet_v2", out, 2)
    shutil.copytree(out, tmp_path / "broken")
    manifest = json.loads((tmp_path / "broken" / "model.json").read_text())
    manifest["segments"]["items"] = []
    (tmp_path / "broken" / "model.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelDirError, match="items"):
        read_model_dir(tmp_path / "broken")


# ---- a detector: the post-processing stays in the last segment ---------------------------------------------

@pytest.mark.parametrize("order", ["tf1", "tf2"])
def test_a_detector_is_cut_only_before_its_heads_and_keeps_its_post_processing_last(tmp_path, order):
    from converter.importer import ImportOptions, import_model
    from tests.detection_models import tiny_detector

    source = tmp_path / "d.tflite"
    source.write_bytes(tiny_detector(order=order, size=32))
    model = read_tflite(source)
    # the heads branch after the QUANTIZE: no single tensor carries the state past that point
    assert [c.name for c in cut_points(model)] == ["normalized"]
    imported = import_model([source], ImportOptions(name="d", out=tmp_path / "models")).path
    out = segment_model_dir(imported, tmp_path / "models" / "d_x2", 2)
    segmented = read_model_dir(out)
    first, last = segmented.manifest.segments.items
    assert (first.first_operator, first.operators, last.first_operator, last.operators) == (0, 1, 1, 8)
    graph = model.graph
    assert last.outputs == [graph.tensors[t].name for t in graph.outputs]  # the model's order, whatever it is
    assert segmented.manifest.outputs == read_model_dir(imported).manifest.outputs  # roles carried over
    with pytest.raises(SegmentError, match="3 segments need 2 cut points, the model has 1"):
        segment_model_dir(imported, tmp_path / "models" / "d_x3", 3)

    image = np.zeros((1, 32, 32, 3), np.uint8)
    image[:, 8:20, 8:20] = 255
    x = image
    for path in segmented.segment_files("int8"):  # chained, the segments answer what the whole model does
        interpreter = Interpreter(model_path=str(path))
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
        interpreter.invoke()
        outputs = {o["name"]: interpreter.get_tensor(o["index"]) for o in interpreter.get_output_details()}
        x = next(iter(outputs.values()))
    whole = Interpreter(model_path=str(source))
    whole.allocate_tensors()
    whole.set_tensor(whole.get_input_details()[0]["index"], image)
    whole.invoke()
    expected = {o["name"]: whole.get_tensor(o["index"]) for o in whole.get_output_details()}
    roles = segmented.manifest.outputs
    count = int(expected[roles["count"]][0])
    assert count > 0 and int(outputs[roles["count"]][0]) == count
    for role in ("boxes", "classes", "scores"):  # entries past `count` are not written by the op
        np.testing.assert_array_equal(outputs[roles[role]][0, :count], expected[roles[role]][0, :count])
