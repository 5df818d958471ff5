"""`python -m converter import`: files a Coral owner has, in every shape they come in, to model directories.

The files are tiny models built here (tests/classifier_models.py, tests/detection_models.py) and the
fixtures of tests/data/metadata/ whose metadata TFLite's own writer wrote. Bad input ends in exit code 1
with a message on stderr and nothing written, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.model_dir.reading import read_model_dir
from converter.__main__ import main
from converter.importer import ImportOptions, ImportRefused, import_model, parse_labels
from tests.classifier_models import feature_model, float_classifier, tiny_classifier, two_input_model
from tests.detection_models import output_names, tiny_detector
from tests.doubles.compiled_model_double import compiled_model_bytes
from tests.doubles.edgetpu_compiler_double import install as install_compiler_double

FIXTURES = Path(__file__).parent / "data" / "metadata"


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def manifest(path: Path) -> dict:
    return json.loads((path / "model.json").read_text())


# ---- files with their labels inside -------------------------------------------------------------------

def test_a_uint8_file_with_packed_labels_imports_as_coral_feeds_it(tmp_path, capsys):
    code, out, err = run(capsys, "import", FIXTURES / "classifier_tf1_uint8.tflite", "--name", "colours",
                         "--out", tmp_path)
    assert code == 0, err
    assert out.strip().splitlines()[-1] == str(tmp_path / "colours")
    model = read_model_dir(tmp_path / "colours")
    assert model.labels == ("red", "green", "blue", "magenta")
    spec = model.manifest.input
    # metadata says (p - 127.5) / 127.5, the input is q = p at scale 1/128, zero point 128: one step apart at most,
    # so the pixels go in as they are (mean = zero point, std = 1 / scale), as pycoral and the Task Library feed it
    assert (spec.width, spec.height, spec.channels, spec.mean, spec.std, spec.resize) == (16, 16, 3, [128], [128],
                                                                                          "stretch")
    assert model.manifest.output.scores == "probabilities" and model.manifest.task == "classification"
    imported = model.manifest.imported
    assert imported.files[0].name == "classifier_tf1_uint8.tflite" and imported.files[0].kind == "int8"
    assert "metadata" in imported.labels and "labels.txt" in imported.labels
    assert imported.metadata["name"] == "ImageClassifier"
    assert model.manifest.licence == "unknown, given by the user" and model.manifest.build.route == "imported"
    assert model.manifest.edgetpu_analysis == "all 5 ops would run on the Edge TPU"
    assert model.manifest.edgetpu_estimate is not None
    assert model.manifest.quantization.input.dtype == "uint8"
    assert model.file("int8").read_bytes() == (FIXTURES / "classifier_tf1_uint8.tflite").read_bytes()
    assert "labels: the file's metadata (labels.txt, packed in the file) (4 classes)" in err


def test_an_int8_file_takes_its_metadata_normalization_and_licence_hint(tmp_path, capsys):
    code, _, err = run(capsys, "import", FIXTURES / "classifier_int8.tflite", "--name", "colours", "--out", tmp_path)
    assert code == 0, err
    model = read_model_dir(tmp_path / "colours")
    assert model.manifest.input.mean == pytest.approx([123.675, 116.28, 103.53])
    assert model.manifest.input.std == pytest.approx([58.395, 57.12, 57.375])
    assert model.manifest.imported.metadata["author"] == "the tests"
    assert "metadata gives the licence 'Apache-2.0'; pass --licence" in err
    assert model.manifest.source.endswith("the file calls itself 'tiny colours' by the tests")


def test_licence_source_and_resize_flags_are_recorded(tmp_path, capsys):
    code, _, err = run(capsys, "import", FIXTURES / "classifier_int8.tflite", "--name", "c", "--out", tmp_path,
                       "--licence", "Apache-2.0", "--source", "Model Maker, 2026", "--resize", "center_crop")
    assert code == 0, err
    m = read_model_dir(tmp_path / "c").manifest
    assert (m.licence, m.source, m.input.resize) == ("Apache-2.0", "Model Maker, 2026", "center_crop")
    assert m.build.command.startswith("python -m converter import ")


# ---- labels files ---------------------------------------------------------------------------------------

def test_coral_id_label_files_with_gaps_name_class_i_on_line_i(tmp_path, capsys):
    model = write(tmp_path / "m.tflite", tiny_classifier(style="tf1", classes=6))
    labels = write(tmp_path / "labels.txt", "0  red\n2  blue\n5: cyan\n")
    code, _, err = run(capsys, "import", model, "--name", "m", "--out", tmp_path, "--labels", labels)
    assert code == 0, err
    assert (tmp_path / "m" / "labels.txt").read_text() == "red\n\nblue\n\n\ncyan\n"
    assert "id label" in read_model_dir(tmp_path / "m").manifest.imported.labels


def test_1000_labels_for_1001_outputs_name_output_0_background(tmp_path):
    model = write(tmp_path / "m.tflite", tiny_classifier(style="tf1", classes=5))
    labels = write(tmp_path / "labels.txt", "a\nb\nc\nd\n")
    done = import_model([model], ImportOptions(name="m", out=tmp_path, labels=labels))
    assert read_model_dir(done.path).labels == ("background", "a", "b", "c", "d")
    assert any("background class" in note for note in done.notes)


def test_labels_that_do_not_fit_are_refused_with_both_counts(tmp_path, capsys):
    model = write(tmp_path / "m.tflite", tiny_classifier(style="tf1", classes=4))
    for text, expected in (("a\nb\n", "has 2 labels, the model has 4 outputs"), ("7 x\n", "names id 7")):
        code, _, err = run(capsys, "import", model, "--name", "m", "--out", tmp_path,
                           "--labels", write(tmp_path / "l.txt", text))
        assert code == 1 and expected in err and "Traceback" not in err
    assert not (tmp_path / "m").exists()


def test_label_file_forms():
    assert parse_labels("cat\ndog\n").form == "one per line"
    assert parse_labels("0\n1\n2\n").by_id == {0: "0", 1: "1", 2: "2"}  # digits as labels: one per line
    assert parse_labels("0 person\n2 car\n").by_id == {0: "person", 2: "car"}
    assert parse_labels("0 a\n0 b\n").form == "one per line"  # repeated ids: not an id list


def test_a_file_without_labels_is_imported_with_numbered_classes_and_says_so(tmp_path, capsys):
    model = write(tmp_path / "m.tflite", tiny_classifier(style="tf2", io="int8"))
    code, _, err = run(capsys, "import", model, "--name", "m", "--out", tmp_path)
    assert code == 0 and "carries no labels: give --labels FILE" in err
    assert read_model_dir(tmp_path / "m").labels == ()


# ---- detectors --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("feed", ["dequantize", "uint8"])
def test_detectors_in_both_output_orders_get_the_same_roles(tmp_path, capsys, feed):
    labels = write(tmp_path / "coco.txt", "0  square\n1  circle\n")
    written = {}
    for order in ("tf1", "tf2"):
        model = write(tmp_path / f"{order}.tflite", tiny_detector(order=order, feed=feed))
        code, _, err = run(capsys, "import", model, "--name", order, "--out", tmp_path, "--labels", labels)
        assert code == 0, err  # the post-processing on the CPU is as intended, not a failure
        written[order] = manifest(tmp_path / order)
    assert written["tf1"]["outputs"] == written["tf2"]["outputs"] == output_names()
    assert list(written["tf1"]["outputs"]) == ["boxes", "classes", "scores", "count"]
    for m in written.values():
        assert m["task"] == "detection" and "as intended" in m["edgetpu_analysis"]
    assert (tmp_path / "tf2" / "labels.txt").read_text() == "square\ncircle\n"


def test_coco_style_labels_map_to_the_class_ids_the_op_outputs(tmp_path):
    model = write(tmp_path / "d.tflite", tiny_detector(num_classes=5))
    cases = {
        "0  person\n2  car\n4  dog\n": "person\n\ncar\n\ndog\n",          # Coral's coco_labels.txt: ids with gaps
        "1 person\n3 car\n5 dog\n": "person\n\ncar\n\ndog\n",               # a 1-based label map
        "background\nperson\nbicycle\ncar\nbus\ndog\n": "person\nbicycle\ncar\nbus\ndog\n",  # background first
    }
    for i, (text, expected) in enumerate(cases.items()):
        done = import_model([model], ImportOptions(name=f"d{i}", out=tmp_path,
                                                   labels=write(tmp_path / f"l{i}.txt", text)))
        assert (done.path / "labels.txt").read_text() == expected, text


def test_a_detector_with_metadata_labels_on_its_classes_output(tmp_path, capsys):
    code, _, err = run(capsys, "import", FIXTURES / "detector_tf2.tflite", "--name", "d", "--out", tmp_path)
    assert code == 0, err
    model = read_model_dir(tmp_path / "d")
    assert model.labels == ("square", "circle") and model.manifest.outputs == output_names()
    assert model.manifest.input.mean == [0] and model.manifest.input.std == [255]


# ---- the plain file and its compiled twin ------------------------------------------------------------------

def test_both_files_are_checked_to_be_one_model_and_both_kept(tmp_path, capsys):
    plain = write(tmp_path / "m.tflite", tiny_classifier(style="tf1"))
    compiled = write(tmp_path / "m_edgetpu.tflite", compiled_model_bytes(source=plain.read_bytes()))
    code, _, err = run(capsys, "import", compiled, plain, "--name", "m", "--out", tmp_path)  # either order
    assert code == 0, err
    model = read_model_dir(tmp_path / "m")
    assert model.file("int8").read_bytes() == plain.read_bytes()
    assert model.file("edgetpu").read_bytes() == compiled.read_bytes()
    assert model.manifest.imported.compiler == {"edgetpu_ops": 1, "min_runtime_version": 14,
                                                "compiler_version": "16.0.384591198"}
    other = write(tmp_path / "o_edgetpu.tflite", compiled_model_bytes(source=tiny_classifier(style="tf2")))
    code, _, err = run(capsys, "import", plain, other, "--name", "n", "--out", tmp_path)
    assert code == 1 and "is not m.tflite compiled" in err and not (tmp_path / "n").exists()


def test_a_compiled_file_alone_is_imported_for_the_edgetpu_backend(tmp_path, capsys):
    compiled = write(tmp_path / "m_edgetpu.tflite", compiled_model_bytes(source=tiny_classifier(style="tf1")))
    code, _, err = run(capsys, "import", compiled, "--name", "m", "--out", tmp_path,
                       "--labels", write(tmp_path / "l.txt", "a\nb\nc\nd\n"))
    assert code == 0, err
    model = read_model_dir(tmp_path / "m")
    assert set(model.manifest.files) == {"edgetpu", "labels"}
    assert model.manifest.output.scores == "probabilities"  # a softmax's quantization: 1/256 at zero
    assert "edgetpu backend only" in err and model.manifest.edgetpu_estimate is None
    code, _, err = run(capsys, "estimate", tmp_path / "m")  # no CPU form: the fix is named
    assert code == 1 and "no CPU form" in err and "converter import m.tflite m_edgetpu.tflite" in err
    logits = write(tmp_path / "x_edgetpu.tflite", compiled_model_bytes(source=tiny_classifier(softmax=False)))
    code, _, err = run(capsys, "import", logits, "--name", "x", "--out", tmp_path)
    assert code == 1 and "--scores logits or --scores probabilities" in err


def test_compile_works_on_an_imported_directory(tmp_path, capsys):
    model = write(tmp_path / "m.tflite", tiny_classifier(style="tf1"))
    assert run(capsys, "import", model, "--name", "m", "--out", tmp_path)[0] == 0
    compiler = install_compiler_double(tmp_path)
    code, out, err = run(capsys, "compile", tmp_path / "m", "--compiler", compiler)
    assert code == 0, err
    assert "placed" in out and read_model_dir(tmp_path / "m").has("edgetpu")


# ---- what the file cannot tell, and bad input --------------------------------------------------------------

def test_a_float_input_without_normalization_asks_for_mean_and_std(tmp_path, capsys):
    model = write(tmp_path / "f.tflite", tiny_classifier(style="tf2", io="float"))
    code, _, err = run(capsys, "import", model, "--name", "f", "--out", tmp_path)
    assert code == 1 and "Give --mean and --std" in err
    code, _, err = run(capsys, "import", model, "--name", "f", "--out", tmp_path, "--mean", "127.5", "--std", "127.5")
    assert code == 0, err  # the float edges run on the CPU around the Edge TPU's part, as intended
    m = read_model_dir(tmp_path / "f").manifest
    assert (m.input.mean, m.input.std, m.quantization) == ([127.5], [127.5], None)
    assert "float input's QUANTIZE before it and DEQUANTIZE after it, as intended" in m.edgetpu_analysis


@pytest.mark.parametrize(("data", "expected"), [
    (float_classifier(), "is a float model"),
    (two_input_model(), "has 2 inputs"),
    (feature_model(), "not an image input"),
    (tiny_classifier()[:700], "not a readable TFLite model"),
    (b"0 person\n1 bicycle\n", "not a TFLite model"),
    (b"", "an empty file"),
])
def test_bad_input_exits_1_with_the_reason_and_writes_nothing(tmp_path, capsys, data, expected):
    model = write(tmp_path / "bad.tflite", data)
    code, out, err = run(capsys, "import", model, "--name", "bad", "--out", tmp_path / "models")
    assert code == 1 and expected in err, err
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "models" / "bad").exists()


def test_the_float_message_points_to_quantize(tmp_path, capsys):
    code, _, err = run(capsys, "import", write(tmp_path / "f.tflite", float_classifier()), "--name", "f",
                       "--out", tmp_path)
    assert code == 1 and "python -m converter quantize" in err


def test_every_truncation_of_a_file_is_refused_cleanly(tmp_path):
    data = (FIXTURES / "classifier_tf1_uint8.tflite").read_bytes()
    for cut in range(8, len(data), 97):
        model = write(tmp_path / "cut.tflite", data[:cut])
        try:
            import_model([model], ImportOptions(name="cut", out=tmp_path / "models"))
        except ImportRefused:
            continue
        # a cut inside the appended zip leaves a whole model: it imports, without the labels it lost
        assert read_model_dir(tmp_path / "models" / "cut").manifest.input.width == 16


def test_an_existing_directory_is_replaced_only_when_asked(tmp_path, capsys):
    model = write(tmp_path / "m.tflite", tiny_classifier(style="tf1"))
    assert run(capsys, "import", model, "--name", "m", "--out", tmp_path)[0] == 0
    code, _, err = run(capsys, "import", model, "--name", "m", "--out", tmp_path)
    assert code == 1 and "pass --replace" in err
    assert run(capsys, "import", model, "--name", "m", "--out", tmp_path, "--replace")[0] == 0
    (tmp_path / "plain").mkdir()
    code, _, err = run(capsys, "import", model, "--name", "plain", "--out", tmp_path, "--replace")
    assert code == 1 and "is not a model directory" in err


def test_the_dead_ends_of_before_point_to_import(tmp_path, capsys):
    """quantize and compile, given a file a Coral owner has, say to import it."""
    model = write(tmp_path / "m.tflite", tiny_classifier(style="tf1"))
    code, _, err = run(capsys, "compile", model)
    assert code == 1 and f"python -m converter import {model} --name NAME" in err and "Traceback" not in err


def test_a_label_maps_placeholders_become_blank_lines(tmp_path):
    model = write(tmp_path / "d.tflite", tiny_detector(num_classes=3))
    labels = write(tmp_path / "labelmap.txt", "???\nperson\n???\ncar\n")  # TF's label maps: background, gaps
    done = import_model([model], ImportOptions(name="d", out=tmp_path, labels=labels))
    assert (done.path / "labels.txt").read_text() == "person\n\ncar\n"
