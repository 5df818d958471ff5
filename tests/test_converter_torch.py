"""python -m converter quantize on PyTorch (.pt2) and ONNX models: the done-when check of the torch route.

A small CNN of a kind no other test uses (stem, inverted residual blocks with depthwise convolution,
BatchNorm and ReLU6, global average pool written as x.mean((2, 3)), a linear head; NCHW; per-channel
mean/std outside the model, as torchvision's Normalize) is trained here for a few seconds on real photo
crops (which photo does a random crop come from), exported to .pt2 and to .onnx, and quantized by the
command line. Both model directories must map every op to the Edge TPU, agree with the float model on
>= 95% of held-out crops, and classify over HTTP.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from app.model_dir.reading import read_model_dir
from app.model_dir.schema import InputSpec
from converter.__main__ import EXIT_FAILED, EXIT_OK, main
from converter.builds import augmented_crops
from converter.photos import sample_photos
from converter.scoring import int8_scorer
from tests.conftest import Service

pytestmark = pytest.mark.slow

SIZE = 32
PHOTOS = ("chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg", "china.jpg", "flower.jpg",
          "motorcycle_left.png", "hubble_deep_field.jpg", "retina.jpg", "grass.png")
TRAIN_CROPS, CALIBRATION_CROPS, HELD_OUT_CROPS = 2000, 100, 300
EPOCHS = 4
MIN_AGREEMENT = 0.95


def photos():
    by_name = {p.name: p for p in sample_photos()}
    return [by_name[n] for n in PHOTOS]


def crops(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """count random crops (10-100% of the area) and flips; the label is which photo, in PHOTOS order."""
    spec = InputSpec(width=SIZE, height=SIZE, mean=[0.0], std=[1.0], resize="stretch")
    pixels = np.stack(list(augmented_crops(photos(), spec, count, seed, 0.1)))
    return pixels, np.arange(count) % len(PHOTOS)


def small_cnn():
    import torch
    from torch import nn

    def conv_bn(cin, cout, k=3, stride=1, groups=1, act=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)

    class InvertedResidual(nn.Module):
        def __init__(self, channels, expand):
            super().__init__()
            hidden = channels * expand
            self.body = nn.Sequential(conv_bn(channels, hidden, 1), conv_bn(hidden, hidden, 3, groups=hidden),
                                      conv_bn(hidden, channels, 1, act=False))

        def forward(self, x):
            return x + self.body(x)

    class SmallNet(nn.Module):
        def __init__(self, classes):
            super().__init__()
            self.features = nn.Sequential(conv_bn(3, 16, stride=2), InvertedResidual(16, 2),
                                          conv_bn(16, 32, stride=2), InvertedResidual(32, 2),
                                          conv_bn(32, 32, 3, groups=32), conv_bn(32, 64, 1))
            self.head = nn.Linear(64, classes)

        def forward(self, x):
            return self.head(self.features(x).mean((2, 3)))

    torch.manual_seed(0)
    return SmallNet(len(PHOTOS))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model in eval mode, mean, std, work folder with model.pt2, model.onnx, calibration.npy, labels.txt)."""
    import torch

    # one thread: on 2 busy cores, torch's 2-thread training ran 13x slower than 1 thread (measured)
    torch.set_num_threads(1)
    x, y = crops(TRAIN_CROPS, seed=1)
    mean = x.reshape(-1, 3).mean(0)
    std = x.reshape(-1, 3).std(0)
    real = torch.from_numpy(((x - mean) / std).astype(np.float32).transpose(0, 3, 1, 2).copy())
    labels = torch.from_numpy(y)
    model = small_cnn()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(EPOCHS):
        for batch in torch.randperm(len(real), generator=generator).split(64):
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(model(real[batch]), labels[batch]).backward()
            optimiser.step()
    model.eval()

    work = tmp_path_factory.mktemp("torch_route")
    example = (torch.zeros(1, 3, SIZE, SIZE),)
    torch.export.save(torch.export.export(model, example), str(work / "model.pt2"))
    torch.onnx.export(model, example, str(work / "model.onnx"), dynamo=False, input_names=["image"],
                      output_names=["logits"], dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    np.save(work / "calibration.npy", crops(CALIBRATION_CROPS, seed=2)[0])
    (work / "labels.txt").write_text("\n".join(PHOTOS) + "\n")
    return model, mean, std, work


def quantize_args(trained, model_file, name, *extra):
    _, mean, std, work = trained
    return ["quantize", str(model_file), "--calibration", str(work / "calibration.npy"), "--name", name,
            "--labels", str(work / "labels.txt"), "--out", str(work / "models"), "--width", str(SIZE),
            "--height", str(SIZE), "--resize", "stretch", "--mean", *map(str, mean), "--std", *map(str, std),
            "--source", "trained by tests/test_converter_torch.py", "--licence", "CC0-1.0", *extra]


@pytest.fixture(scope="module")
def converted(trained):
    """Both routes, through the command line; (model, work, {route: exit code})."""
    model, _, _, work = trained
    codes = {route: main(quantize_args(trained, work / f"model.{route}", f"photos_{route}")) for route in ("pt2", "onnx")}
    return model, work, codes


@pytest.mark.parametrize("route", ["pt2", "onnx"])
def test_every_op_maps_and_int8_agrees_with_float(converted, route):
    import torch

    model, work, codes = converted
    assert codes[route] == EXIT_OK  # the command's own Edge TPU check: exit 3 if any op would fall to the CPU
    model_dir = read_model_dir(work / "models" / f"photos_{route}")
    manifest = model_dir.manifest
    assert manifest.edgetpu_analysis.startswith("all ") and "would run on the Edge TPU" in manifest.edgetpu_analysis
    assert set(manifest.quantization.operators) <= {"CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "MEAN", "FULLY_CONNECTED",
                                                    "PAD", "RESHAPE"}
    assert manifest.quantization.input.dtype == "int8" and manifest.quantization.input.shape == [1, SIZE, SIZE, 3]
    calibration = manifest.quality.agreement["calibration"]
    assert calibration.inputs == CALIBRATION_CROPS and calibration.max_logit_error is not None

    x, _ = crops(HELD_OUT_CROPS, seed=3)
    spec = manifest.input
    score = int8_scorer(model_dir.file("int8"), spec)
    real = ((x - np.asarray(spec.mean)) / np.asarray(spec.std)).astype(np.float32).transpose(0, 3, 1, 2)
    with torch.no_grad():
        float_top = model(torch.from_numpy(real.copy())).argmax(1).numpy()
    int8_top = np.array([np.argmax(score(p)) for p in x])
    assert np.mean(float_top == int8_top) >= MIN_AGREEMENT


def test_the_service_classifies_with_both(converted):
    _, work, codes = converted
    assert codes == {"pt2": EXIT_OK, "onnx": EXIT_OK}
    photo = next(p for p in photos() if p.name == "chelsea.png")
    service = Service({"EDGETPU_SERVE_MODEL_DIR": str(work / "models"), "EDGETPU_SERVE_DEFAULT_MODEL": "photos_pt2"})
    try:
        service.wait_ready()
        for route in ("pt2", "onnx"):
            r = httpx.post(f"{service.url}/v1/models/photos_{route}/classify", params={"top_k": 3},
                           content=photo.read_bytes(), headers={"content-type": "image/png"}, timeout=30)
            assert r.status_code == 200, r.text
            assert r.json()["predictions"][0]["label"] == "chelsea.png"
    finally:
        service.stop()


def test_a_state_dict_is_refused_with_the_fix(trained, tmp_path, capsys):
    import torch

    model, _, _, work = trained
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    assert main(quantize_args(trained, tmp_path / "weights.pt", "x")) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "state_dict" in err and "torch.export.save(torch.export.export(model.eval(), (example,)), 'model.pt2')" in err


def test_a_dynamic_batch_is_refused(trained, tmp_path, capsys):
    import torch

    model, _, _, work = trained
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(model, (torch.zeros(2, 3, SIZE, SIZE),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "dynamic.pt2"))
    assert main(quantize_args(trained, tmp_path / "dynamic.pt2", "x")) == EXIT_FAILED
    assert "dynamic input shape" in capsys.readouterr().err


def test_uint8_io_is_refused_on_this_route_with_the_reason(trained, capsys):
    _, _, _, work = trained
    assert main(quantize_args(trained, work / "model.pt2", "x", "--io-type", "uint8")) == EXIT_FAILED
    assert "int8 input and output" in capsys.readouterr().err
