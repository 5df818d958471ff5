"""python -m converter inspect: the table, --json, and exit codes scripts can rely on."""

import json

import pytest

from app.model_dir.reading import read_model_dir
from converter.__main__ import EXIT_CPU_OPS, EXIT_FAILED, EXIT_OK, main
from tests.conftest import DEFAULT_MODEL, MODELS
from tests.doubles.compiled_model_double import compiled_model_bytes
from tests.tflite_builder import GraphBuilder, conv_chain

# The committed classifiers. A detector ends in TFLite_Detection_PostProcess, which runs on the CPU by design:
# tests/test_ssdlite_mobilenet_v2_person.py checks that everything before it maps.
COMMITTED = sorted(p for p in MODELS.glob("*/*_int8.tflite")
                   if read_model_dir(p.parent).manifest.task == "classification")


@pytest.mark.parametrize("model", COMMITTED, ids=[p.parent.name for p in COMMITTED])
def test_every_committed_model_maps_whole(model, capsys):
    assert main(["inspect", str(model)]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("all ") and out.splitlines()[-1].endswith(" ops would run on the Edge TPU")
    assert "CPU" not in out.split("\n", 2)[2]  # no operator row says CPU


def test_the_default_model_table(capsys):
    main(["inspect", str(MODELS / DEFAULT_MODEL / f"{DEFAULT_MODEL}_int8.tflite")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("62 operators, not compiled")
    assert lines[1].split() == ["index", "operator", "runs", "on", "reason"]
    assert lines[2].split() == ["0", "QUANTIZE", "Edge", "TPU"]
    assert lines[-1] == "all 62 ops would run on the Edge TPU"


def test_an_unsupported_op_in_the_middle_is_named_with_what_depends_on_it(tmp_path, capsys):
    path = tmp_path / "chain.tflite"
    path.write_bytes(conv_chain("HARD_SWISH"))
    assert main(["inspect", str(path)]) == EXIT_CPU_OPS
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "first unsupported op: HARD_SWISH at index 2; 2 of 5 ops would run on the Edge TPU"
    refused, after = lines[4], lines[5]
    assert refused.split()[:3] == ["2", "HARD_SWISH", "CPU"] and "not an Edge TPU operation" in refused
    assert after.split()[:3] == ["3", "CONV_2D", "CPU"] and "depends on HARD_SWISH at index 2" in after
    assert "More than one subgraph is not supported" in after

    assert main(["inspect", str(path), "--json"]) == EXIT_CPU_OPS
    report = json.loads(capsys.readouterr().out)
    assert report["file"] == str(path) and report["mapped"] == 2 and report["first_unsupported"]["index"] == 2
    assert report["ops"][3]["status"] == "More than one subgraph is not supported"


def test_a_verdict_no_compiler_output_confirms_is_marked_unsure(tmp_path, capsys):
    """A transpose of 82,944 values: between the largest the compiler's output shows mapped and the smallest refused."""
    g = GraphBuilder()
    x, y = g.activation("x", [1, 24, 24, 144]), g.activation("y", [1, 144, 24, 24])
    g.op("TRANSPOSE", [x, g.constant("perm", [0, 3, 1, 2])], [y])
    path = tmp_path / "between.tflite"
    path.write_bytes(g.build([x], [y]))
    assert main(["inspect", str(path)]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[:4] == ["0", "TRANSPOSE", "Edge", "TPU"] and "unsure: the TRANSPOSE of" in lines[2]
    assert "82,944" in lines[2] and "predicted to map" in lines[2]
    assert lines[-2].startswith("unsure: 1 op placed on the Edge TPU on a verdict no compiler log")
    assert lines[-1] == "all 1 ops would run on the Edge TPU"
    assert main(["inspect", str(path), "--json"]) == EXIT_OK
    assert [op["index"] for op in json.loads(capsys.readouterr().out)["unsure"]] == [0]


def test_a_compiled_model(tmp_path, capsys):
    path = tmp_path / "m_edgetpu.tflite"
    path.write_bytes(compiled_model_bytes())
    assert main(["inspect", str(path)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "1 operators, compiled for the Edge TPU" in out and "edgetpu-custom-op" in out


def test_what_is_not_a_model(tmp_path, capsys):
    path = tmp_path / "photo.tflite"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    assert main(["inspect", str(path)]) == EXIT_FAILED
    assert "not a TFLite model" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "absent.tflite")]) == EXIT_FAILED
    with pytest.raises(SystemExit) as usage:
        main(["inspect"])
    assert usage.value.code == 2


@pytest.mark.slow
def test_a_real_converted_model_with_a_transpose_in_the_middle(tmp_path, capsys):
    """Keras Permute between two convolutions: TFLite keeps an int8 TRANSPOSE, outside Coral's table, which
    edgetpu_compiler 16 maps at this size (2,048 values)."""
    from converter.quantize import export_keras, import_tensorflow, quantize

    import_tensorflow()
    import keras
    import numpy as np
    from keras import layers

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3), batch_size=1)
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    x = layers.Permute((2, 1, 3))(x)
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, layers.Dense(4)(x))
    rng = np.random.default_rng(0)
    tflite = quantize(export_keras(model, tmp_path), lambda: (rng.random((1, 16, 16, 3), np.float32) for _ in range(8)))
    path = tmp_path / "permute_int8.tflite"
    path.write_bytes(tflite)

    assert main(["inspect", str(path)]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("all ") and lines[-1].endswith(" ops would run on the Edge TPU")
    transpose = next(line for line in lines if " TRANSPOSE " in line)
    assert transpose.split()[2:4] == ["Edge", "TPU"] and "unsure" not in transpose
