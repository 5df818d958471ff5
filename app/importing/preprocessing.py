"""How an imported model's input is fed: whose preprocessing it follows (model.json `input.convention`) and its
normalization, from the model's own facts, never guessed from its input's quantization.

An 8-bit input's quantization records how the model was calibrated, not how pixels map in. For Coral's and
TensorFlow's models the two agree: their quantization encodes their normalization ((1/128, 128) is [-1, 1]), so the
pixels go in as they are. An export whose calibration range is an artefact (Ultralytics' (0.018658, -14), about
[-2.13, 2.63]) would be fed wrong that way. So, in order:

    --mean/--std, --resize, --convention           as given
    the file's TFLite metadata normalization       Coral's zoo, Model Maker, TFLite's metadata writers
    the model's maker, recognised                  Ultralytics: its metadata in the file (temp_meta.txt, 8.2-8.3;
      (app/importing/detectors.py Family.maker)    metadata.json, 8.4), or YOLOv5's layout [1, N, 5 + C] with
                                                   N = 3 x the grid cells, which carries none: pixels / 255, its
                                                   centred letterbox on grey 114 (app/model_dir/schema.py)
    nothing names it                               an 8-bit input takes the pixels as they are (its quantization), as
                                                   Coral's examples feed it; where its range is not one a pixel
                                                   normalization makes ([0, 1], [-1, 1], [0, 255]), one line says so
                                                   (on screen and in model.json); a float input needs --mean/--std

app/model_dir/reimport.py reads the same rule back from a model.json written before the convention was recorded: the
service warns at load about a model imported with a normalization this rule would not choose.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.edgetpu.compat import EIGHT_BIT
from app.importing.metadata import Metadata
from app.model_dir.schema import CORAL, ULTRALYTICS, ULTRALYTICS_MEAN, ULTRALYTICS_STD, Convention
from app.tflite_file import Tensor

# The ranges a pixel normalization makes of 0..255, and how close (in input steps) an 8-bit input's range must come.
PIXEL_RANGES = ((0.0, 1.0), (-1.0, 1.0), (0.0, 255.0))
RANGE_STEPS = 1.5
CORAL_WHY = ("Coral's and TensorFlow Lite's: nothing in the file names another (no maker's metadata, no family "
             "recognised): a letterbox at the top-left on black, the input quantized as TFLite's QUANTIZE rounds")


class NormalizationRefused(ValueError):
    """Nothing names the normalization of a float input; the message says which flags do."""


@dataclass(frozen=True)
class Maker:
    """A model's maker, recognised from the file (app/importing/detectors.py): whose convention, and why."""

    convention: str          # model_dir.schema CONVENTIONS
    why: str                 # what in the file says so

    @property
    def normalization(self) -> tuple[list[float], list[float]] | None:
        """The (mean, std) its maker's tools feed (None: the convention names none)."""
        return (list(ULTRALYTICS_MEAN), list(ULTRALYTICS_STD)) if self.convention == ULTRALYTICS else None


@dataclass(frozen=True)
class InputChoice:
    mean: list[float]
    std: list[float]
    origin: str                  # where the normalization came from, said and recorded
    caution: str | None = None   # one line where the choice rests on a range no pixel normalization makes


def identity_normalization(tensor: Tensor) -> tuple[float, float]:
    """mean/std under which the pixels themselves are the quantized input: q = pixel (uint8) or pixel - 128 (int8).

    The service computes q = round((pixel - mean) / std / scale) + zero_point; with std = 1/scale and
    mean = zero_point (+128 for int8) that is the pixel, shifted into the type's range."""
    scale, zero_point = float(tensor.quantization.scale[0]), int(tensor.quantization.zero_point[0])
    std = 1.0 / scale
    rounded = float(f"{std:.6g}")  # 255, not 254.99998 (the float32 scale of 1/255)
    pixel = np.arange(256, dtype=np.float64)
    if np.array_equal(np.floor(pixel / rounded / scale + 0.5), pixel):
        std = rounded
    return zero_point + (128 if tensor.type == "INT8" else 0), std


def input_range(tensor: Tensor) -> tuple[float, float]:
    """The real values an 8-bit input holds when the pixels 0..255 go in as they are: scale x (q - zero_point)."""
    scale, zero_point = float(tensor.quantization.scale[0]), int(tensor.quantization.zero_point[0])
    low = -128 if tensor.type == "INT8" else 0
    return scale * (low - zero_point), scale * (low + 255 - zero_point)


def pixel_range_caution(tensor: Tensor) -> str | None:
    """One line when an 8-bit input's range is not one a pixel normalization makes ([0, 1], [-1, 1], [0, 255], to
    within RANGE_STEPS of its steps): its pixels go in as they are, but nothing says that is how its maker feeds it."""
    low, high = input_range(tensor)
    scale = float(tensor.quantization.scale[0])
    if any(abs(low - a) <= RANGE_STEPS * scale and abs(high - b) <= RANGE_STEPS * scale for a, b in PIXEL_RANGES):
        return None
    q = tensor.quantization
    return (f"the input's quantization ({float(q.scale[0]):.6g}, {int(q.zero_point[0])}) spans [{low:.3g}, "
            f"{high:.3g}], not a range a pixel normalization makes ([0, 1], [-1, 1] or [0, 255]): a calibration "
            "artefact, or a normalization the file does not name; the pixels go in as they are; if the model's maker "
            "feeds them otherwise, import it again with --mean/--std (--mean 0 --std 255 for pixels / 255)")


def choose_input(tensor: Tensor, metadata: Metadata, mean: list[float] | None, std: list[float] | None, name: str,
                 maker: Maker | None = None) -> InputChoice:
    """The service's mean/std for this input: the flags, else the file's metadata, else its maker's, else the
    input's quantization (8-bit) or NormalizationRefused (float)."""
    channels = tensor.shape[3]
    if mean is not None or std is not None:
        return InputChoice(list(mean or [0.0]), list(std or [1.0]), "--mean/--std as given")
    info = metadata.inputs[0] if metadata.inputs else None
    meta = None
    if info is not None and info.mean and info.std:
        if len(info.mean) not in (1, channels) or len(info.std) not in (1, channels):
            raise NormalizationRefused(f"{name}'s metadata normalizes {len(info.mean)} channels, the input has "
                                       f"{channels}; give --mean and --std")
        meta = (list(info.mean), list(info.std))
    if meta is None and maker is not None and maker.normalization is not None:
        given_mean, given_std = maker.normalization
        return InputChoice(given_mean, given_std, f"its maker's: {maker.why}, whose tools feed the pixels / 255 "
                                                  "(mean 0, std 255), then quantize them with the input's own scale "
                                                  "and zero point")
    if tensor.type in EIGHT_BIT:
        identity = identity_normalization(tensor)
        if meta is None:
            return InputChoice([identity[0]], [identity[1]],
                               f"the input's quantization (no normalization in the file): the {tensor.type.lower()} "
                               "input takes the pixels as they are, as Coral's examples feed it; give --mean/--std if "
                               "the model was trained otherwise", pixel_range_caution(tensor))
        apart = _steps_apart(tensor, *meta)
        if apart <= 1.0:
            return InputChoice([identity[0]], [identity[1]],
                               f"the file's metadata normalization (mean {_fmt(meta[0])}, std {_fmt(meta[1])}) is the "
                               f"input's quantization to within {apart:.2f} step: the pixels go in as they are, as "
                               "Coral's examples and TFLite's Task Library feed a quantized input")
        return InputChoice(meta[0], meta[1], f"the file's metadata normalization (mean {_fmt(meta[0])}, std "
                                             f"{_fmt(meta[1])}), quantized with the input's own scale and zero point")
    if meta is None:
        raise NormalizationRefused(
            f"{name}'s input {tensor.name!r} is float32 (quantized inside the model) and the file has no normalization "
            "metadata, so it does not say which values the network expects for pixels 0-255. Give --mean and --std: "
            "real = (pixel - mean) / std, e.g. --mean 127.5 --std 127.5 for [-1, 1], --mean 0 --std 255 for [0, 1]")
    return InputChoice(meta[0], meta[1], f"the file's metadata normalization (mean {_fmt(meta[0])}, std {_fmt(meta[1])})")


def maker_of(recognised: Maker | None, given: str | None) -> Maker | None:
    """The maker whose convention the model follows: --convention as given, else the one recognised in the file."""
    if given is not None:
        return Maker(given, f"--convention {given} as given")
    return recognised


def convention(maker: Maker | None) -> Convention:
    """model.json's `input.convention`: the maker's, else Coral's and TensorFlow's."""
    if maker is None:
        return Convention(name=CORAL, why=CORAL_WHY)
    return Convention(name=maker.convention, why=maker.why)


def _steps_apart(tensor: Tensor, mean: list[float], std: list[float]) -> float:
    """The largest difference, in input steps, between the metadata's normalization and the identity, over 0..255."""
    scale = float(tensor.quantization.scale[0])
    identity_mean, _ = identity_normalization(tensor)
    pixel = np.arange(256, dtype=np.float64)[:, None]
    real = (pixel - np.asarray(mean)) / np.asarray(std)
    return float(np.max(np.abs(real / scale - (pixel - identity_mean))))


def _fmt(values: list[float]) -> str:
    return " ".join(f"{v:g}" for v in values)
