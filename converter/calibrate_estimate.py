"""Rebuild the Edge TPU estimate's calibration: Coral's Table 1 architectures -> features -> fitted hardware.

Two steps, each resumable:

  features  builds each buildable Table 1 architecture from tf.keras.applications with random
            weights (latency does not depend on weight values), quantizes it with the converter's
            own path (full int8, uint8 I/O, a few random calibration samples: the ranges do not
            matter, the structure does), and records its structural features
            (converter.estimate_features) in converter/data/estimate_features.json. One
            architecture per child process, so each model's memory is returned before the next.
  fit       fits the few hardware parameters of converter.estimate on those features against
            the published figures (converter/data/coral_table1.json), writes them to
            converter/data/edgetpu_estimate.json and prints the leave-one-out table.

Example usage:

    python -m converter.calibrate_estimate features              # every architecture not yet measured
    python -m converter.calibrate_estimate features --only VGG16 --force
    python -m converter.calibrate_estimate fit
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"
TABLE_FILE = DATA / "coral_table1.json"
FEATURES_FILE = DATA / "estimate_features.json"
CALIBRATION_SAMPLES = 2
CHILD_TIMEOUT_S = 3600


def table() -> dict:
    return json.loads(TABLE_FILE.read_text(encoding="utf-8"))


def buildable_rows() -> list[dict]:
    """Rows fitted on (`keras`) and rows built only to check the fit out of sample (`check`)."""
    return [row for row in table()["rows"] if row.get("keras") or row.get("check")]


def read_features() -> dict:
    return json.loads(FEATURES_FILE.read_text(encoding="utf-8")) if FEATURES_FILE.is_file() else {}


def dump_features(data: dict) -> str:
    """The features file as JSON with one operator per line (readable diffs, a tenth of the lines of indent=1)."""
    marker = "\"@OPS {}@\""
    entries = {}
    for key, entry in sorted(data.items()):
        entries[key] = {**entry, "features": {**entry["features"], "ops": marker.format(key)[1:-1]}}
    text = json.dumps(entries, indent=1)
    for key, entry in data.items():
        ops = ",\n".join("     " + json.dumps(op) for op in entry["features"]["ops"])
        text = text.replace(marker.format(key), "[\n" + ops + "\n    ]")
    return text + "\n"


def squeezenet_1_0(keras, input_tensor, classes: int = 1000):
    """SqueezeNet 1.0 as its paper lays it out (Iandola et al. 2016, table 1): keras.applications has none.

    Version 1.0 rather than 1.1: Table 1's CPU columns put Coral's SqueezeNet above MobileNet v1 (0.57 G MACs)
    in work (232 against 164 ms on the embedded CPU), as 1.0's 0.86 G MACs are and 1.1's 0.35 are not.
    """
    layers = keras.layers

    def fire(x, squeeze: int, expand: int):
        x = layers.Conv2D(squeeze, 1, activation="relu")(x)
        left = layers.Conv2D(expand, 1, activation="relu")(x)
        right = layers.Conv2D(expand, 3, padding="same", activation="relu")(x)
        return layers.Concatenate()([left, right])

    x = layers.Conv2D(96, 7, strides=2, activation="relu")(input_tensor)
    x = layers.MaxPooling2D(3, strides=2)(x)
    for squeeze, expand in ((16, 64), (16, 64), (32, 128)):
        x = fire(x, squeeze, expand)
    x = layers.MaxPooling2D(3, strides=2)(x)
    for squeeze, expand in ((32, 128), (48, 192), (48, 192), (64, 256)):
        x = fire(x, squeeze, expand)
    x = layers.MaxPooling2D(3, strides=2)(x)
    x = fire(x, 64, 256)
    x = layers.Conv2D(classes, 1, activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(input_tensor, layers.Softmax()(x))


# Table 1 architectures keras.applications lacks, written here from their papers
HAND_BUILT = {"SqueezeNet10": squeezenet_1_0}


def build_one(application: str, size: int) -> dict:
    """keras.applications.<application> (or HAND_BUILT) at size x size, random weights -> int8 TFLite -> features."""
    from converter.estimate_features import features
    from converter.quantize import export_keras, import_tensorflow, quantize
    from converter.writing import tool_versions
    from app.tflite_file import read_tflite

    import_tensorflow()
    import keras

    keras.utils.set_random_seed(0)
    started = time.perf_counter()
    # batch_size=1: a static batch, so Flatten (VGG) leaves no SHAPE/STRIDED_SLICE/PACK ops behind
    input_tensor = keras.Input((size, size, 3), batch_size=1)
    if application in HAND_BUILT:
        model = HAND_BUILT[application](keras, input_tensor)
    else:
        model = getattr(keras.applications, application)(weights=None, input_tensor=input_tensor, classes=1000)
    rng = np.random.default_rng(0)

    def representative():
        for _ in range(CALIBRATION_SAMPLES):
            yield rng.uniform(-1.0, 1.0, (1, size, size, 3)).astype(np.float32)

    with tempfile.TemporaryDirectory() as tmp:
        tflite = quantize(export_keras(model, Path(tmp)), representative, "uint8")
    seconds = time.perf_counter() - started
    measured = features(read_tflite(tflite))
    return {
        "keras_application": application, "input_size": size, "keras_parameters": int(model.count_params()),
        "int8_file_bytes": len(tflite), "convert_seconds": round(seconds, 1),
        "calibration": f"{CALIBRATION_SAMPLES} uniform random inputs in [-1, 1], weights random (keras default init)",
        "tools": tool_versions("tensorflow-cpu", "keras"),
        "summary": measured.summary(), "features": measured.to_dict(),
    }


def run_features(only: list[str] | None, force: bool) -> int:
    """Measure each buildable row in its own child process and merge it into FEATURES_FILE as soon as it is done."""
    failed = 0
    for row in buildable_rows():
        key = row.get("keras") or row["check"]
        if only and key not in only:
            continue
        if key in read_features() and not force:
            print(f"{key}: already measured (--force to redo)", flush=True)
            continue
        print(f"{key} at {row['input_size']}: building and quantizing...", flush=True)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "converter.calibrate_estimate", "_child", key,
                               str(row["input_size"])], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        if done.returncode != 0:
            failed += 1
            print(f"{key}: FAILED ({done.returncode})\n{done.stderr[-3000:]}", flush=True)
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        merged = read_features()
        merged[key] = result
        FEATURES_FILE.write_text(dump_features(merged), encoding="utf-8")
        print(f"{key}: {result['summary']['ops']} ops, {result['summary']['macs'] / 1e9:.2f} GMAC, "
              f"{result['summary']['param_bytes'] / 1e6:.1f} MB parameters, converted in {result['convert_seconds']} s "
              f"({time.perf_counter() - started:.0f} s with start-up)", flush=True)
    return 1 if failed else 0


def run_fit() -> int:
    from converter import estimate

    fitted = estimate.fit_calibration(table(), read_features())
    estimate.PARAMS_FILE.write_text(json.dumps(fitted, indent=1) + "\n", encoding="utf-8")
    print(estimate.calibration_report(fitted))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        print(json.dumps(build_one(argv[1], int(argv[2]))))
        return 0
    parser = argparse.ArgumentParser(prog="python -m converter.calibrate_estimate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    f = sub.add_parser("features", help="build, quantize and measure the Table 1 architectures")
    f.add_argument("--only", nargs="+", default=None, help="keras.applications names (default: every buildable row)")
    f.add_argument("--force", action="store_true", help="measure again even if already in the features file")
    sub.add_parser("fit", help="fit the hardware parameters and print the leave-one-out table")
    args = parser.parse_args(argv)
    return run_features(args.only, args.force) if args.step == "features" else run_fit()


if __name__ == "__main__":
    sys.exit(main())
