"""YOLO11's C2PSA attention as Ultralytics' TFLite exports carry it, for the emulator's tests.

Ultralytics' Attention (ultralytics/nn/modules/block.py), in the words of its forward pass: a 1x1 convolution
makes q, k and v for every head at once; viewed as [B, heads, 2 * key_dim + head_dim, N] (N = H * W cells) and
split; attn = softmax(q^T k * key_dim^-0.5) over the cells; out = v attn^T, viewed back as [B, C, H, W], plus a
3x3 depthwise "positional encoding" of v; then a 1x1 projection. PSABlock adds it to its input (and a small
feed-forward after it); C2PSA splits its 1x1 convolution's channels in two, runs the PSABlock on one half and
joins them with another 1x1 convolution. yolo11n has one, at stride 32: 2 heads, key_dim 32, head_dim 64.

Its exports go torch -> ONNX -> onnx2tf -> TFLiteConverter (full-integer, per-tensor). onnx2tf keeps TF's NHWC
layout and writes ONNX's NCHW reshapes as TRANSPOSE + RESHAPE; its MatMul is tf.matmul. What the converter
then emits for the two products depends on whether it unrolls the batched matmul (onnx2tf's
enable_batchmatmul_unfold, which Ultralytics' exports set or not by version):

- "batched": BATCH_MATMUL [1, heads, N, key_dim] x [1, heads, key_dim, N] with adj_x (q^T k), and v attn^T
  with adj_y, both operands computed, int8 with their own zero points (the softmax's: 1/256, -128);
- "per_head": unrolled, per head two rank-2 products. TF 2.21's converter writes q^T k as a BATCH_MATMUL with
  adj_x (it folds q's transpose in) and v attn^T as a FULLY_CONNECTED whose *filter* is the softmax, a tensor
  the graph computes, with no bias: the operator yolo11n's exports hold 4 of (older converters wrote q^T k
  as one too, its filter a TRANSPOSE of k), and that the emulator refused ("FULLY_CONNECTED: the filter must
  be a constant tensor") before it ran them.

onnx2tf is not installed here: the graphs are built with the TF operations it writes (tf.transpose,
tf.reshape, tf.split, tf.matmul, tf.nn.softmax) and converted by TF 2.21's TFLiteConverter as onnx2tf calls it
(full-integer, per-tensor: `_experimental_disable_per_channel`). tests/test_emulator_families.py checks the
operators and operand kinds each form really contains, and every tensor against BUILTIN_REF;
tests/test_emulator_yolo11.py serves a head with it on every backend.
"""

from __future__ import annotations

import numpy as np

FORMS = ("batched", "per_head")


def attention(x, heads: int, key_dim: int, head_dim: int, form: str, name: str, seed: int = 0,
              projection_gain: float = 1.0):
    """Ultralytics' Attention on an NHWC Keras tensor [1, H, W, heads * head_dim], in onnx2tf's operations.

    projection_gain scales the final 1x1 projection's random weights (a small gain keeps a residual near its
    input: the box-placing model's cells stay where they were)."""
    import tensorflow as tf
    from keras import layers

    if form not in FORMS:
        raise ValueError(f"form {form!r}; expected one of {FORMS}")
    _, height, width, channels = x.shape
    cells = height * width
    per_head = 2 * key_dim + head_dim
    rng = np.random.default_rng(seed)
    qkv_conv = layers.Conv2D(heads * per_head, 1, name=f"{name}_qkv")
    position = layers.DepthwiseConv2D(3, padding="same", name=f"{name}_pe")
    projection = layers.Conv2D(channels, 1, name=f"{name}_proj")
    qkv = qkv_conv(x)
    qkv_conv.set_weights([rng.normal(0, 1 / np.sqrt(channels), (1, 1, channels, heads * per_head)).astype(np.float32),
                          rng.normal(0, 0.1, heads * per_head).astype(np.float32)])
    scale = key_dim ** -0.5

    def products(t):
        grouped = tf.reshape(tf.transpose(t, [0, 3, 1, 2]), [1, heads, per_head, cells])  # NCHW, then view
        q, k, v = tf.split(grouped, [key_dim, key_dim, head_dim], axis=2)
        if form == "batched":
            weights = tf.nn.softmax(tf.matmul(tf.transpose(q, [0, 1, 3, 2]), k) * scale, axis=-1)
            out = tf.matmul(v, tf.transpose(weights, [0, 1, 3, 2]))
        else:  # unrolled: rank-2 products per head
            outs = []
            for h in range(heads):
                qh, kh, vh = q[0, h], k[0, h], v[0, h]
                weights = tf.nn.softmax(tf.matmul(tf.transpose(qh), kh) * scale, axis=-1)
                outs.append(tf.matmul(vh, weights, transpose_b=True))
            out = tf.stack(outs)[None]
        nhwc = [0, 2, 3, 1]
        return (tf.transpose(tf.reshape(out, [1, channels, height, width]), nhwc),
                tf.transpose(tf.reshape(v, [1, channels, height, width]), nhwc))

    out, values = layers.Lambda(products, name=f"{name}_products")(qkv)
    encoded = position(values)
    position.set_weights([rng.normal(0, 0.3, (3, 3, channels, 1)).astype(np.float32),
                          np.zeros(channels, np.float32)])
    projected = projection(layers.Add()([out, encoded]))
    projection.set_weights([(rng.normal(0, 1 / np.sqrt(channels), (1, 1, channels, channels))
                             * projection_gain).astype(np.float32), np.zeros(channels, np.float32)])
    return projected


def c2psa(x, channels: int, heads: int, key_dim: int, head_dim: int, form: str, name: str = "c2psa"):
    """C2PSA(c1, c2=c1, n=1): cv1 to 2c channels, split; PSABlock (x + attention, x + ffn) on the second half;
    cv2 of the two halves joined. SiLU as onnx2tf writes it (LOGISTIC * x). Random weights (seeded by Keras)."""
    from keras import layers

    def silu(t):
        return layers.Multiply()([t, layers.Activation("sigmoid")(t)])

    hidden = heads * head_dim
    split = silu(layers.Conv2D(2 * hidden, 1, name=f"{name}_cv1")(x))
    first, second = layers.Lambda(lambda t: (t[..., :hidden], t[..., hidden:]), name=f"{name}_split")(split)
    second = layers.Add()([second, attention(second, heads, key_dim, head_dim, form, f"{name}_attn")])
    feed = layers.Conv2D(hidden, 1, name=f"{name}_ffn2")(silu(layers.Conv2D(2 * hidden, 1, name=f"{name}_ffn1")(
        second)))
    second = layers.Add()([second, feed])
    return silu(layers.Conv2D(channels, 1, name=f"{name}_cv2")(layers.Concatenate()([first, second])))


def attention_cells(form: str):
    """A block for tests/yolo_models.py's heads (its `block` hook): the stride-16 cells [1, 4, 4, 3] embedded in 8
    channels, Ultralytics' attention over the 16 cells (2 heads, key_dim 2, head_dim 4), projected back to 3
    channels with a small gain and added to the cells: the squares still light their cells, and every
    operator of the attention runs on real values."""
    def block(cells, stride: int):
        if stride != 16:
            return cells
        from keras import layers

        embed = layers.Conv2D(8, 1, name=f"embed_{form}")
        features = embed(cells)
        rng = np.random.default_rng(11)
        embed.set_weights([rng.normal(0, 1.0, (1, 1, 3, 8)).astype(np.float32), np.zeros(8, np.float32)])
        attended = attention(features, heads=2, key_dim=2, head_dim=4, form=form, name=f"psa_{form}")
        back = layers.Conv2D(3, 1, name=f"back_{form}")
        residual = back(attended)
        back.set_weights([(rng.normal(0, 0.02, (1, 1, 8, 3))).astype(np.float32), np.zeros(3, np.float32)])
        return layers.Add()([cells, residual])

    block.__name__ = f"attention_cells_{form}"
    return block


# One block function per form, made once: tests/yolo_models.py caches its models by their arguments.
BLOCKS = {form: attention_cells(form) for form in FORMS}


def yolo11_like(form: str = "per_head") -> bytes:
    """tests/yolo_models.py's Ultralytics-layout head (its squares, its DFL decode, int8 I/O) with the attention
    inside, on the stride-16 cells: a YOLO11-like export whose boxes are known."""
    from tests import yolo_models

    return yolo_models.ultralytics_like(block=BLOCKS[form])


def c2psa_alone(form: str, size: int = 20, channels: int = 256, heads: int = 2, key_dim: int = 32,
                head_dim: int = 64) -> bytes:
    """yolo11n's C2PSA at its 640 size (20x20 cells, 256 channels) behind a 1x1 convolution of a 3-channel input,
    converted as onnx2tf converts Ultralytics' exports: what bench/emulator_bench.py --model times."""
    from tests import emulator_families

    tf, keras = emulator_families._tf()  # noqa: SLF001 (its seeded setup)
    from keras import layers

    image = keras.Input((size, size, 3), batch_size=1)
    block = c2psa(layers.Conv2D(channels, 1)(image), channels, heads, key_dim, head_dim, form)
    return emulator_families._onnx2tf_like(keras.Model(image, block), size)  # noqa: SLF001


if __name__ == "__main__":
    # python -m tests.emulator_yolo11 OUT.tflite [batched|per_head]
    import sys

    with open(sys.argv[1], "wb") as out:
        out.write(c2psa_alone(sys.argv[2] if len(sys.argv) > 2 else "batched"))
