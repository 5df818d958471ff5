"""python -m converter: trained float model -> full-integer TFLite model directory.

Example usage:

    # rebuild the committed default model (EfficientNet-Lite0, ImageNet) into models/
    python -m converter build efficientnet_lite0

    # quantize your own Keras model, calibrated on a folder of your images
    python -m converter quantize my_model.keras --calibration photos/ --name flowers \\
        --labels labels.txt --width 224 --height 224 --mean 127.5 --std 127.5 \\
        --source "my flowers classifier, trained 2026-11-01" --licence "CC-BY-4.0"

Exit codes: 0 done, 1 the conversion failed (message on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    from converter.builds import BUILDS

    parser = argparse.ArgumentParser(prog="python -m converter", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="rebuild a default model from its recipe",
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog="example: python -m converter build efficientnet_lite0 --out models")
    build.add_argument("name", choices=sorted(BUILDS), help="which default model")
    build.add_argument("--out", type=Path, default=Path("models"), help="models root (default: models)")
    build.add_argument("--seed", type=int, default=0, help="calibration sampling seed (default: 0)")
    build.add_argument("--timm-wheel", type=Path, default=None,
                       help="timm wheel holding the ImageNet class names (default: pip download it)")

    q = sub.add_parser("quantize", help="full-integer quantize a Keras or SavedModel model",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example: python -m converter quantize model.keras --calibration photos/ "
                              "--name flowers --labels labels.txt --width 224 --height 224 "
                              "--mean 127.5 --std 127.5 --source '...' --licence MIT")
    q.add_argument("model", type=Path, help=".keras or .h5 file, or a SavedModel directory")
    q.add_argument("--calibration", type=Path, required=True,
                   help="folder of images (recursive) or .npy/.npz of uint8 pixels (N, H, W, C)")
    q.add_argument("--samples", type=int, default=300, help="at most this many calibration samples (default 300)")
    q.add_argument("--name", required=True, help="model name: models/<name>/")
    q.add_argument("--labels", type=Path, required=True, help="text file, one class name per line")
    q.add_argument("--out", type=Path, default=Path("models"), help="models root (default: models)")
    q.add_argument("--width", type=int, required=True, help="model input width")
    q.add_argument("--height", type=int, required=True, help="model input height")
    q.add_argument("--channels", type=int, choices=(1, 3), default=3)
    q.add_argument("--mean", type=float, nargs="+", default=[0.0],
                   help="the float model sees (pixel - mean) / std; one value or one per channel")
    q.add_argument("--std", type=float, nargs="+", default=[1.0])
    q.add_argument("--resize", choices=("center_crop", "stretch"), default="center_crop")
    q.add_argument("--crop-fraction", type=float, default=0.875,
                   help="center_crop: fraction of the shorter side kept (default 0.875)")
    q.add_argument("--io-type", choices=("uint8", "int8"), default="uint8",
                   help="input/output tensor type (default uint8, as the Edge TPU examples)")
    q.add_argument("--scores", choices=("logits", "probabilities"), default="logits",
                   help="what the model outputs (logits get a softmax in the service)")
    q.add_argument("--source", required=True, help="where the model and its weights come from")
    q.add_argument("--licence", required=True, help="licence of the weights")
    q.add_argument("--description", default="")
    return parser


def run_quantize(args: argparse.Namespace, argv: list[str]) -> Path:
    from app.model_dir import InputSpec, int8_filename, write_model_dir
    from converter import calibration, quantize
    from converter.builds import tool_versions

    spec = InputSpec(width=args.width, height=args.height, channels=args.channels, resize=args.resize,
                     crop_fraction=args.crop_fraction, mean=args.mean, std=args.std)
    labels = args.labels.read_text(encoding="utf-8").splitlines()
    # read the calibration data first: a bad folder should fail before TensorFlow loads
    samples = list(calibration.pixels_from_source(args.calibration, spec, args.samples))
    if not samples:
        raise calibration.CalibrationError(f"no calibration samples in {args.calibration}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        saved_model = quantize.saved_model_from(args.model, Path(tmp))

        def representative():
            for pixels in calibration.with_progress(samples, len(samples)):
                yield calibration.normalise(pixels, spec)

        tflite = quantize.quantize(saved_model, representative, args.io_type)
    report = quantize.describe(tflite)
    outputs = report["output"]["shape"][-1]
    if len(labels) != outputs:
        raise quantize.QuantizeError(f"{args.labels} has {len(labels)} labels, the model has {outputs} outputs")
    manifest = {
        "name": args.name,
        "task": "classification",
        "description": args.description,
        "source": args.source,
        "licence": args.licence,
        "input": spec.model_dump(),
        "output": {"scores": args.scores},
        "quantization": report,
        "build": {
            "command": shlex.join(["python", "-m", "converter", *argv]),
            "calibration": f"{len(samples)} samples from {args.calibration}",
            "tools": tool_versions("tensorflow-cpu", "keras", "ai-edge-litert", "numpy", "pillow"),
            "convert_seconds": round(time.perf_counter() - started, 1),
        },
    }
    return write_model_dir(args.out, manifest, {
        "int8": (int8_filename(args.name), tflite),
        "labels": ("labels.txt", ("\n".join(labels) + "\n").encode()),
    })


def main(argv: list[str] | None = None) -> int:
    from converter.builds import BUILDS
    from converter.calibration import CalibrationError
    from converter.imagenet_labels import LabelsError
    from converter.photos import PhotosNotInstalled
    from converter.quantize import QuantizeError
    from app.errors import ServeError

    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            target = BUILDS[args.name](args.out, seed=args.seed, timm_wheel=args.timm_wheel)
        else:
            target = run_quantize(args, argv)
    except (QuantizeError, CalibrationError, LabelsError, PhotosNotInstalled, ServeError, OSError) as e:
        print(f"converter: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(target)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
