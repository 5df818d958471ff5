"""The int8 model scored as the service scores it: the CPU runtime, the input tensor's own quantization.

Pixels go in through app.imaging's InputQuantizer with the model's input dtype, scale and
zero point (uint8 or int8 alike); the output is dequantized, `real = scale * (q - zero_point)`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.imaging.quantization import InputQuantizer
from app.model_dir.schema import InputSpec

# pixels (N, H, W, C) uint8 -> scores (N, classes)
BatchScorer = Callable[[np.ndarray], np.ndarray]


def int8_scorer(tflite_path: Path, spec: InputSpec) -> Callable[[np.ndarray], np.ndarray]:
    """uint8 HxWxC pixels -> dequantized int8 output, on the CPU runtime the service uses."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(tflite_path), num_threads=1)
    interpreter.allocate_tensors()
    inp = interpreter.get_input_details()[0]
    out = interpreter.get_output_details()[0]
    to_input = InputQuantizer(spec, inp["dtype"], *inp["quantization"])
    out_scale, out_zero = out["quantization"]

    def score(pixels: np.ndarray) -> np.ndarray:
        interpreter.set_tensor(inp["index"], to_input(pixels))
        interpreter.invoke()
        return (interpreter.get_tensor(out["index"])[0].astype(np.float32) - out_zero) * out_scale

    return score


def int8_batch_scorer(tflite_path: Path, spec: InputSpec) -> BatchScorer:
    """The int8 model, one invoke per sample (the model is batch 1)."""
    score = int8_scorer(tflite_path, spec)
    return lambda pixels: np.stack([score(p) for p in pixels])
