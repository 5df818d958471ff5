"""`python -m converter import` of face models as users have them, on models the tests build (tests/face_models.py,
tests/face_import_models.py): each detector form recognised with no flag and said; the overrides (--boxes,
--anchors); embedders (--task embedding, its alias embed, --output embedding=TENSOR, Coral's pooled extractor);
refusals that name the flag to use, exit code 1 and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.importing import ImportRefused, graph_facts, read_tflite_source
from app.model_dir.reading import read_model_dir
from app.tasks.priors import ULTRA_LIGHT, AnchorSpec, Layer
from converter.__main__ import main
from tests.detection_models import tiny_detector
from tests.doubles.compiled_model_double import compiled_model_bytes
from tests.face_import_models import RETINA_PRIORS, embedding_extractor, retinaface_like, two_vectors
from tests.face_models import PRIORS, tiny_face_detector, tiny_face_embedder
from tests.test_converter_import import run, write

FORMS = [("priors", "softmax"), ("priors", "logits"), ("decoded", "softmax"), ("decoded", "logits")]


def detection(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / name / "model.json").read_text())["detection"]


# ---- face detectors with prior boxes ------------------------------------------------------------------------

@pytest.mark.parametrize(("boxes", "scores"), FORMS)
@pytest.mark.parametrize("order", ["boxes-first", "scores-first"])
def test_each_ulfd_form_is_recognised_with_no_flag_and_said(tmp_path, capsys, boxes, scores, order):
    source = write(tmp_path / "version-RFB-320_int8.tflite", tiny_face_detector(boxes, scores, order))
    code, _, err = run(capsys, "import", source, "--name", "ulfd", "--out", tmp_path)
    assert code == 0, err
    model = read_model_dir(tmp_path / "ulfd")
    spec = model.manifest.detection
    assert (model.manifest.task, spec.decoder, spec.box_encoding, spec.anchors) == ("detection", "priors", boxes,
                                                                                   "ultra_light")
    assert spec.score_activation == ("softmax" if scores == "logits" else "none")
    assert (spec.variances, spec.nms_iou, spec.min_score, spec.classes, spec.landmarks) == ([0.1, 0.2], 0.3, 0.6,
                                                                                             1, None)
    assert model.manifest.outputs == {"boxes": "boxes" if boxes == "decoded" else "locations",
                                      "scores": "scores" if scores == "softmax" else "logits"}
    assert model.labels == ("face",) and model.manifest.input.resize == "stretch"
    line = next(line for line in err.splitlines() if line.startswith("detector: "))
    assert "Ultra-Light-Fast-Generic-Face-Detector" in line and "4420 priors: ULFD's at its 320x240 input" in line
    said = ("decoded corners, an is_test=True export (a run on a synthetic image: 100.0% of the rows" if boxes ==
            "decoded" else "raw locations against the priors (a run on a synthetic image: 0.0% of the rows")
    assert said in line
    assert ("scores: probabilities, made by a SOFTMAX" if scores == "softmax" else
            "scores: logits, from the tensor's range") in line
    assert model.manifest.imported.scores.startswith("a detector, Ultra-Light-Fast-Generic-Face-Detector")


def test_boxes_flag_overrides_the_run(tmp_path, capsys):
    source = write(tmp_path / "ulfd.tflite", tiny_face_detector("priors"))
    code, _, err = run(capsys, "import", source, "--name", "forced", "--out", tmp_path, "--boxes", "decoded")
    assert code == 0, err
    assert detection(tmp_path, "forced")["box_encoding"] == "decoded"
    assert "boxes decoded corners (--boxes decoded)" in err and "synthetic image" not in err


def test_a_compiled_file_alone_cannot_be_run_here_so_boxes_is_asked_for(tmp_path, capsys):
    compiled = write(tmp_path / "ulfd_edgetpu.tflite", compiled_model_bytes(source=tiny_face_detector()))
    code, _, err = run(capsys, "import", compiled, "--name", "tpu", "--out", tmp_path)
    assert code == 1 and "give --boxes priors or --boxes decoded" in err and not (tmp_path / "tpu").exists()
    code, _, err = run(capsys, "import", compiled, "--name", "tpu", "--out", tmp_path, "--boxes", "priors")
    assert code == 0, err
    spec = detection(tmp_path, "tpu")
    assert spec["box_encoding"] == "priors" and spec["score_activation"] == "none"  # the softmax's 1/256 range


def test_the_services_own_checks_refuse_without_a_run():
    """The service's uploads read a file through graph_facts without running it: a face detector is refused with
    the flag the converter takes, never guessed."""
    source = read_tflite_source(Path("ulfd.tflite"), tiny_face_detector())
    with pytest.raises(ImportRefused, match="only a run tells.*give --boxes priors or --boxes decoded"):
        graph_facts(source)


def test_an_anchor_file_is_stored_beside_the_model_with_its_sha256(tmp_path, capsys):
    anchors = write(tmp_path / "ulfd_anchors.json", json.dumps(ULTRA_LIGHT.to_json()) + "\n")
    source = write(tmp_path / "ulfd.tflite", tiny_face_detector())
    code, _, err = run(capsys, "import", source, "--name", "own", "--out", tmp_path, "--anchors", anchors)
    assert code == 0, err
    model = read_model_dir(tmp_path / "own")
    assert model.manifest.detection.anchors == "file"
    stored = model.file("anchors")  # its sha256 checked against model.json's
    assert stored.name == "anchors.json" and stored.read_bytes() == anchors.read_bytes()
    assert "4420 priors: --anchors ulfd_anchors.json (stored as anchors.json)" in err
    assert "a prior-box face detector (anchors from ulfd_anchors.json)" in err


def test_anchors_that_do_not_fit_are_refused_with_both_counts(tmp_path, capsys):
    fewer = AnchorSpec((320, 240), (Layer((8, 8), ((10, 10), (16, 16))),))
    anchors = write(tmp_path / "fewer.json", json.dumps(fewer.to_json()))
    source = write(tmp_path / "ulfd.tflite", tiny_face_detector())
    code, _, err = run(capsys, "import", source, "--name", "x", "--out", tmp_path, "--anchors", anchors)
    assert code == 1
    assert f"these priors number 2400 at ulfd.tflite's 320x240 input; its outputs have {PRIORS} rows" in err
    bad = write(tmp_path / "bad.json", '{"version": 1, "input": [320, 240], "layers": [{"stride": 8, "min_size": 10}]}')
    code, _, err = run(capsys, "import", source, "--name", "x", "--out", tmp_path, "--anchors", bad)
    assert code == 1 and "unknown field(s) ['min_size']" in err and not (tmp_path / "x").exists()


def test_a_retinaface_style_detector_is_recognised_with_its_landmarks(tmp_path, capsys):
    source = write(tmp_path / "retinaface_mnet.tflite", retinaface_like(("scores", "landmarks", "boxes")))
    code, _, err = run(capsys, "import", source, "--name", "retina", "--out", tmp_path)
    assert code == 0, err
    model = read_model_dir(tmp_path / "retina")
    spec = model.manifest.detection
    assert (spec.anchors, spec.landmarks, spec.box_encoding, spec.score_activation) == ("retinaface", 5, "priors",
                                                                                       "softmax")
    assert model.manifest.outputs == {"boxes": "bbox_regressions", "scores": "classifications",
                                      "landmarks": "ldm_regressions"}
    assert f"a RetinaFace-style face detector, 1 class; boxes 'bbox_regressions'" in err
    assert f"{RETINA_PRIORS} priors: RetinaFace's at its 64x64 input" in err and "(5 points)" in err


def test_rows_no_known_prior_set_counts_ask_for_anchors(tmp_path, capsys):
    source = write(tmp_path / "odd.tflite", retinaface_like(("boxes", "scores"), rows=128))
    code, _, err = run(capsys, "import", source, "--name", "x", "--out", tmp_path)
    assert code == 1 and not (tmp_path / "x").exists()
    assert ("odd.tflite's outputs look like a face detector's raw boxes [1, 128, 4] and scores [1, 128, 2], decoded "
            "against 128 prior boxes; at its 64x64 input ULFD's number 235, RetinaFace's number 168. Give its "
            "priors with --anchors FILE.json") in err
    wide = AnchorSpec((64, 64), (Layer((8, 8), ((16, 16), (32, 32))),))  # 128 priors: these fit
    code, _, err = run(capsys, "import", source, "--name", "x", "--out", tmp_path, "--anchors",
                       write(tmp_path / "a.json", json.dumps(wide.to_json())))
    assert code == 0, err
    assert read_model_dir(tmp_path / "x").manifest.detection.anchors == "file"


def test_outputs_that_cannot_be_told_apart_ask_for_output(tmp_path, capsys):
    source = write(tmp_path / "m.tflite", retinaface_like())
    code, _, err = run(capsys, "import", source, "--name", "x", "--out", tmp_path, "--output", "boxes=nothing")
    assert code == 1 and "--output boxes=nothing: m.tflite has no output 'nothing'" in err
    code, _, err = run(capsys, "import", source, "--name", "x", "--out", tmp_path,
                       "--output", "landmarks=classifications")
    assert code == 1 and "with --output landmarks=classifications: a face detector with prior boxes has boxes " \
                         "[1, N, 4], scores [1, N, 2] and optionally landmarks [1, N, 2L]" in err
    code, _, err = run(capsys, "import", source, "--name", "x", "--out", tmp_path, "--output",
                       "scores=classifications", "--output", "boxes=bbox_regressions", "--output",
                       "landmarks=ldm_regressions")
    assert code == 0 and "and --output" in err


def test_coral_ssd_face_detector_serves_as_today_named_face(tmp_path, capsys):
    """Coral's ssd_mobilenet_v2_face_quant_postprocess: one class through TFLite_Detection_PostProcess and no
    labels in the file; named "face" after its file name, as it says."""
    source = write(tmp_path / "ssd_mobilenet_v2_face_quant_postprocess.tflite", tiny_detector(num_classes=1))
    code, _, err = run(capsys, "import", source, "--name", "coral_face", "--out", tmp_path)
    assert code == 0, err
    model = read_model_dir(tmp_path / "coral_face")
    assert model.manifest.detection.decoder == "postprocess" and model.labels == ("face",)  # the op's rows, as today
    assert "named 'face' after the file's name (ssd_mobilenet_v2_face_quant_postprocess.tflite)" in err
    other = write(tmp_path / "ssd_person.tflite", tiny_detector(num_classes=1))
    code, _, err = run(capsys, "import", other, "--name", "person", "--out", tmp_path)
    assert code == 0 and read_model_dir(tmp_path / "person").labels == ()


# ---- embedders ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["embedding", "embed"])
@pytest.mark.parametrize(("io", "mask"), [("uint8", None), ("int8", None), ("uint8", "first"), ("int8", "last")])
def test_an_embedder_is_imported_with_task_embedding(tmp_path, capsys, flag, io, mask):
    source = write(tmp_path / "mobilefacenet.tflite", tiny_face_embedder(io, mask))
    code, _, err = run(capsys, "import", source, "--name", "mfn", "--out", tmp_path, "--task", flag)
    assert code == 0, err
    model = read_model_dir(tmp_path / "mfn")
    embedding = "embedding/uint8" if io == "uint8" else "embedding"
    assert model.manifest.task == "embedding" and model.manifest.outputs == {"embedding": embedding}
    spec = model.manifest.input
    assert (spec.width, spec.height, spec.resize, spec.mean, spec.std) == (96, 112, "stretch", [128.0], [128.0])
    assert model.labels == () and "labels" not in model.manifest.files and model.manifest.face is None
    assert f"embedder: 128 values, --task embedding: its {'one' if mask is None else 'only'} output vector" in err
    if mask is not None:
        assert "outputs ['mask" in err and "are not read" in err


def test_without_task_a_128_value_output_is_a_classifier_that_points_to_task_embedding(tmp_path, capsys):
    source = write(tmp_path / "mobilefacenet.tflite", tiny_face_embedder())
    code, _, err = run(capsys, "import", source, "--name", "mfn", "--out", tmp_path)
    assert code == 0 and read_model_dir(tmp_path / "mfn").manifest.task == "classification"
    assert "if it is an embedder (a face embedder's 128 values), import it with --task embedding" in err
    masked = write(tmp_path / "masked.tflite", tiny_face_embedder("uint8", "last"))
    code, _, err = run(capsys, "import", masked, "--name", "masked", "--out", tmp_path)
    assert code == 1 and "embedders (--task embedding" in err and not (tmp_path / "masked").exists()


def test_several_vectors_need_output_embedding(tmp_path, capsys):
    source = write(tmp_path / "two.tflite", two_vectors())
    code, _, err = run(capsys, "import", source, "--name", "two", "--out", tmp_path, "--task", "embedding")
    assert code == 1 and "2 outputs that could be the embedding" in err and "--output embedding=TENSOR" in err
    code, _, err = run(capsys, "import", source, "--name", "two", "--out", tmp_path, "--output", "embedding=second")
    assert code == 0, err
    model = read_model_dir(tmp_path / "two")
    assert model.manifest.task == "embedding" and model.manifest.outputs == {"embedding": "second"}
    assert "--output embedding=second as given" in err
    masked = write(tmp_path / "masked.tflite", tiny_face_embedder("uint8", "first"))
    code, _, err = run(capsys, "import", masked, "--name", "m", "--out", tmp_path, "--task", "embedding",
                       "--output", "embedding=mask/uint8")
    assert code == 1 and "'mask/uint8' uint8 [1, 2] is not an embedding" in err


def test_coral_embedding_extractor_is_an_embedder_without_a_flag(tmp_path, capsys):
    source = write(tmp_path / "mobilenet_v1_1.0_224_quant_embedding_extractor.tflite", embedding_extractor())
    code, _, err = run(capsys, "import", source, "--name", "extractor", "--out", tmp_path)
    assert code == 0, err
    model = read_model_dir(tmp_path / "extractor")
    assert model.manifest.task == "embedding" and model.manifest.outputs == {"embedding": "embedding"}
    assert "comes from AVERAGE_POOL_2D" in err and "1024 pooled features, not class scores" in err
    labels = write(tmp_path / "labels.txt", "".join(f"class{i}\n" for i in range(1024)))
    code, _, err = run(capsys, "import", source, "--name", "pooled_classifier", "--out", tmp_path, "--labels", labels)
    assert code == 0 and read_model_dir(tmp_path / "pooled_classifier").manifest.task == "classification"
    code, _, err = run(capsys, "import", source, "--name", "e2", "--out", tmp_path, "--task", "embedding",
                       "--labels", labels)
    assert code == 1 and "an embedder has no classes to name" in err


def test_a_task_the_graph_contradicts_is_refused(tmp_path, capsys):
    source = write(tmp_path / "ulfd.tflite", tiny_face_detector())
    code, _, err = run(capsys, "import", source, "--name", "x", "--out", tmp_path, "--task", "embedding")
    assert code == 1 and "has no output an embedding can be" in err
    code, _, err = run(capsys, "import", source, "--name", "x", "--out", tmp_path, "--task", "classification")
    assert code == 1 and "is a detection model" in err
    with pytest.raises(SystemExit):
        main(["import", str(source), "--name", "x", "--task", "embeddings"])
    assert "invalid choice: 'embeddings'" in capsys.readouterr().err


def test_the_synthetic_image_fits_each_input_type():
    from app.importing.faces import synthetic_input
    from app.tflite_file import read_tflite

    for model, dtype in ((tiny_face_detector(), np.int8), (tiny_face_embedder(), np.uint8)):
        tensor = read_tflite(model).graph.tensors[read_tflite(model).graph.inputs[0]]
        image = synthetic_input(tensor)
        assert image.dtype == dtype and image.shape == tuple(tensor.shape)
        assert len(np.unique(image)) > 10  # a scene, not a flat field
