"""Calibrate the Edge TPU estimate: published measurements -> the architectures' features -> fitted hardware.

converter/estimate.py holds the hardware model and its cost; this module finds the values of its few
free parameters. Two steps, each resumable:

  features  builds each architecture of converter/estimate_architectures.py (keras.applications, or
            written from its paper) with random weights (latency does not depend on weight values),
            quantizes it with the converter's own path (full int8, uint8 I/O, a few random calibration
            samples: the ranges do not matter, the structure does), and records its structural features
            (converter.estimate_features) in converter/data/estimate_features.json. One architecture
            per child process, so each model's memory is returned before the next.
  fit       fits the hardware parameters on those features against every published figure in
            converter/data/edgetpu_measurements.json (each with its source, host and what was timed),
            with leave-one-architecture-out to state the error by link and by model size; writes
            converter/data/edgetpu_estimate.json and prints the tables.

Example usage:

    python -m converter.calibrate_estimate features              # every architecture not yet measured
    python -m converter.calibrate_estimate features --only VGG16 --force
    python -m converter.calibrate_estimate fit
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.detection_postprocess import POSTPROCESS_OP
from converter import estimate
from converter.estimate import CALIBRATED_LINKS, LINK_SHORT, PER_LINK, SHARED, SIZES, Arrays, Hardware
from converter.estimate_features import ModelFeatures

DATA = Path(__file__).resolve().parent / "data"
MEASUREMENTS_FILE = DATA / "edgetpu_measurements.json"
FEATURES_FILE = DATA / "estimate_features.json"
CALIBRATION_SAMPLES = 2
CHILD_TIMEOUT_S = 3600

# The fit minimises a robust (soft L1) loss of log(estimated / measured): a figure that no setting of the hardware
# explains (Inception-ResNet V2: see docs/estimate.md) bends the others less than under squares. The scale is where
# a residual stops counting quadratically: log(1.25), a 25% error.
ROBUST_LOSS = "soft_l1"
ROBUST_SCALE = math.log(1.25)
START = {"conv_efficiency": 0.3, "depthwise_efficiency": 0.3, "elements_per_s": 2e9, "op_overhead_s": 10e-6,
         "cpu_elements_per_ref_mac": 0.05, "invoke_s": 0.5e-3, "bytes_per_s": 30e6}


def measurements() -> dict:
    return json.loads(MEASUREMENTS_FILE.read_text(encoding="utf-8"))


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


def build_one(key: str) -> dict:
    """ARCHITECTURES[key] at its input size, random weights -> int8 TFLite (converter.quantize) -> features."""
    from app.tflite_file import read_tflite
    from converter.estimate_architectures import ARCHITECTURES
    from converter.estimate_features import features
    from converter.quantize import export_keras, import_tensorflow, quantize
    from converter.writing import tool_versions

    import_tensorflow()
    import keras

    architecture = ARCHITECTURES[key]
    size = architecture.input_size
    keras.utils.set_random_seed(0)
    started = time.perf_counter()
    # batch_size=1: a static batch, so Flatten (VGG) leaves no SHAPE/STRIDED_SLICE/PACK ops behind
    model = architecture.build(keras, keras.Input((size, size, 3), batch_size=1))
    rng = np.random.default_rng(0)

    def representative():
        for _ in range(CALIBRATION_SAMPLES):
            yield rng.uniform(-1.0, 1.0, (1, size, size, 3)).astype(np.float32)

    with tempfile.TemporaryDirectory() as tmp:
        tflite = quantize(export_keras(model, Path(tmp)), representative, "uint8")
    seconds = time.perf_counter() - started
    measured = features(read_tflite(tflite))
    if architecture.postprocess:
        measured = with_postprocess(measured, *architecture.postprocess)
    return {
        "architecture": architecture.description, "input_size": size, "keras_parameters": int(model.count_params()),
        "int8_file_bytes": len(tflite), "convert_seconds": round(seconds, 1),
        "calibration": f"{CALIBRATION_SAMPLES} uniform random inputs in [-1, 1], weights random (keras default init)",
        "tools": tool_versions("tensorflow-cpu", "keras"),
        "summary": measured.summary(), "features": measured.to_dict(),
    }


def with_postprocess(model, anchors: int, classes: int):
    """A detector's features with TFLite_Detection_PostProcess appended, as Coral's files end.

    Keras cannot write the custom op, so the built model stops at its box encodings [1, anchors, 4] and class
    scores [1, anchors, classes]; the op reads both on the CPU (everything the Edge TPU part made crosses back
    over the link) and writes boxes, classes, scores and a count for its detections.
    """
    from dataclasses import replace

    from converter.estimate_architectures import SSD_MAX_DETECTIONS
    from converter.estimate_features import ELEMENTWISE, OpFeatures

    detections = SSD_MAX_DETECTIONS
    op = OpFeatures(index=len(model.ops), opcode=POSTPROCESS_OP, kind=ELEMENTWISE, macs=0,
                    param_bytes=anchors * 4 * 4,  # the anchors, a float32 constant [anchors, 4]
                    out_elements=detections * 4 + detections * 2 + 1, on_tpu=False,
                    in_elements=anchors * (4 + classes))
    return replace(model, ops=(*model.ops, op), output_bytes=op.out_elements * 4,
                   tpu_output_bytes=model.output_bytes)


def run_features(only: list[str] | None, force: bool) -> int:
    """Measure each architecture in its own child process and merge it into FEATURES_FILE as soon as it is done."""
    from converter.estimate_architectures import ARCHITECTURES

    unknown = sorted(set(only or ()) - set(ARCHITECTURES))
    if unknown:
        print(f"unknown architectures {unknown}; known: {sorted(ARCHITECTURES)}", file=sys.stderr)
        return 2
    failed = 0
    for key in (only or ARCHITECTURES):
        if key in read_features() and not force:
            print(f"{key}: already measured (--force to redo)", flush=True)
            continue
        print(f"{key} at {ARCHITECTURES[key].input_size}: building and quantizing...", flush=True)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "converter.calibrate_estimate", "_child", key],
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
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


# ---- the fit ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One published figure with the features of the architecture that stands for its model."""

    architecture: str
    link: str
    ms: float
    size: str
    figure: dict


def calibration_points(data: dict, features: dict, fitted_only: bool = True) -> list[Point]:
    """The figures whose architecture is built; only those marked for the fit unless fitted_only is False."""
    points = []
    for figure in data["figures"]:
        key = figure.get("architecture")
        if key is None or key not in features or (fitted_only and not figure.get("fit", True)):
            continue
        model = ModelFeatures.from_dict(features[key]["features"])
        points.append(Point(key, figure["link"], float(figure["ms"]), estimate.size_class(model), figure))
    return points


class Evaluator:
    """Estimated ms for many figures under one parameter vector, each architecture's arrays built once."""

    def __init__(self, features: dict, architectures: set[str]):
        self.arrays = {key: Arrays.of(ModelFeatures.from_dict(features[key]["features"])) for key in architectures}

    def ms(self, points: list[Point], params: dict) -> np.ndarray:
        hw = Hardware.from_params(params)
        return np.array([estimate.invoke_seconds(self.arrays[p.architecture], hw, hw.links[p.link]) * 1e3
                         for p in points])


def _names() -> list[str]:
    return list(SHARED) + [f"{link}.{name}" for link in CALIBRATED_LINKS for name in PER_LINK[link]]


def _bound(name: str, side: dict) -> float:
    link, _, param = name.rpartition(".")
    if param == "bytes_per_s" and side is estimate.UPPER:
        return estimate.LINK_CEILING_BYTES_PER_S[link]
    return side[param]


def vector_to_params(x: np.ndarray) -> dict:
    params: dict = {}
    for name, value in zip(_names(), np.exp(x)):
        link, _, param = name.rpartition(".")
        (params.setdefault(link, {}) if link else params)[param] = float(value)
    return params


def params_to_vector(params: dict) -> np.ndarray:
    values = []
    for name in _names():
        link, _, param = name.rpartition(".")
        values.append(params[link][param] if link else params[param])
    return np.log(values)


def fit(points: list[Point], evaluator: Evaluator, start_params: dict | None = None) -> dict:
    """Robust least squares on log(estimated / measured) over the figures, in log space within physical bounds.

    start_params: where the search starts (the fit on every figure, for the leave-one-out fits); else START.
    """
    from scipy.optimize import least_squares

    names = _names()
    lower = np.log([_bound(n, estimate.LOWER) for n in names])
    upper = np.log([_bound(n, estimate.UPPER) for n in names])
    if start_params is None:
        start = np.log([START[n.rpartition(".")[2]] for n in names])
    else:
        start = params_to_vector(start_params)
    start = np.clip(start, lower + 1e-9, upper - 1e-9)
    measured = np.array([p.ms for p in points])

    def residuals(x):
        return np.log(evaluator.ms(points, vector_to_params(x)) / measured)

    result = least_squares(residuals, start, bounds=(lower, upper), loss=ROBUST_LOSS, f_scale=ROBUST_SCALE)
    return vector_to_params(result.x)


def leave_one_out(points: list[Point], evaluator: Evaluator, start_params: dict) -> list[dict]:
    """Every figure estimated by a fit on the figures of every other architecture (none of its own, on any
    link or from any source: its other figures would tell the fit its answer)."""
    rows = []
    for key in sorted({p.architecture for p in points}):
        held = [p for p in points if p.architecture == key]
        params = fit([p for p in points if p.architecture != key], evaluator, start_params)
        for p, ms in zip(held, evaluator.ms(held, params)):
            rows.append(row_of(p, float(ms)))
    return rows


def row_of(p: Point, estimated_ms: float) -> dict:
    f = p.figure
    return {"architecture": p.architecture, "model": f["model"], "source": f["source"], "host": f["host"],
            "link": p.link, "size": p.size, "measured_ms": p.ms, "estimated_ms": round(estimated_ms, 3)}


def error_stats(rows: list[dict]) -> dict | None:
    """Median absolute % error, the worst ratio (estimated/measured or its inverse) and the share within 25%."""
    if not rows:
        return None
    ratios = np.array([r["estimated_ms"] / r["measured_ms"] for r in rows])
    return {"median_abs_pct": round(float(np.median(np.abs(ratios - 1) * 100)), 1),
            "max_ratio": round(float(np.max(np.maximum(ratios, 1 / ratios))), 2),
            "within_25pct": round(float(np.mean(np.abs(np.log(ratios)) <= math.log(1.25))), 2),
            "figures": len(rows), "architectures": len({r["architecture"] for r in rows})}


def errors_by_link_and_size(rows: list[dict]) -> dict:
    return {
        "all": error_stats(rows),
        "by_link": {link: error_stats([r for r in rows if r["link"] == link]) for link in CALIBRATED_LINKS},
        "by_size": {size: error_stats([r for r in rows if r["size"] == size]) for size in SIZES},
        "by_link_and_size": {link: {size: error_stats([r for r in rows if r["link"] == link and r["size"] == size])
                                    for size in SIZES} for link in CALIBRATED_LINKS},
    }


def fit_calibration(data: dict, features: dict) -> dict:
    """The parameters fitted on every figure, the in-sample and leave-one-out tables and their errors."""
    points = calibration_points(data, features)
    checks = [p for p in calibration_points(data, features, fitted_only=False) if not p.figure.get("fit", True)]
    if len({p.architecture for p in points}) < 5:
        raise estimate.EstimateError(f"only {len(points)} calibration figures have built architectures: run "
                                     "`python -m converter.calibrate_estimate features` first")
    evaluator = Evaluator(features, {p.architecture for p in points + checks})
    params = fit(points, evaluator)
    in_sample = [row_of(p, ms) for p, ms in zip(points, evaluator.ms(points, params))]
    loo = leave_one_out(points, evaluator, params)
    return {
        "sources": sorted({p.figure["source"] for p in points}),
        "calibration_set": {"figures": len(points), "architectures": len({p.architecture for p in points}),
                            "measurements": MEASUREMENTS_FILE.name},
        "params": params,
        "constants": {"peak_macs_per_s": estimate.PEAK_MACS_PER_S, "array": estimate.ARRAY,
                      "sram_bytes": estimate.SRAM_BYTES, "sram_reserve_bytes": estimate.SRAM_RESERVE_BYTES,
                      "cpu_macs_per_s": estimate.CPU_MACS_PER_S, "cpu_ref_macs_per_s": estimate.CPU_REF_MACS_PER_S},
        "in_sample": in_sample,
        "in_sample_error": errors_by_link_and_size(in_sample),
        "leave_one_out": loo,
        "leave_one_out_error": errors_by_link_and_size(loo),
        "not_fitted": [row_of(p, ms) | {"why": p.figure["why"]}
                       for p, ms in zip(checks, evaluator.ms(checks, params))],
    }


def _stats_cell(stats: dict | None) -> str:
    return "-" if not stats else f"{stats['median_abs_pct']:g}% / {stats['max_ratio']:g}x ({stats['figures']})"


def error_table(errors: dict) -> list[str]:
    """Median absolute error / worst ratio (figures), by link (rows) and size (columns), as Markdown."""
    lines = ["| link | " + " | ".join(SIZES) + " | all sizes |", "|---|" + "---|" * (len(SIZES) + 1)]
    for link in CALIBRATED_LINKS:
        cells = [_stats_cell(errors["by_link_and_size"][link][size]) for size in SIZES]
        lines.append(f"| {LINK_SHORT[link]} | " + " | ".join(cells) + f" | {_stats_cell(errors['by_link'][link])} |")
    lines.append("| all links | " + " | ".join(_stats_cell(errors["by_size"][size]) for size in SIZES)
                 + f" | {_stats_cell(errors['all'])} |")
    return lines


def calibration_report(fitted: dict) -> str:
    """The leave-one-out figures per architecture and link, the error tables, then the fitted parameters."""
    lines = ["| architecture | size | link | measured ms | estimated ms (left out) | error |",
             "|---|---|---|---|---|---|"]
    by_key: dict = {}
    for row in fitted["leave_one_out"]:
        by_key.setdefault((row["architecture"], row["link"]), []).append(row)
    for (key, link), rows in sorted(by_key.items(), key=lambda kv: (kv[0][0], CALIBRATED_LINKS.index(kv[0][1]))):
        measured = ", ".join(f"{r['measured_ms']:g}" for r in rows)
        est = rows[0]["estimated_ms"]
        errors = ", ".join(f"{(est / r['measured_ms'] - 1) * 100:+.0f}%" for r in rows)
        lines.append(f"| {key} | {rows[0]['size']} | {LINK_SHORT[link]} | {measured} | {est:.2f} | {errors} |")
    lines += ["", "Leave-one-architecture-out error, median absolute error / worst ratio (figures):", ""]
    lines += error_table(fitted["leave_one_out_error"])
    if fitted.get("not_fitted"):
        lines += ["", "Not fitted (kept for the record), estimated by the fit on everything:", ""]
        for r in fitted["not_fitted"]:
            lines.append(f"- {r['model']} ({r['architecture']}, {r['source']}, {r['host']}): measured "
                         f"{r['measured_ms']:g} ms, estimated {r['estimated_ms']:.2f} "
                         f"({(r['estimated_ms'] / r['measured_ms'] - 1) * 100:+.0f}%): {r['why']}")
    p = fitted["params"]
    lines.append(f"\nfitted: conv efficiency {p['conv_efficiency']:.3f}, depthwise efficiency "
                 f"{p['depthwise_efficiency']:.3f}, element-wise {p['elements_per_s'] / 1e9:.2f} G elements/s, "
                 f"per-op overhead {p['op_overhead_s'] * 1e6:.1f} us, host element work "
                 f"{p['cpu_elements_per_ref_mac']:.3f} per reference MAC; " + "; ".join(
                     f"{link}: per invoke {p[link]['invoke_s'] * 1e3:.3f} ms, "
                     f"link {p[link]['bytes_per_s'] / 1e6:.1f} MB/s" for link in CALIBRATED_LINKS))
    return "\n".join(lines)


def dump_calibration(fitted: dict) -> str:
    """The calibration as JSON with one row per line in its per-figure tables (readable diffs)."""
    tables = ("in_sample", "leave_one_out", "not_fitted")
    text = json.dumps({k: (f"@ROWS {k}@" if k in tables else v) for k, v in fitted.items()}, indent=1)
    for key in tables:
        rows = ",\n".join("  " + json.dumps(row) for row in fitted[key])
        text = text.replace(json.dumps(f"@ROWS {key}@"), "[\n" + rows + "\n ]")
    return text + "\n"


def run_fit() -> int:
    fitted = fit_calibration(measurements(), read_features())
    estimate.PARAMS_FILE.write_text(dump_calibration(fitted), encoding="utf-8")
    print(calibration_report(fitted))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        print(json.dumps(build_one(argv[1])))
        return 0
    parser = argparse.ArgumentParser(prog="python -m converter.calibrate_estimate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    f = sub.add_parser("features", help="build, quantize and measure the calibration architectures")
    f.add_argument("--only", nargs="+", default=None,
                   help="keys of converter.estimate_architectures.ARCHITECTURES (default: every one)")
    f.add_argument("--force", action="store_true", help="measure again even if already in the features file")
    sub.add_parser("fit", help="fit the hardware parameters and print the leave-one-out tables")
    args = parser.parse_args(argv)
    return run_features(args.only, args.force) if args.step == "features" else run_fit()


if __name__ == "__main__":
    sys.exit(main())
