"""One classification: bytes -> pixels -> tensor -> engine -> top-k, timed stage by stage."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from app.imaging import decode, to_pixels
from app.model_dir import ModelDir
from app.registry import LoadedModel


@dataclass(frozen=True)
class Prediction:
    index: int
    label: str
    score: float


@dataclass(frozen=True)
class Classification:
    model: str
    backend: str
    predictions: list[Prediction]
    timing_ms: dict[str, float]
    warmup: dict[str, float | None]
    cold: bool


def _decode_and_prepare(data: bytes, model: LoadedModel, backend: str, max_pixels: int):
    spec = model.model_dir.manifest.input
    start = time.perf_counter()
    image = decode(data, spec, max_pixels)
    decoded = time.perf_counter()
    tensor = model.quantizers[backend](to_pixels(image, spec))
    return tensor, (decoded - start) * 1000, (time.perf_counter() - decoded) * 1000


async def classify(model: LoadedModel, backend: str, data: bytes, top_k: int, threshold: float,
                   max_pixels: int) -> Classification:
    start = time.perf_counter()
    pool = model.pool(backend)
    tensor, decode_ms, preprocess_ms = await asyncio.to_thread(
        _decode_and_prepare, data, model, backend, max_pixels)
    result = await pool.run(tensor)
    post_start = time.perf_counter()
    output = pool.engine.output
    predictions = top_predictions(
        scores(result.output, output.scale, output.zero_point, model.model_dir),
        model.model_dir.labels, top_k, threshold)
    end = time.perf_counter()
    return Classification(
        model=model.name,
        backend=backend,
        predictions=predictions,
        timing_ms={
            "decode": decode_ms,
            "preprocess": preprocess_ms,
            "inference": result.inference_ms,
            "postprocess": (end - post_start) * 1000,
            "total": (end - start) * 1000,
        },
        warmup={"load_ms": pool.load_ms, "first_inference_ms": pool.first_inference_ms},
        cold=result.cold,
    )


def scores(output: np.ndarray, scale: float, zero_point: int, model_dir: ModelDir) -> np.ndarray:
    """Dequantize (real = scale * (q - zero_point)) and, for logits, softmax."""
    values = output.reshape(-1).astype(np.float64)
    if scale > 0:  # quantized output; a float output has scale 0
        values = (values - zero_point) * scale
    if model_dir.manifest.output.scores == "logits":
        values = np.exp(values - values.max())
        values /= values.sum()
    return values


def top_predictions(values: np.ndarray, labels: tuple[str, ...], top_k: int, threshold: float) -> list[Prediction]:
    """The k best scores at or above threshold; equal scores in class order."""
    order = np.argsort(-values, kind="stable")[:top_k]
    return [
        Prediction(int(i), labels[i] if i < len(labels) else str(int(i)), float(values[i]))
        for i in order
        if values[i] >= threshold
    ]
