"""The image work of a letterboxed 640x640 int8 input, by Coral's convention and by Ultralytics' (app/imaging): decode,
letterbox, quantize, as an image thread does it (app/core/images.py), on one thread.

Coral's convention decodes a JPEG at 1/2, 1/4 or 1/8 in the DCT where the model needs fewer pixels; Ultralytics'
decodes it whole, as its tools resize a full decode, up to MAX_DECODED_PIXELS (24 MP by default). The photos are
scikit-learn's china.jpg scaled to a camera's frame sizes (720p, 1080p, 1440p, a 12 MP phone photo), JPEG quality
90, 4:2:0. Rounds alternate the conventions so a shared machine's drift hits both alike.

Prints per size the median ms of each convention, and Ultralytics' ratio to Coral's.

Example usage:
    python bench/letterbox_cost.py -n 30 --rounds 3
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: one core, as an image thread
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import io  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.imaging.decoding import decode_with_source  # noqa: E402
from app.imaging.geometry import to_pixels  # noqa: E402
from app.imaging.quantization import InputQuantizer  # noqa: E402
from app.model_dir.schema import Convention, InputSpec  # noqa: E402
from app.settings import default  # noqa: E402
from bench.common import default_photo, load_average  # noqa: E402
from bench.stats import median, ratio  # noqa: E402

SIDE = 640
SIZES = ((1280, 720), (1920, 1080), (2560, 1440), (4032, 3024))
ARTEFACT = (0.018658, -14)   # an Ultralytics export's int8 input
SPECS = {
    "coral": InputSpec(width=SIDE, height=SIDE, resize="letterbox", mean=[114.0], std=[1 / ARTEFACT[0]]),
    "ultralytics": InputSpec(width=SIDE, height=SIDE, resize="letterbox", mean=[0.0], std=[255.0],
                             convention=Convention(name="ultralytics", why="bench")),
}


def photo(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.open(default_photo()).convert("RGB").resize((width, height), Image.Resampling.BICUBIC).save(out, "JPEG",
                                                                                                   quality=90)
    return out.getvalue()


def work(data: bytes, spec: InputSpec, quantizer: InputQuantizer) -> np.ndarray:
    """An image thread's work: decode (with its limits), letterbox, quantize."""
    image, source = decode_with_source(data, spec, default("max_image_pixels"),
                                       max_decoded_pixels=default("max_decoded_pixels"))
    return quantizer(to_pixels(image, spec, (source.width, source.height)))


def timed(function, n: int) -> list[float]:
    function()  # warm: Pillow's first resize of a size, the decoder's tables
    times = []
    for _ in range(n):
        start = time.perf_counter()
        function()
        times.append((time.perf_counter() - start) * 1000)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=30, help="timed runs per size, convention and round (default 30)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--sizes", nargs="+", default=[f"{w}x{h}" for w, h in SIZES], metavar="WxH",
                        help="the photos' sizes (default: " + " ".join(f"{w}x{h}" for w, h in SIZES) + ")")
    args = parser.parse_args(argv)
    quantizers = {name: InputQuantizer(spec, np.int8, *ARTEFACT) for name, spec in SPECS.items()}
    print(f"load average {load_average()}; {SIDE}x{SIDE} int8 input, one thread, median ms of {args.n} x "
          f"{args.rounds} rounds")
    print(f"{'photo':>10}  {'coral':>8}  {'ultralytics':>11}  {'ratio':>6}")
    for size in args.sizes:
        width, height = (int(side) for side in size.split("x"))
        data = photo(width, height)
        samples: dict[str, list[float]] = {name: [] for name in SPECS}
        for _ in range(args.rounds):
            for name, spec in SPECS.items():
                samples[name] += timed(lambda: work(data, spec, quantizers[name]), args.n)  # noqa: B023
        coral, ultralytics = median(samples["coral"]), median(samples["ultralytics"])
        print(f"{width:>5}x{height:<4}  {coral:>8.2f}  {ultralytics:>11.2f}  {ratio(ultralytics, coral):>6.2f}")


if __name__ == "__main__":
    main()
