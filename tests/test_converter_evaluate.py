"""python -m converter evaluate: the committed Fashion-MNIST figures, every dataset container, float vs int8."""

import json

import numpy as np
import pytest
from PIL import Image

from app.model_dir.reading import read_model_dir
from converter.__main__ import EXIT_FAILED, EXIT_OK, main
from converter.datasets import DatasetError, folder_name, load_idx_pair, load_labelled, read_idx
from converter.fashion_mnist import DATA_DIR, LABELS, TEST_IMAGES
from tests.conftest import MODELS

FASHION = MODELS / "fashion_mnist"
TEST_SET = DATA_DIR / TEST_IMAGES


@pytest.fixture(scope="module")
def test_images():
    return load_idx_pair(TEST_SET)


def run_json(capsys, *args) -> dict:
    assert main(["evaluate", *map(str, args), "--json"]) == EXIT_OK
    return json.loads(capsys.readouterr().out)


def recorded_evaluation(model_dir) -> dict:
    return read_model_dir(model_dir).manifest.quality.evaluation.model_dump(by_alias=True, exclude_none=True)


def test_the_committed_model_has_the_accuracy_its_model_json_claims(capsys):
    """All 10,000 test images through the committed int8 model, as the service feeds it."""
    recorded = recorded_evaluation(FASHION)
    measured = run_json(capsys, FASHION, "--data", TEST_SET, "--no-record")
    assert measured["samples"] == recorded["samples"] == 10_000
    assert measured["int8"] == recorded["int8"]  # exact counts, not approximately
    assert recorded["float"]["top1"] >= 0.88 and recorded["top1_drop_points"] <= 1.0
    assert recorded["int8"]["top1"] >= recorded["float"]["top1"] - 0.01


def test_class_folders_of_png_files_give_the_same_figures_as_the_arrays(test_images, tmp_path, capsys):
    images, labels = test_images
    data = tmp_path / "photos"
    for i in range(60):
        # half the folders named as labels, half as indices; PNG is lossless, so the pixels are the same
        folder = data / (folder_name(LABELS[labels[i]]) if labels[i] % 2 else str(labels[i]))
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[i]).save(folder / f"{i:05d}.png")
    np.savez(tmp_path / "first60.npz", x=images[:60], y=labels[:60])

    from_folders = run_json(capsys, FASHION, "--data", data, "--no-record")
    from_npz = run_json(capsys, FASHION, "--data", tmp_path / "first60.npz", "--no-record")
    from_idx = run_json(capsys, FASHION, "--data", TEST_SET, "--limit", 60, "--no-record")
    assert from_folders["int8"] == from_npz["int8"] == from_idx["int8"]
    assert from_folders["samples"] == 60 and from_folders["data"] == f"{data} (10 class folders)"


@pytest.mark.slow
def test_a_float_model_gives_agreement_and_drop_and_the_figures_are_recorded(keras_digits, tmp_path, capsys):
    keras_file, model_root, npz = keras_digits
    model_dir = model_root / "tiny_grey"
    figures = run_json(capsys, model_dir, "--data", npz, "--float", keras_file)

    # the same figures computed here without converter.evaluate: Keras on (pixel - 0) / 255, and the interpreter
    import keras
    from ai_edge_litert.interpreter import Interpreter

    with np.load(npz) as arrays:
        x, y = arrays["x"], arrays["y"]
    float_model = keras.models.load_model(keras_file)
    float_top = np.argmax(float_model.predict(x[..., None].astype(np.float32) / 255, batch_size=1, verbose=0), axis=1)
    interpreter = Interpreter(model_path=str(read_model_dir(model_dir).file("int8")))
    interpreter.allocate_tensors()
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    int8_top = []
    for image in x:
        interpreter.set_tensor(inp["index"], image[None, :, :, None])  # uint8 input: scale 1/255, zero point 0
        interpreter.invoke()
        int8_top.append(int(np.argmax(interpreter.get_tensor(out["index"])[0])))
    assert figures["float"]["top1_correct"] == int(np.sum(float_top == y))
    assert figures["int8"]["top1_correct"] == int(np.sum(np.array(int8_top) == y))
    assert figures["top1_agreements"] == int(np.sum(float_top == np.array(int8_top)))
    assert figures["top1_drop_points"] == round(100 * (figures["float"]["top1"] - figures["int8"]["top1"]), 2)

    recorded = recorded_evaluation(model_dir)
    assert recorded["int8"] == figures["int8"] and recorded["float_model"] == str(keras_file)

    # an int8-only run does not erase those float figures
    assert main(["evaluate", str(model_dir), "--data", str(npz), "--limit", "50"]) == EXIT_OK
    assert "not recorded" in capsys.readouterr().err
    assert recorded_evaluation(model_dir) == recorded


@pytest.mark.slow
def test_a_saved_model_and_an_h5_file_as_the_float_model(keras_digits, tmp_path, capsys):
    import keras

    from converter.quantize import export_keras

    keras_file, model_root, npz = keras_digits
    reference = run_json(capsys, model_root / "tiny_grey", "--data", npz, "--float", keras_file, "--no-record")
    model = keras.models.load_model(keras_file)
    saved = export_keras(model, tmp_path)
    h5 = tmp_path / "tiny.h5"
    model.save(h5)
    for float_model in (saved, h5):
        figures = run_json(capsys, model_root / "tiny_grey", "--data", npz, "--float", float_model, "--no-record")
        assert figures["float"] == reference["float"] and figures["top1_agreements"] == reference["top1_agreements"]


def test_bad_datasets_are_refused_with_what_was_expected(tmp_path, capsys):
    (tmp_path / "cats" / "tabby").mkdir(parents=True)
    assert main(["evaluate", str(FASHION), "--data", str(tmp_path / "cats")]) == EXIT_FAILED
    assert "class folders ['tabby'] are neither labels of the model nor label indices" in capsys.readouterr().err
    np.savez(tmp_path / "wrong.npz", pixels=np.zeros((2, 28, 28), np.uint8))
    assert main(["evaluate", str(FASHION), "--data", str(tmp_path / "wrong.npz")]) == EXIT_FAILED
    assert "expected arrays named one of" in capsys.readouterr().err
    (tmp_path / "t-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x01" + (10).to_bytes(4, "big") + b"\x00" * 8)
    with pytest.raises(DatasetError, match="bytes of data for dimensions"):
        read_idx(tmp_path / "t-images-idx3-ubyte")
    (tmp_path / "x-images-idx3-ubyte").write_bytes(b"\x1f\x8b\x08\x00")
    with pytest.raises(DatasetError, match="not an IDX file"):
        read_idx(tmp_path / "x-images-idx3-ubyte")
    with pytest.raises(DatasetError, match="does not exist"):
        load_labelled(tmp_path / "nothing", read_model_dir(FASHION).manifest.input, LABELS)


@pytest.fixture(scope="module")
def keras_digits(tmp_path_factory, test_images):
    """A small grey Keras model fitted briefly on 2,000 Fashion-MNIST images, quantized into a model directory."""
    from converter.quantize import import_tensorflow

    import_tensorflow()
    import keras
    from keras import layers

    root = tmp_path_factory.mktemp("digits")
    images, labels = test_images
    keras.utils.set_random_seed(0)
    inputs = keras.Input((28, 28, 1), batch_size=1)
    x = layers.Conv2D(8, 3, strides=2, activation="relu")(inputs)
    x = layers.Flatten()(x)
    model = keras.Model(inputs, layers.Dense(10)(x))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(images[:2000, :, :, None] / 255.0, labels[:2000], batch_size=1, epochs=1, verbose=0,
              steps_per_epoch=300)
    keras_file = root / "tiny.keras"
    model.save(keras_file)
    calibration = root / "calibration.npy"
    np.save(calibration, images[2000:2100])
    (root / "labels.txt").write_text("\n".join(LABELS) + "\n")
    assert main(["quantize", str(keras_file), "--calibration", str(calibration), "--name", "tiny_grey",
                 "--labels", str(root / "labels.txt"), "--out", str(root / "models"), "--width", "28",
                 "--height", "28", "--channels", "1", "--mean", "0", "--std", "255", "--resize", "stretch",
                 "--source", "test", "--licence", "MIT"]) == EXIT_OK
    npz = root / "eval.npz"
    np.savez(npz, x=images[3000:3200], y=labels[3000:3200])
    return keras_file, root / "models", npz
