"""The committed default model: faithful port, Edge TPU clean graph, int8 close to float, reproducible."""

import hashlib
from pathlib import Path

import numpy as np
import pytest

from app.imaging import prepare
from app.model_dir.reading import read_model_dir
from converter import agreement
from converter import efficientnet_lite0 as recipe
from converter.scoring import int8_scorer
from converter.photos import imagenet_subject_photos, sample_photos
from tests.conftest import MODELS

pytestmark = pytest.mark.slow
MODEL = MODELS / recipe.NAME
# A rebuild on another kind of CPU than the committed build's may round calibration otherwise: its int8-vs-float
# agreement on the photos may fall this far below the committed figures (2 of 45 ImageNet-subject photos).
AGREEMENT_TOLERANCE = 0.045

# Coral's table of operations the Edge TPU runs (FACTS.md); QUANTIZE in and out is the usual frame.
EDGETPU_OPS = {"ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "LOGISTIC", "TANH", "RELU", "RELU6", "RELU_N1_TO_1",
               "QUANTIZE", "EXPAND_DIMS", "L2_NORMALIZATION", "SLICE", "SPACE_TO_DEPTH", "AVERAGE_POOL_2D",
               "MAX_POOL_2D", "CONV_2D", "DEPTHWISE_CONV_2D", "CONCATENATION", "FULLY_CONNECTED", "MEAN", "PAD",
               "PACK", "SPLIT", "SUM", "REDUCE_MAX", "REDUCE_MIN", "PRELU", "RESHAPE", "RESIZE_BILINEAR",
               "RESIZE_NEAREST_NEIGHBOR", "SOFTMAX", "STRIDED_SLICE"}


@pytest.fixture(scope="module")
def model_dir():
    return read_model_dir(MODEL)


@pytest.fixture(scope="module")
def torch_model():
    return recipe.torch_model()


def test_keras_port_matches_the_pytorch_checkpoint(model_dir, torch_model, cat_png):
    from converter.quantize import import_tensorflow

    import_tensorflow()
    keras_model = recipe.build_keras(recipe.load_state_dict())
    pixels = prepare(cat_png.read_bytes(), model_dir.manifest.input, 10**8)
    keras_logits = keras_model(((pixels.astype(np.float32) - 127) / 128)[None]).numpy()[0]
    torch_logits = recipe.torch_logits(torch_model, pixels)
    assert np.abs(keras_logits - torch_logits).max() < 1e-3
    assert 281 <= int(np.argmax(torch_logits)) <= 285  # the checkpoint sees a cat


def test_int8_graph_is_edgetpu_clean(model_dir):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(model_dir.file("int8")))
    ops = [op["op_name"] for op in interpreter._get_ops_details()]
    assert set(ops) <= EDGETPU_OPS, set(ops) - EDGETPU_OPS
    assert ops.count("QUANTIZE") == 2 and "PAD" not in ops  # same padding folded into the convolutions
    for tensor in interpreter.get_tensor_details():
        assert np.dtype(tensor["dtype"]) in (np.int8, np.uint8, np.int32), tensor["name"]
        assert -1 not in tensor["shape_signature"], tensor["name"]
    inp = interpreter.get_input_details()[0]
    assert inp["dtype"] == np.uint8 and tuple(inp["shape"]) == (1, 224, 224, 3)
    # real = (pixel - 127) / 128 and q = real * 128 + 127: the uint8 input tensor is the pixels
    assert inp["quantization"] == (1 / 128, 127)


def test_int8_agrees_with_the_float_checkpoint_on_real_photos(model_dir, torch_model):
    spec = model_dir.manifest.input
    int8_scores = int8_scorer(model_dir.file("int8"), spec)
    float_scores = lambda px: recipe.torch_logits(torch_model, px)  # noqa: E731

    subjects = agreement.compare(agreement.evaluation_inputs(imagenet_subject_photos(), spec), float_scores, int8_scores)
    assert subjects.inputs == 45
    assert subjects.top1_agreement >= 0.90, subjects.disagreements
    assert subjects.float_top1_in_int8_top5 >= 0.97

    everything = agreement.compare(agreement.evaluation_inputs(sample_photos(), spec), float_scores, int8_scores)
    assert everything.inputs == 90
    assert everything.float_top1_in_int8_top5 >= 0.95
    assert everything.top1_agreement >= 0.75  # includes textures where float top-1 is a near-uniform guess
    assert model_dir.manifest.quality.agreement["imagenet_subject_photos"].top1_agreement == subjects.top1_agreement


def test_build_command_reproduces_the_committed_file(tmp_path):
    """`python -m converter build efficientnet_lite0`: on the committed build's kind of CPU, the very bytes that are
    committed. On another kind, where calibration's float sums may round otherwise (an Intel Xeon gave other bytes
    than the AMD EPYC that made them), two rebuilds are the same bytes as each other, with the same operators, and
    the int8 model agrees with the float checkpoint as the committed one does, within AGREEMENT_TOLERANCE. Slow
    (about 25 s a rebuild): TensorFlow builds the Keras port, calibrates it on 200 photo crops and converts it."""
    from converter.builds import build_efficientnet_lite0
    from converter.writing import cpu_kind, same_cpu_kind

    target = build_efficientnet_lite0(tmp_path / "first")
    rebuilt, committed = read_model_dir(target).manifest, read_model_dir(MODEL).manifest
    assert (target / "labels.txt").read_bytes() == (MODEL / "labels.txt").read_bytes()
    assert rebuilt.build.cpu == cpu_kind() and rebuilt.input == committed.input
    assert rebuilt.quantization.operators == committed.quantization.operators
    if same_cpu_kind(rebuilt.build.cpu, committed.build.cpu):
        assert rebuilt.files["int8"].sha256 == committed.files["int8"].sha256
        assert rebuilt.quality == committed.quality
        return
    again = read_model_dir(build_efficientnet_lite0(tmp_path / "second")).manifest
    assert again.files["int8"].sha256 == rebuilt.files["int8"].sha256 and again.quality == rebuilt.quality
    for photos in ("imagenet_subject_photos", "all_photos"):
        now, then = rebuilt.quality.agreement[photos], committed.quality.agreement[photos]
        for figure in ("top1_agreement", "float_top1_in_int8_top5"):
            assert getattr(now, figure) >= getattr(then, figure) - AGREEMENT_TOLERANCE, (photos, figure, now, then)


def test_the_generic_pytorch_route_matches_the_hand_port(model_dir, torch_model):
    """The checkpoint through converter/torch_route.py (no Keras port), calibrated exactly as the recipe does:
    the hand-port's operators (less its uint8<->int8 QUANTIZE frame: this route's I/O is int8 itself) and its
    int8-vs-float agreement on the ImageNet-subject photos within 2 points. Slow (about 25 s): torch.export,
    litert-torch and ai-edge-quantizer convert and calibrate the 4.7M-parameter network, then both run every photo."""
    from converter import calibration, torch_route
    from converter.builds import CALIBRATION_MIN_AREA, CALIBRATION_SAMPLES, augmented_crops, photo_quality
    from converter.quantize import describe

    spec = model_dir.manifest.input
    module = torch_route.prepare(torch_model, recipe.IMAGE_SIZE, recipe.IMAGE_SIZE, 3)
    crops = augmented_crops(sample_photos(), spec, CALIBRATION_SAMPLES, 0, CALIBRATION_MIN_AREA)
    tflite = torch_route.to_int8(module, recipe.IMAGE_SIZE, recipe.IMAGE_SIZE, 3,
                                 (calibration.normalise(px, spec) for px in crops))
    generic = describe(tflite)["operators"]
    hand_port = dict(model_dir.manifest.quantization.operators)
    assert hand_port.pop("QUANTIZE") == 2
    assert generic == hand_port  # same operators, same counts: no PAD, no TRANSPOSE

    _, subjects, _ = photo_quality(sample_photos(), spec, tflite, lambda px: recipe.torch_logits(torch_model, px))
    committed = model_dir.manifest.quality.agreement["imagenet_subject_photos"].top1_agreement
    assert abs(subjects.top1_agreement - committed) <= 0.02 + 1e-9, (subjects.top1_agreement, committed)
