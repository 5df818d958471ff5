"""What quantization cost, measured: float and int8 accuracy on a labelled dataset, and their agreement.

Both models see the same pixels, prepared as the service prepares them (app.imaging for the
geometry, model.json's normalisation for the float model, the input tensor's own scale and zero
point for the int8 one: converter.scoring, the service's InputQuantizer). Reported:
top-1 and top-5 of each, the share of inputs where their top-1 agree, and the top-1 drop
(float minus int8, in accuracy points). Counts are kept exact, so a rebuild can be compared
figure for figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from app.model_dir.schema import InputSpec
from converter.calibration import normalise, with_progress
from converter.datasets import Labelled
from converter.scoring import BatchScorer, int8_batch_scorer  # noqa: F401 (re-exported)

TOP_K = 5
CHUNK = 256  # samples scored together (the float model takes them as one batch when it can)



class EvaluateError(Exception):
    pass


@dataclass(frozen=True)
class Accuracy:
    top1_correct: int
    top5_correct: int
    samples: int

    @property
    def top1(self) -> float:
        return self.top1_correct / self.samples

    @property
    def top5(self) -> float:
        return self.top5_correct / self.samples


@dataclass(frozen=True)
class Evaluation:
    data: str
    samples: int
    int8: Accuracy
    float: Accuracy | None = None
    top1_agreements: int | None = None

    @property
    def top1_agreement(self) -> float | None:
        return None if self.top1_agreements is None else self.top1_agreements / self.samples

    @property
    def top1_drop(self) -> float | None:
        """float top-1 minus int8 top-1 (positive: quantization lost accuracy)."""
        return None if self.float is None else self.float.top1 - self.int8.top1

    def as_dict(self) -> dict:
        data = {"data": self.data, "samples": self.samples,
                "int8": dict(asdict(self.int8), top1=round(self.int8.top1, 4), top5=round(self.int8.top5, 4))}
        if self.float is not None:
            data["float"] = dict(asdict(self.float), top1=round(self.float.top1, 4), top5=round(self.float.top5, 4))
            data["top1_agreements"] = self.top1_agreements
            data["top1_agreement"] = round(self.top1_agreement, 4)
            data["top1_drop_points"] = round(100 * self.top1_drop, 2)
        return data

    def lines(self) -> list[str]:
        """Human-readable figures, one per line."""
        out = [f"{self.data}: {self.samples} samples"]
        if self.float is not None:
            out.append(f"float: top-1 {self.float.top1:.2%}  top-5 {self.float.top5:.2%}")
        out.append(f"int8:  top-1 {self.int8.top1:.2%}  top-5 {self.int8.top5:.2%}")
        if self.float is not None:
            out.append(f"int8 vs float: top-1 agreement {self.top1_agreement:.2%}, "
                       f"top-1 drop {100 * self.top1_drop:+.2f} points")
        return out


def _chunks(samples: Iterable[tuple[np.ndarray, int]], size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    pixels, labels = [], []
    for p, label in samples:
        pixels.append(p)
        labels.append(label)
        if len(pixels) == size:
            yield np.stack(pixels), np.asarray(labels)
            pixels, labels = [], []
    if pixels:
        yield np.stack(pixels), np.asarray(labels)


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best per row; equal scores in class order (as the service ranks them)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def evaluate(data: Labelled, int8_scores: BatchScorer, float_scores: BatchScorer | None = None,
             progress: bool = True) -> Evaluation:
    """Score every sample with the int8 model (and the float one, if given)."""
    counts = {"int8": [0, 0], "float": [0, 0]}
    agreements = 0
    n = 0
    samples = with_progress(data.samples(), data.count, "evaluating") if progress else data.samples()
    for pixels, labels in _chunks(samples, CHUNK):
        q = _top(np.asarray(int8_scores(pixels)), TOP_K)
        counts["int8"][0] += int(np.sum(q[:, 0] == labels))
        counts["int8"][1] += int(np.sum(np.any(q == labels[:, None], axis=1)))
        if float_scores is not None:
            f = _top(np.asarray(float_scores(pixels)), TOP_K)
            if f.shape[0] != len(labels):
                raise EvaluateError(f"the float model gave {f.shape[0]} score rows for {len(labels)} inputs")
            counts["float"][0] += int(np.sum(f[:, 0] == labels))
            counts["float"][1] += int(np.sum(np.any(f == labels[:, None], axis=1)))
            agreements += int(np.sum(f[:, 0] == q[:, 0]))
        n += len(labels)
    if n == 0:
        raise EvaluateError(f"{data.description}: no samples")
    return Evaluation(
        data=data.description, samples=n, int8=Accuracy(*counts["int8"], n),
        float=None if float_scores is None else Accuracy(*counts["float"], n),
        top1_agreements=None if float_scores is None else agreements,
    )


def keras_batch_scorer(model, spec: InputSpec) -> BatchScorer:
    """A float Keras model on normalised pixels: real = (pixel - mean) / std, as model.json says."""
    def score(pixels: np.ndarray) -> np.ndarray:
        real = np.concatenate([normalise(p, spec) for p in pixels])
        batch = model.inputs[0].shape[0]
        if batch is None:
            return np.asarray(model(real, training=False))
        # a model built with a fixed batch size (batch 1 for the Edge TPU) takes its inputs that many at a time
        return np.concatenate([np.asarray(model(real[i:i + batch], training=False))
                               for i in range(0, len(real), batch)])
    return score


def saved_model_batch_scorer(path: Path, spec: InputSpec) -> BatchScorer:
    """A float SavedModel's serving signature, one input in, one output out."""
    from converter.quantize import import_tensorflow

    tf = import_tensorflow()
    loaded = tf.saved_model.load(str(path))
    try:
        signature = loaded.signatures["serving_default"]
    except KeyError:
        raise EvaluateError(f"{path} has no serving_default signature") from None
    (name, spec_in), = signature.structured_input_signature[1].items()
    batch = spec_in.shape[0]

    def call(real: np.ndarray) -> np.ndarray:
        outputs = signature(**{name: tf.constant(real)})
        if len(outputs) != 1:
            raise EvaluateError(f"{path}: expected one output, the signature has {sorted(outputs)}")
        return next(iter(outputs.values())).numpy()

    def score(pixels: np.ndarray) -> np.ndarray:
        real = np.concatenate([normalise(p, spec) for p in pixels])
        if batch is None:
            return call(real)
        return np.concatenate([call(real[i:i + batch]) for i in range(0, len(real), batch)])
    return score


def float_batch_scorer(path: Path, spec: InputSpec) -> BatchScorer:
    """The float source model: a Keras .keras/.h5 file or a SavedModel directory."""
    from converter.quantize import QuantizeError, import_tensorflow

    path = Path(path)
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise EvaluateError(f"{path} is a directory without saved_model.pb: not a SavedModel")
        return saved_model_batch_scorer(path, spec)
    if path.suffix in (".keras", ".h5"):
        try:
            import_tensorflow()
        except QuantizeError as e:
            raise EvaluateError(str(e)) from None
        import keras

        return keras_batch_scorer(keras.models.load_model(path, compile=False), spec)
    raise EvaluateError(f"{path}: the float model must be a .keras or .h5 file or a SavedModel directory")
