"""The PyTorch route: a small torch CNN ported to Keras layer by layer, equal in float, Edge TPU clean in int8."""

import numpy as np
import pytest

from app.edgetpu.compat import analyze
from app.tflite_file import read_tflite
from converter import torch_port

pytestmark = pytest.mark.slow


def torch_cnn():
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU6(),
        nn.Conv2d(8, 16, 1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 10),
    )
    with torch.no_grad():  # running statistics that are not the identity, as a trained model has
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    return model.eval()


def keras_twin(state: dict):
    import keras
    from keras import layers

    inputs = keras.Input((16, 16, 3), batch_size=1)
    conv1 = layers.Conv2D(8, 3, padding="same", use_bias=False)
    norm = layers.BatchNormalization(epsilon=1e-5)
    x = layers.MaxPooling2D()(layers.ReLU()(norm(conv1(inputs))))
    depthwise = layers.DepthwiseConv2D(3, padding="same")
    x = layers.ReLU(6.0)(depthwise(x))
    pointwise = layers.Conv2D(16, 1, activation="relu")
    x = layers.MaxPooling2D()(pointwise(x))
    dense = layers.Dense(10)
    outputs = dense(layers.Flatten()(x))
    conv1.set_weights([torch_port.conv2d(state["0.weight"])])
    norm.set_weights(torch_port.batch_norm(state, "1"))
    depthwise.set_weights([torch_port.depthwise_conv2d(state["4.weight"]), state["4.bias"]])
    pointwise.set_weights([torch_port.conv2d(state["6.weight"]), state["6.bias"]])
    dense.set_weights([torch_port.linear_after_flatten(state["10.weight"], 16, 4, 4), state["10.bias"]])
    return keras.Model(inputs, outputs)


def test_a_ported_torch_cnn_equals_the_original_and_maps_to_the_edgetpu(tmp_path):
    import torch

    from converter.quantize import export_keras, import_tensorflow, quantize

    import_tensorflow()
    original = torch_cnn()
    state = {k: v.numpy() for k, v in original.state_dict().items() if not k.endswith("num_batches_tracked")}
    twin = keras_twin(state)
    x = np.random.default_rng(1).uniform(-1, 1, (4, 16, 16, 3)).astype(np.float32)
    with torch.no_grad():
        expected = original(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
    got = np.concatenate([twin(x[i:i + 1]).numpy() for i in range(len(x))])
    assert np.abs(got - expected).max() < 1e-4

    rng = np.random.default_rng(2)
    tflite = quantize(export_keras(twin, tmp_path), lambda: (rng.uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32)
                                                           for _ in range(16)))
    report = analyze(read_tflite(tflite))
    assert report.all_mapped, report.summary()
    assert "TRANSPOSE" not in {v.opcode for v in report.ops} and "PAD" not in {v.opcode for v in report.ops}


def test_flatten_order_is_what_makes_the_first_linear_layer_right():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(2, 3, 4))  # (C, H, W) activations of one sample
    weight = rng.normal(size=(5, 24))
    torch_out = weight @ features.reshape(-1)  # torch: flatten (C, H, W)
    keras_out = features.transpose(1, 2, 0).reshape(-1) @ torch_port.linear_after_flatten(weight, 2, 3, 4)
    np.testing.assert_allclose(keras_out, torch_out)
    naive = features.transpose(1, 2, 0).reshape(-1) @ torch_port.linear(weight)
    assert not np.allclose(naive, torch_out)
