"""app/importing/preprocessing.py through `python -m converter import`: whose preprocessing an imported model follows
(model.json `input.convention`) and its normalization, from the model's own facts.

- Ultralytics named by its metadata, in both its forms (temp_meta.txt, a dict's repr with int keys, 8.2-8.3;
  metadata.json, 8.4), or by YOLOv5's layout, which carries none: pixels / 255 and a centred letterbox, whatever the
  input's quantization (an int8 input calibrated over [-2.13, 2.63], (0.018658, -14), as Ultralytics' own exports);
- nothing names it: the pixels as they are, with one line, on screen and in model.json, where the input's range is
  not one a pixel normalization makes;
- --convention and --mean/--std win; Frigate's uploads follow the same rule; a model imported earlier by the old rule
  is warned of at load with the command that imports it again (app/model_dir/reimport.py);
- an Ultralytics export's dynamic-range `*_int8.tflite` points at the `*_full_integer_quant.tflite` beside it.

Fast: graph stubs with the outputs' shapes, types and quantization (tests/yolo_models.py yolo_stub), never run.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.importing import graph_facts, handed_over, read_tflite_source
from app.importing.detectors import DetectorOptions
from app.model_dir.reading import read_model_dir
from app.model_dir.reimport import stale_preprocessing
from app.model_dir.schema import Manifest
from converter.__main__ import main
from converter.importer import ImportOptions, ImportRefused, import_model
from tests.test_task_recognition import dynamic_range
from tests.yolo_models import Out, ultralytics_metadata, yolo_stub

CLASSES = ["red", "green", "blue"]
HEAD = Out("Identity", 7, transposed=True, logistic=True)          # [1, 7, 84]: Ultralytics' one tensor at 64
ARTEFACT = (0.018658, -14)                                           # [-2.13, 2.63]: ImageNet's range, calibrated
V5 = Out("output0", 8, anchors_per_cell=3, type="UINT8", zero_point=0, logistic=True)  # [1, 252, 8]


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def imported(tmp_path, data: bytes, name: str = "m", **options) -> Manifest:
    model = write(tmp_path / f"{name}.tflite", data)
    return read_model_dir(import_model([model], ImportOptions(name=name, out=tmp_path / "models", **options)).path
                          ).manifest


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---- Ultralytics, named by its metadata or its layout ---------------------------------------------------------------

@pytest.mark.parametrize(("form", "packed", "version"), [("literal", "temp_meta.txt", "8.2.23"),
                                                        ("json", "metadata.json", "8.4.12")])
def test_ultralytics_metadata_in_either_form_feeds_pixels_over_255_centred(tmp_path, form, packed, version):
    data = yolo_stub([HEAD], metadata=ultralytics_metadata(CLASSES, version=version), metadata_form=form,
                     input_quantization=ARTEFACT)
    manifest = imported(tmp_path, data)
    spec = manifest.input
    assert (spec.mean, spec.std, spec.resize, spec.convention.name) == ([0.0], [255.0], "letterbox", "ultralytics")
    assert spec.convention.why == f"Ultralytics' metadata ({packed} packed in the file, Ultralytics {version})"
    assert "pixels / 255" in manifest.imported.input and "centred on grey 114" in manifest.imported.input
    assert read_model_dir(tmp_path / "models" / "m").labels == tuple(CLASSES)
    assert f"Ultralytics' metadata ({packed}" in manifest.imported.labels
    assert not any("spans" in note for note in manifest.imported.notes)  # the maker named it: no doubt to voice
    assert (manifest.detection.max_detections, manifest.detection.nms_iou) == (300, 0.45)   # yolo predict's max_det


def test_the_literal_form_is_a_python_dict_repr_with_int_keys(tmp_path):
    data = yolo_stub([HEAD], metadata=ultralytics_metadata(CLASSES), metadata_form="literal")
    source = read_tflite_source(Path("m.tflite"), data)
    text = source.metadata.packed["temp_meta.txt"].decode()
    assert text.startswith("{'description': ") and "'names': {0: 'red', 1: 'green', 2: 'blue'}" in text
    assert graph_facts(source).detector.labels == CLASSES


def test_yolov5s_layout_names_ultralytics_without_metadata(tmp_path):
    manifest = imported(tmp_path, yolo_stub([V5], input_type="UINT8"))
    spec = manifest.input
    assert manifest.detection.objectness is True and manifest.detection.classes == 3
    assert (spec.mean, spec.std, spec.resize, spec.convention.name) == ([0.0], [255.0], "letterbox", "ultralytics")
    assert spec.convention.why.startswith("YOLOv5's layout: [1, 252, 8], three anchors a grid cell")
    assert manifest.detection.max_detections == 1000                                 # detect.py's max_det
    assert imported(tmp_path, yolo_stub([V5], input_type="UINT8"), name="capped",
                    detector=DetectorOptions(max_detections=50)).detection.max_detections == 50


def test_an_ultralytics_export_of_another_task_is_not_claimed(tmp_path):
    pose = yolo_stub([Out("o", 56, transposed=True)], metadata=ultralytics_metadata(["person"], "pose"))
    with pytest.raises(ImportRefused):
        imported(tmp_path, pose)


# ---- nothing names it: the pixels as they are ---------------------------------------------------------------------

def test_without_a_maker_the_pixels_go_in_as_they_are_and_an_odd_range_is_said_once(tmp_path, capsys):
    model = write(tmp_path / "yolo.tflite", yolo_stub([HEAD], input_quantization=ARTEFACT))
    code, _, err = run(capsys, "import", model, "--name", "y", "--out", tmp_path / "models")
    assert code in (0, 3), err
    spec = read_model_dir(tmp_path / "models" / "y").manifest.input
    assert spec.convention.name == "coral" and spec.resize == "letterbox"
    assert spec.mean == [114] and spec.std == pytest.approx([1 / 0.018658], rel=1e-6)  # q = pixel - 128
    said = [line for line in err.splitlines() if "spans [-2.13, 2.63]" in line]
    assert len(said) == 1 and "not a range a pixel normalization makes" in said[0] and "--mean 0 --std 255" in said[0]
    notes = read_model_dir(tmp_path / "models" / "y").manifest.imported.notes
    assert [note for note in notes if "spans" in note] == [said[0].removeprefix("note: ")]
    assert "--convention ultralytics" in read_model_dir(tmp_path / "models" / "y").manifest.imported.input


@pytest.mark.parametrize(("quantization", "input_type"), [
    ((1 / 255, -128), "INT8"), ((1 / 255, 0), "UINT8"),           # [0, 1]
    ((1 / 128, 0), "INT8"), ((1 / 128, 128), "UINT8"),            # [-1, 1) as Coral's models take it
    ((2 / 255, 127), "UINT8"),                                     # [-1, 1], up to rounding
    ((1.0, -128), "INT8"),                                         # [0, 255]
])
def test_the_ranges_pixel_normalizations_make_pass_without_a_word(tmp_path, quantization, input_type):
    manifest = imported(tmp_path, yolo_stub([HEAD], input_type=input_type, input_quantization=quantization))
    assert not any("spans" in note for note in manifest.imported.notes)
    assert manifest.input.convention.name == "coral"


# ---- the flags win ---------------------------------------------------------------------------------------------------

def test_the_convention_flag_and_the_normalization_flags_win(tmp_path):
    plain = yolo_stub([HEAD], input_quantization=ARTEFACT)
    told = imported(tmp_path, plain, name="told", convention="ultralytics").input
    assert (told.mean, told.std, told.convention.name) == ([0.0], [255.0], "ultralytics")
    assert told.convention.why == "--convention ultralytics as given"
    made = yolo_stub([HEAD], metadata=ultralytics_metadata(CLASSES), input_quantization=ARTEFACT)
    coral = imported(tmp_path, made, name="coral", convention="coral").input
    assert coral.convention.name == "coral" and coral.mean == [114]    # the file's quantization, as Coral feeds it
    given = imported(tmp_path, made, name="given", mean=[127.5], std=[127.5]).input
    assert (given.mean, given.std, given.convention.name) == ([127.5], [127.5], "ultralytics")
    stretched = imported(tmp_path, made, name="stretched", resize="stretch").input
    assert (stretched.resize, stretched.convention.name) == ("stretch", "ultralytics")


# ---- Frigate's uploads ---------------------------------------------------------------------------------------------

def test_an_upload_follows_the_same_rule(tmp_path):
    def handed(data: bytes):
        source = read_tflite_source(Path("up.tflite"), data)
        return handed_over("up", source, graph_facts(source), "uploaded by a test", "uploaded", notes=[])[0]

    ultralytics = handed(yolo_stub([HEAD], input_type="UINT8", metadata=ultralytics_metadata(CLASSES)))
    assert (ultralytics.input.mean, ultralytics.input.std, ultralytics.input.resize,
            ultralytics.input.convention.name) == ([0.0], [255.0], "letterbox", "ultralytics")
    plain = handed(yolo_stub([HEAD], input_type="UINT8"))
    assert (plain.input.mean, plain.input.std, plain.input.resize, plain.input.convention.name) == \
        ([0], [255], "stretch", "coral")
    assert not plain.imported.notes                                      # [0, 1]: nothing to say
    odd = handed(yolo_stub([HEAD], input_type="UINT8", input_quantization=(0.018658, 114)))
    assert [note for note in odd.imported.notes if "spans [-2.13, 2.63]" in note]


# ---- a model imported by the old rule ------------------------------------------------------------------------------

def _earlier(manifest: Manifest, **input_update) -> Manifest:
    """The model.json an import wrote before the convention was recorded: no input.convention, Coral's feeding."""
    data = manifest.model_dump(mode="json", exclude_none=True)
    data["input"].pop("convention")
    data["input"].update(input_update)
    return Manifest.model_validate(data)


def test_an_ultralytics_export_imported_earlier_is_warned_of_with_the_command(tmp_path, caplog):
    made = yolo_stub([HEAD], metadata=ultralytics_metadata(CLASSES), input_quantization=ARTEFACT)
    model = write(tmp_path / "yolov8n_full_integer_quant.tflite", made)
    manifest = read_model_dir(import_model([model], ImportOptions(
        name="yolo", out=tmp_path / "models",
        command=f"python -m converter import {model} --name yolo")).path).manifest
    assert stale_preprocessing(manifest) is None                               # imported now: fed as its maker does
    old = _earlier(manifest, mean=[114.0], std=[53.59631])
    said = stale_preprocessing(old)
    assert "its pixels go in with mean 114, std 53.5963, where Ultralytics feeds pixels / 255" in said
    assert "top-left on black, where Ultralytics centres it on grey 114" in said
    assert said.endswith(f"import it again: python -m converter import {model} --name yolo --replace")
    given = _earlier(manifest, mean=[0.0], std=[255.0], resize="stretch")       # as --mean 0 --std 255 --resize stretch
    assert stale_preprocessing(given) is None
    plain = read_model_dir(import_model([write(tmp_path / "p.tflite", yolo_stub([HEAD]))],
                                        ImportOptions(name="p", out=tmp_path / "models")).path).manifest
    assert stale_preprocessing(_earlier(plain)) is None                        # no maker named: fed as before


def test_yolov5s_imported_earlier_is_warned_of_by_its_layout(tmp_path):
    manifest = imported(tmp_path, yolo_stub([V5], input_type="UINT8"), name="v5")
    old = _earlier(manifest)
    said = stale_preprocessing(old)
    assert "top-left on black" in said and "pixels go in" not in said   # its uint8 (1/255, 0) was pixels / 255 already
    assert said.endswith("import it again: python -m converter import v5.tflite --name v5 --replace")


def test_the_warning_is_logged_when_the_service_loads_the_model(tmp_path, caplog):
    from app.registry import Registry
    from app.settings import Settings

    made = yolo_stub([HEAD], metadata=ultralytics_metadata(CLASSES), input_quantization=ARTEFACT)
    manifest = imported(tmp_path, made, name="yolo")
    directory = tmp_path / "models" / "yolo"
    (directory / "model.json").write_text(_earlier(manifest, mean=[114.0], std=[53.59631]).to_json())
    registry = Registry(Settings(model_dir=tmp_path / "models", backends=["cpu"], workers=1))
    registry.configure()
    try:
        with caplog.at_level(logging.WARNING, logger="app.registry.loading"):
            registry.load_all()
    finally:
        registry.close()
    warned = [r.getMessage() for r in caplog.records if "imported before the importer" in r.getMessage()]
    assert len(warned) == 1 and warned[0].endswith("python -m converter import yolo.tflite --name yolo --replace")


# ---- Ultralytics' other files --------------------------------------------------------------------------------------

def test_a_dynamic_range_int8_file_points_at_its_full_integer_twin(tmp_path, capsys):
    int8 = write(tmp_path / "yolov8n_int8.tflite", dynamic_range())
    code, _, err = run(capsys, "import", int8, "--name", "y", "--out", tmp_path / "models")
    assert code == 1 and "dynamic-range quantized" in err
    assert "that export wrote yolov8n_full_integer_quant.tflite beside it" in err and "It is there" not in err
    write(tmp_path / "yolov8n_full_integer_quant.tflite", yolo_stub([HEAD]))
    code, _, err = run(capsys, "import", int8, "--name", "y", "--out", tmp_path / "models")
    twin = tmp_path / "yolov8n_full_integer_quant.tflite"
    assert code == 1 and f"It is there: python -m converter import {twin} --name y --out {tmp_path / 'models'}" in err
    other = write(tmp_path / "model.tflite", dynamic_range())
    code, _, err = run(capsys, "import", other, "--name", "o", "--out", tmp_path / "models")
    assert code == 1 and "full_integer_quant" not in err and "python -m converter quantize" in err


def test_the_command_line_takes_the_convention_and_its_help_says_the_defaults(tmp_path, capsys):
    model = write(tmp_path / "y.tflite", yolo_stub([HEAD], input_quantization=ARTEFACT))
    code, _, err = run(capsys, "import", model, "--name", "y", "--out", tmp_path / "models", "--convention",
                       "ultralytics")
    assert code in (0, 3), err
    assert "convention: ultralytics (--convention ultralytics as given)" in err
    spec = read_model_dir(tmp_path / "models" / "y").manifest.input
    assert (spec.mean, spec.std, spec.convention.name) == ([0.0], [255.0], "ultralytics")
    with pytest.raises(SystemExit):
        main(["import", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "letterbox for a YOLO head" in usage and "stretch for anything else" in usage
    assert "--convention {coral,ultralytics}" in usage
