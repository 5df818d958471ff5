"""A TF1-style uint8 MobileNet v1, built here without the internet: the shape of Coral's
`mobilenet_v1_*_quant.tflite` (uint8 everywhere, 1001 classes with background first, SOFTMAX last).

Keras' MobileNet (width 0.25, 128x128, random weights, seed 0) with its BatchNormalization statistics
taken from real photos (so every ReLU6 activation uses its range), the logits layer's weights scaled
so that the classes are not all alike, frozen, then TensorFlow's TF1 converter with
`inference_type=uint8`, the input stats (127.5, 127.5) and `default_ranges_stats=(0, 6)`: the
"dummy quantization" of TF1's quantized exports, which is what fills each activation's range here.
Not a trained model: its classes mean nothing, its arithmetic is the real one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

SIZE = 128
CLASSES = 1001
LOGIT_SCALE = 10.0  # random weights give near-equal logits; this spreads them as training would


def build_mobilenet_uint8(photos: list[Path]) -> bytes:
    from converter.quantize import import_tensorflow

    tf = import_tensorflow()
    import keras
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNet(input_shape=(SIZE, SIZE, 3), alpha=0.25, weights=None, classes=CLASSES)
    batch = np.stack([np.asarray(Image.open(p).convert("RGB").resize((SIZE, SIZE)), np.float32) / 127.5 - 1
                      for p in photos])
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0  # the next training-mode call sets the statistics to this batch's
    model(batch, training=True)
    logits = model.get_layer("conv_preds")
    kernel, bias = logits.get_weights()
    logits.set_weights([kernel * LOGIT_SCALE, bias])
    concrete = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([1, SIZE, SIZE, 3], tf.float32, name="input"))
    frozen = convert_variables_to_constants_v2(concrete)
    name_in, name_out = frozen.inputs[0].name.split(":")[0], frozen.outputs[0].name.split(":")[0]
    with tempfile.TemporaryDirectory() as tmp:
        tf.io.write_graph(frozen.graph.as_graph_def(), tmp, "mobilenet.pb", as_text=False)
        converter = tf.compat.v1.lite.TFLiteConverter.from_frozen_graph(
            str(Path(tmp) / "mobilenet.pb"), [name_in], [name_out], {name_in: [1, SIZE, SIZE, 3]})
        converter.inference_type = tf.uint8
        converter.quantized_input_stats = {name_in: (127.5, 127.5)}
        converter.default_ranges_stats = (0, 6)
        return converter.convert()
