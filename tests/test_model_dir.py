import json
import shutil

import pytest

from app.errors import ModelDirError
from app.model_dir.reading import discover, read_model_dir, sha256_file
from converter.model_dir import add_files, write_model_dir
from tests.conftest import DEFAULT_MODEL, MODELS

MANIFEST = {
    "name": "tiny",
    "source": "made by the test",
    "licence": "CC0-1.0",
    "input": {"width": 4, "height": 4, "mean": [0], "std": [1]},
}


def test_committed_default_model_is_intact():
    model_dir = read_model_dir(MODELS / DEFAULT_MODEL)
    assert model_dir.name == DEFAULT_MODEL
    assert len(model_dir.labels) == 1000 and model_dir.labels[281] == "tabby, tabby cat"
    path = model_dir.file("int8")  # checks the sha256 recorded in model.json
    assert path.stat().st_size == model_dir.manifest.files["int8"].bytes
    assert model_dir.manifest.build.command == f"python -m converter build {DEFAULT_MODEL}"


def test_write_then_read_round_trip(tmp_path):
    target = write_model_dir(tmp_path, MANIFEST, {"int8": ("tiny_int8.tflite", b"model"), "labels": ("labels.txt", b"a\nb\n")})
    model_dir = read_model_dir(target)
    assert model_dir.labels == ("a", "b")
    assert model_dir.file("int8").read_bytes() == b"model"
    assert discover(tmp_path) == {"tiny": target}
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]  # no staging left behind


def test_changed_file_is_refused(tmp_path):
    target = write_model_dir(tmp_path, MANIFEST, {"int8": ("tiny_int8.tflite", b"model")})
    (target / "tiny_int8.tflite").write_bytes(b"tampered")
    with pytest.raises(ModelDirError, match="sha256"):
        read_model_dir(target).file("int8")


def test_failed_write_keeps_the_old_directory(tmp_path):
    write_model_dir(tmp_path, MANIFEST, {"int8": ("tiny_int8.tflite", b"old")})
    bad = dict(MANIFEST, input={"width": -1, "height": 4, "mean": [0], "std": [1]})
    with pytest.raises(Exception):
        write_model_dir(tmp_path, bad, {"int8": ("tiny_int8.tflite", b"new")})
    assert read_model_dir(tmp_path / "tiny").file("int8").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]


def test_rewrite_keeps_files_it_does_not_replace(tmp_path):
    """Rebuilding the int8 model must not drop a compiled Edge TPU model next to it."""
    write_model_dir(tmp_path, MANIFEST, {"int8": ("tiny_int8.tflite", b"v1"), "edgetpu": ("tiny_int8_edgetpu.tflite", b"tpu")})
    write_model_dir(tmp_path, MANIFEST, {"int8": ("tiny_int8.tflite", b"v2")})
    model_dir = read_model_dir(tmp_path / "tiny")
    assert model_dir.file("int8").read_bytes() == b"v2"
    assert model_dir.file("edgetpu").read_bytes() == b"tpu"


def test_manifest_errors_name_the_file(tmp_path):
    shutil.copytree(MODELS / DEFAULT_MODEL, tmp_path / "m")
    data = json.loads((tmp_path / "m" / "model.json").read_text())
    del data["input"]
    (tmp_path / "m" / "model.json").write_text(json.dumps(data))
    with pytest.raises(ModelDirError, match="model.json"):
        read_model_dir(tmp_path / "m")
    with pytest.raises(ModelDirError, match="missing"):
        read_model_dir(tmp_path / "nothing")


def test_sha256_file(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    assert sha256_file(tmp_path / "f") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_add_files_merges_into_an_existing_directory(tmp_path):
    target = write_model_dir(tmp_path, MANIFEST, {"int8": ("tiny_int8.tflite", b"v1"), "seg": ("seg.tflite", b"s")})
    add_files(target, {"edgetpu": ("tiny_int8_edgetpu.tflite", b"tpu")}, remove=("seg",), compiled={"by": "test"})
    model_dir = read_model_dir(target)
    assert model_dir.file("edgetpu").read_bytes() == b"tpu" and model_dir.file("int8").read_bytes() == b"v1"
    assert not model_dir.has("seg") and not (target / "seg.tflite").exists()
    assert model_dir.manifest.compiled == {"by": "test"}
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]


def test_add_files_keeps_the_old_directory_when_it_fails(tmp_path):
    target = write_model_dir(tmp_path, MANIFEST, {"int8": ("tiny_int8.tflite", b"v1")})
    with pytest.raises(Exception):
        add_files(target, {"edgetpu": ("e.tflite", b"tpu")}, input={"width": -1})
    assert not read_model_dir(target).has("edgetpu") and [p.name for p in tmp_path.iterdir()] == ["tiny"]
    renamed = tmp_path / "other"
    target.rename(renamed)
    with pytest.raises(ModelDirError, match="model.json names 'tiny', the directory 'other'"):
        add_files(renamed, {"edgetpu": ("e.tflite", b"tpu")})


def test_a_changed_labels_file_is_refused(tmp_path):
    """labels.txt is checked against its sha256 like every other file: an appended line is not accepted."""
    target = write_model_dir(tmp_path, MANIFEST, {"int8": ("tiny_int8.tflite", b"m"), "labels": ("labels.txt", b"a\nb\n")})
    with open(target / "labels.txt", "a") as f:
        f.write("c\n")
    with pytest.raises(ModelDirError, match="labels.txt has sha256"):
        read_model_dir(target)


def test_every_committed_model_serves_its_quality():
    """One quality field for every route: labelled evaluation, photo agreement and a detector's boxes alike."""
    for name in discover(MODELS):
        quality = read_model_dir(MODELS / name).manifest.quality_dict()
        assert quality and (quality.get("evaluation") or quality.get("agreement") or quality.get("detection")), name
    fashion = read_model_dir(MODELS / "fashion_mnist").manifest.quality_dict()
    assert fashion["evaluation"]["int8"]["samples"] == 10_000 and "float" in fashion["evaluation"]


def test_manifests_of_the_earlier_layout_still_read(tmp_path):
    """A top-level `evaluation` and agreement sets directly in `quality` (written before the typed format)."""
    evaluation = {"data": "d", "samples": 2, "int8": {"top1_correct": 1, "top5_correct": 2, "samples": 2,
                                                       "top1": 0.5, "top5": 1.0}}
    agreement = {"inputs": 4, "top1_agreement": 0.75, "float_top1_in_int8_top5": 1.0, "disagreements": ["x"]}
    target = write_model_dir(tmp_path, MANIFEST, {"int8": ("tiny_int8.tflite", b"m")})
    raw = json.loads((target / "model.json").read_text())
    raw.update(evaluation=evaluation, quality={"reference": "float", "photos": agreement})
    (target / "model.json").write_text(json.dumps(raw))
    quality = read_model_dir(target).manifest.quality
    assert quality.evaluation.int8.top1_correct == 1 and quality.agreement["photos"].top1_agreement == 0.75
    assert quality.reference == "float"


def test_the_writer_refuses_a_malformed_report(tmp_path):
    with pytest.raises(Exception, match="top1_agreement"):
        write_model_dir(tmp_path, dict(MANIFEST, quality={"agreement": {"photos": {"inputs": 3}}}),
                        {"int8": ("tiny_int8.tflite", b"m")})
    assert not (tmp_path / "tiny").exists()


def test_a_task_and_its_outputs_by_role_round_trip(tmp_path):
    """model.json declares the task and names its output tensors by role (app/tasks/ reads them)."""
    outputs = {"boxes": "TFLite_Detection_PostProcess", "classes": "TFLite_Detection_PostProcess:1",
               "scores": "TFLite_Detection_PostProcess:2", "count": "TFLite_Detection_PostProcess:3"}
    manifest = dict(MANIFEST, task="detection", outputs=outputs)
    target = write_model_dir(tmp_path, manifest, {"int8": ("tiny_int8.tflite", b"model")})
    read = read_model_dir(target).manifest
    assert (read.task, read.outputs) == ("detection", outputs)
    assert read_model_dir(write_model_dir(tmp_path / "c", MANIFEST, {})).manifest.task == "classification"
    with pytest.raises(Exception, match="task"):
        write_model_dir(tmp_path / "bad", dict(MANIFEST, task="Detection!"), {})


def test_a_detectors_decoding_round_trips_with_its_defaults_written_out(tmp_path):
    """model.json `detection`: the decoder and its parameters, the defaults filled in and written, so that the
    file says what the service does; a detector without it is the post-process op's, as before."""
    detection = {"decoder": "yolo_dfl", "classes": 80, "min_score": 0.4, "max_detections": 20}
    manifest = dict(MANIFEST, task="detection", detection=detection,
                    outputs={"class_logits": "Identity", "box_distributions": "Identity_1"})
    target = write_model_dir(tmp_path, manifest, {"int8": ("tiny_int8.tflite", b"model")})
    written = json.loads((target / "model.json").read_text())["detection"]
    assert written == {"decoder": "yolo_dfl", "classes": 80, "strides": [8, 16, 32], "reg_max": 16,
                       "score_activation": "sigmoid", "nms_iou": 0.45, "class_agnostic": False, "min_score": 0.4,
                       "max_detections": 20}
    spec = read_model_dir(target).manifest.detection_spec()
    assert (spec.decoder, spec.roles) == ("yolo_dfl", ("class_logits", "box_distributions"))
    old = read_model_dir(write_model_dir(tmp_path / "ssd", dict(MANIFEST, task="detection"), {}))
    assert old.manifest.detection is None and old.manifest.detection_spec().decoder == "postprocess"


@pytest.mark.parametrize(("change", "expected"), [
    (dict(detection={"decoder": "yolo", "classes": 80}), "needs layout, box_scale"),
    (dict(detection={"decoder": "postprocess", "strides": [8]}), "takes no strides"),
    (dict(detection={"decoder": "yolo_dfl", "classes": 3, "box_scale": "pixels"}), "takes no box_scale"),
    (dict(detection={"decoder": "yolo_dfl", "classes": 3}, outputs={"boxes": "x"}), "roles the 'yolo_dfl' decoder"),
    (dict(task="classification", detection={"decoder": "postprocess"}), "model of task 'classification'"),
    (dict(detection={"decoder": "yolo", "classes": 3, "layout": "attributes_first", "box_scale": "pixels",
                     "nms_iou": 0}), "nms_iou"),
])
def test_a_detection_section_that_does_not_fit_is_refused(tmp_path, change, expected):
    with pytest.raises(Exception, match=expected):
        write_model_dir(tmp_path, {**MANIFEST, "task": "detection", **change}, {})


def test_the_input_convention_round_trips_and_its_absence_is_corals(tmp_path):
    """model.json `input.convention`: whose preprocessing, and why; a model.json without it (every model built here,
    and every import before it was recorded) is fed by Coral's convention, and is written without it."""
    convention = {"name": "ultralytics", "why": "Ultralytics' metadata (metadata.json packed in the file)"}
    target = write_model_dir(tmp_path, dict(MANIFEST, input=dict(MANIFEST["input"], convention=convention)), {})
    assert json.loads((target / "model.json").read_text())["input"]["convention"] == convention
    spec = read_model_dir(target).manifest.input
    assert (spec.maker, spec.convention.why) == ("ultralytics", convention["why"])
    plain = write_model_dir(tmp_path / "plain", MANIFEST, {})
    assert "convention" not in json.loads((plain / "model.json").read_text())["input"]
    assert read_model_dir(plain).manifest.input.maker == "coral"
    for name in MODELS.iterdir():  # the committed models: Coral's, unchanged
        if (name / "model.json").is_file():
            assert read_model_dir(name).manifest.input.convention is None
    with pytest.raises(Exception, match="convention"):
        write_model_dir(tmp_path / "bad", dict(MANIFEST, input=dict(MANIFEST["input"],
                                                                      convention={"name": "opencv", "why": "?"})), {})
