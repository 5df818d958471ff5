"""python -m converter quantize on small real Keras models, calibrated on real photos."""

import json
import shutil

import numpy as np
import pytest

from app.model_dir.reading import read_model_dir
from app.registry import Registry
from app.settings import Settings
from converter.__main__ import EXIT_FAILED, main
from converter.photos import sample_photos
from tests.conftest import DEFAULT_MODEL, MODELS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def keras_model_file(tmp_path_factory):
    from converter.quantize import import_tensorflow

    import_tensorflow()
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3), batch_size=1)
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(4)(x)
    model = keras.Model(inputs, outputs)
    path = tmp_path_factory.mktemp("keras") / "tiny.keras"
    model.save(path)
    return path


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    for p in sample_photos()[:6]:
        shutil.copy(p, folder / p.name)
    return folder


def quantize_args(model, calibration, out, labels, *extra):
    return ["quantize", str(model), "--calibration", str(calibration), "--name", "tiny", "--labels", str(labels),
            "--out", str(out), "--width", "32", "--height", "32", "--mean", "127.5", "--std", "127.5",
            "--source", "a test model", "--licence", "CC0-1.0", *extra]


@pytest.fixture
def labels(tmp_path):
    path = tmp_path / "labels.txt"
    path.write_text("north\neast\nsouth\nwest\n")
    return path


@pytest.mark.parametrize("io_type", ["uint8", "int8"])
def test_keras_file_to_a_servable_model_directory(keras_model_file, photo_folder, labels, tmp_path, io_type):
    out = tmp_path / "models"
    assert main(quantize_args(keras_model_file, photo_folder, out, labels, "--io-type", io_type)) == 0
    model_dir = read_model_dir(out / "tiny")
    manifest = json.loads((out / "tiny" / "model.json").read_text())
    assert manifest["quantization"]["input"]["dtype"] == io_type
    assert manifest["quantization"]["output"]["dtype"] == io_type
    assert set(manifest["quantization"]["operators"]) <= {"QUANTIZE", "CONV_2D", "MAX_POOL_2D", "MEAN", "FULLY_CONNECTED"}
    assert manifest["build"]["command"].startswith("python -m converter quantize")
    assert "6 samples" in manifest["build"]["calibration"]
    assert model_dir.labels == ("north", "east", "south", "west")

    registry = Registry(Settings(model_dir=out, workers=1))
    registry.configure()
    registry.load_all()
    pool = registry.get("tiny").pool("cpu")
    assert pool.members.inputs[0].dtype == np.dtype(io_type) and pool.members.outputs[0].shape == (1, 4)


def test_saved_model_directory(keras_model_file, photo_folder, labels, tmp_path):
    import keras

    from converter.quantize import export_keras

    saved = export_keras(keras.models.load_model(keras_model_file), tmp_path)
    assert main(quantize_args(saved, photo_folder, tmp_path / "m", labels)) == 0
    assert read_model_dir(tmp_path / "m" / "tiny").file("int8").stat().st_size > 0


def test_h5_file(keras_model_file, photo_folder, labels, tmp_path):
    import keras

    h5 = tmp_path / "tiny.h5"
    keras.models.load_model(keras_model_file).save(h5)
    assert main(quantize_args(h5, photo_folder, tmp_path / "m", labels)) == 0
    model_dir = read_model_dir(tmp_path / "m" / "tiny")
    assert model_dir.manifest.quantization.input.dtype == "uint8"
    assert model_dir.manifest.edgetpu_analysis == "all 7 ops would run on the Edge TPU"  # QUANTIZE, CONV, POOL, CONV, MEAN, FC, QUANTIZE


def test_float_tflite_is_explained_not_quantized(keras_model_file, photo_folder, labels, tmp_path, capsys):
    import keras
    import tensorflow as tf

    from converter.quantize import export_keras

    saved = export_keras(keras.models.load_model(keras_model_file), tmp_path)
    float_tflite = tmp_path / "model.tflite"
    float_tflite.write_bytes(tf.lite.TFLiteConverter.from_saved_model(str(saved)).convert())
    assert main(quantize_args(float_tflite, photo_folder, tmp_path / "m", labels)) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "is a float TFLite model" in err and "needs the float source model" in err
    assert not (tmp_path / "m").exists()

    int8 = MODELS / DEFAULT_MODEL / f"{DEFAULT_MODEL}_int8.tflite"
    assert main(quantize_args(int8, photo_folder, tmp_path / "m", labels)) == EXIT_FAILED
    assert "is already an integer TFLite model: there is nothing left to quantize" in capsys.readouterr().err


def test_calibration_from_an_array_file(keras_model_file, labels, tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
    np.save(tmp_path / "calib.npy", pixels)
    assert main(quantize_args(keras_model_file, tmp_path / "calib.npy", tmp_path / "m", labels)) == 0
    np.save(tmp_path / "wrong.npy", pixels[:, :16])
    assert main(quantize_args(keras_model_file, tmp_path / "wrong.npy", tmp_path / "n", labels)) == EXIT_FAILED


def test_bad_inputs_fail_cleanly_and_write_nothing(keras_model_file, photo_folder, tmp_path, capsys):
    wrong_labels = tmp_path / "labels.txt"
    wrong_labels.write_text("only\ntwo\n")
    out = tmp_path / "models"
    assert main(quantize_args(keras_model_file, photo_folder, out, wrong_labels)) == EXIT_FAILED
    assert "2 labels, the model has 4 outputs" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(quantize_args(keras_model_file, empty, out, wrong_labels)) == EXIT_FAILED
    assert "no images" in capsys.readouterr().err
    assert not out.exists() or list(out.iterdir()) == []
    with pytest.raises(SystemExit) as usage:
        main(["quantize", str(keras_model_file)])
    assert usage.value.code == 2
