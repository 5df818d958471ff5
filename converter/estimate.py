"""How fast a model would run on a Coral Edge TPU, estimated from its structure: a model of the hardware.

Example usage:

    python -m converter estimate models/mobilenet_v2          # a model directory (its int8 model)
    python -m converter estimate my_model_int8.tflite --json

The Edge TPU is a 64 x 64 array of int8 multiply-accumulate units at 480 MHz: 4 TOPS counts two
operations per MAC, so the peak is 2 T MAC/s. It has 8 MiB of on-chip memory, which holds the
activations while the model runs and, in what is left, the parameters; the compiler caches
parameters first come, first served, in execution order, and the parameters that do not fit are
sent from the host over the link on every invoke. The host sends the input and reads the output
over the same link. Per invoke:

  t = invoke overhead(link)
    + (input + output bytes) / link bandwidth
    + sum over Edge TPU ops of [ max(compute, streamed parameter bytes / link bandwidth) + per-op overhead ]
    + the CPU ops (those after the Edge TPU partition ends), from their MACs at the host's measured rate

  compute, by operator kind:
    conv, depthwise   MACs / (2e12 * efficiency(kind) * fill(depth) * fill(channels))
                      fill(n) = n / (64 * ceil(n / 64)): how much of the 64-wide array the matrix uses
    fully connected   MACs / (2e12 / 64): batch 1 uses each weight once, so the array runs one column
    element-wise      output elements / element rate (adds, multiplies, pools, concatenations, pads)
    layout            nothing (reshapes, quantize: folded into addressing)

Fitted on Coral's published Table 1 (converter/data/coral_table1.json) over the architectures
tf.keras.applications can build (python -m converter.calibrate_estimate): the efficiencies of
conv and depthwise work, the element rate, the per-op overhead (shared), and per link (USB 3,
Dev Board) the per-invoke overhead and the bandwidth. Everything else is a physical constant
below. USB 2 and PCIe have no published rows: USB 2 is the USB 3 host with USB 2's bulk
bandwidth; PCIe is the Dev Board's Edge TPU, link and overhead (the same PCIe gen 2 x1 part)
with the desktop's CPU for CPU ops. Their error is not measured; the stated error is the leave-one-out
error of the calibrated links.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from converter.estimate_features import (
    CONV,
    DEPTHWISE,
    ELEMENTWISE,
    FULLY_CONNECTED,
    LAYOUT,
    ModelFeatures,
    features_of_file,
)

DATA = Path(__file__).resolve().parent / "data"
PARAMS_FILE = DATA / "edgetpu_estimate.json"

# ---- physical constants ---------------------------------------------------------------------------------------
ARRAY = 64                      # the MAC array is 64 x 64
PEAK_MACS_PER_S = 2e12          # 4 TOPS, 2 ops per MAC (64 * 64 * 480 MHz = 1.97e12)
SRAM_BYTES = 8 * 2**20          # on-chip memory for activations and cached parameters
# Besides activations, the compiler keeps back a little: a 76 KiB model compiled with "7.77 MiB remaining"
# after 85.75 KiB of parameters (google-coral/edgetpu#324): 8 MiB - 7.86 MiB.
SRAM_RESERVE_BYTES = 150 * 2**10
USB2_BYTES_PER_S = 38e6         # USB 2.0 high-speed bulk in practice (480 Mb/s signalling): 35-40 MB/s
# Host CPU int8 rates for the operators the Edge TPU does not run. Desktop: MobileNetV2 int8 on ai-edge-litert's
# XNNPACK, 1 thread, 4.6 ms for 300.8 M MACs on an x86-64 server core (FACTS.md). Dev Board: its Cortex-A53
# ran MobileNet v2 in 122 ms (Table 1, "embedded CPU").
DESKTOP_CPU_MACS_PER_S = 300.8e6 / 4.6e-3
DEVBOARD_CPU_MACS_PER_S = 300.8e6 / 122e-3
# Element-wise CPU work (adds, pools, concatenations) per MAC-time: assumed, not measured (1.3 G elements/s on
# the desktop); it matters only for models whose Edge TPU part ends early.
CPU_ELEMENTS_PER_S_PER_MAC_RATE = 0.02

LINKS = ("usb3", "usb2", "pcie", "devboard")
LINK_TITLES = {"usb3": "USB 3 (USB Accelerator on a desktop)",
               "usb2": "USB 2 (USB Accelerator on a USB 2 port)",
               "pcie": "PCIe (M.2 / Mini PCIe card in a desktop)",
               "devboard": "Dev Board (on-board PCIe, i.MX 8M host)"}
CALIBRATED_LINKS = ("usb3", "devboard")
TABLE_COLUMN = {"usb3": "usb3_ms", "devboard": "devboard_ms"}

# The fit minimises a robust (soft L1) loss of log(estimated / measured): a row that no setting of the hardware
# explains (see docs/estimate.md: Inception-ResNet V2) bends the others less than under squares. The scale is
# where a residual stops counting quadratically: log(1.25), a 25% error.
ROBUST_LOSS = "soft_l1"
ROBUST_SCALE = math.log(1.25)

# The fitted parameters, in the order the fit sees them (all positive; fitted in log space).
SHARED = ("conv_efficiency", "depthwise_efficiency", "elements_per_s", "op_overhead_s")
# Per calibrated link: the host's per-invoke overhead, the link's bandwidth, and (Dev Board) how much longer
# the same work keeps its Edge TPU busy than the USB Accelerator's (Table 1's USB figures are from the device
# at its maximum clock; a compute-bound DenseNet takes 25 ms on the Dev Board against 20 over USB).
PER_LINK = {"usb3": ("invoke_s", "bytes_per_s"), "devboard": ("invoke_s", "bytes_per_s", "busy_scale")}
START = {"conv_efficiency": 0.3, "depthwise_efficiency": 0.3, "elements_per_s": 2e9, "op_overhead_s": 10e-6,
         "invoke_s": 0.5e-3, "bytes_per_s": 400e6, "busy_scale": 1.0}
# Upper bounds are physical: an efficiency of at most 1, and at most 500 MB/s over either link: USB 3.0 signals
# 5 Gb/s with 8b/10b coding (4 Gb/s of payload), and PCIe gen 2 x1 likewise.
LINK_CEILING_BYTES_PER_S = 500e6
UPPER = {"conv_efficiency": 1.0, "depthwise_efficiency": 1.0, "elements_per_s": 1e12, "op_overhead_s": 1e-3,
         "invoke_s": 20e-3, "bytes_per_s": LINK_CEILING_BYTES_PER_S, "busy_scale": 4.0}
LOWER = {"conv_efficiency": 1e-3, "depthwise_efficiency": 1e-3, "elements_per_s": 1e7, "op_overhead_s": 1e-8,
         "invoke_s": 1e-6, "bytes_per_s": 1e7, "busy_scale": 0.25}


class EstimateError(Exception):
    pass


@dataclass(frozen=True)
class Link:
    invoke_s: float
    bytes_per_s: float
    cpu_macs_per_s: float
    busy_scale: float = 1.0  # Edge TPU busy time relative to the USB Accelerator's


@dataclass(frozen=True)
class Hardware:
    conv_efficiency: float
    depthwise_efficiency: float
    elements_per_s: float
    op_overhead_s: float
    links: dict[str, Link]

    @classmethod
    def from_params(cls, params: dict) -> Hardware:
        """The four links from the fitted values: USB 3 and Dev Board as fitted, USB 2 and PCIe derived.

        USB 2 is the USB Accelerator on a slower bus. PCIe (an M.2 or Mini PCIe card in a desktop) is the Dev
        Board's Edge TPU, link and per-invoke path (the same PCIe gen 2 x1 part and driver); the desktop's faster
        CPU can only shorten the host's share, so the Dev Board's overhead is its upper bound, and CPU ops run at
        the desktop's rate.
        """
        usb3, dev = params["usb3"], params["devboard"]
        links = {
            "usb3": Link(usb3["invoke_s"], usb3["bytes_per_s"], DESKTOP_CPU_MACS_PER_S),
            "usb2": Link(usb3["invoke_s"], USB2_BYTES_PER_S, DESKTOP_CPU_MACS_PER_S),
            "pcie": Link(dev["invoke_s"], dev["bytes_per_s"], DESKTOP_CPU_MACS_PER_S, dev["busy_scale"]),
            "devboard": Link(dev["invoke_s"], dev["bytes_per_s"], DEVBOARD_CPU_MACS_PER_S, dev["busy_scale"]),
        }
        return cls(**{k: params[k] for k in SHARED}, links=links)


# ---- the cost model --------------------------------------------------------------------------------------------

def fill(n: np.ndarray) -> np.ndarray:
    """The fraction of a 64-wide array side a dimension of n uses (the last tile is partly empty)."""
    n = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    return n / (ARRAY * np.ceil(n / ARRAY))


@dataclass(frozen=True)
class Placement:
    """Which parameter bytes the compiler would cache on chip, per op, first come first served."""

    cache_bytes: int
    on_chip: np.ndarray   # per op
    streamed: np.ndarray  # per op

    @property
    def on_chip_bytes(self) -> int:
        return int(self.on_chip.sum())

    @property
    def streamed_bytes(self) -> int:
        return int(self.streamed.sum())


def place_parameters(model: ModelFeatures) -> Placement:
    """Cache each Edge TPU op's parameters whole while they fit in what the activations leave of the 8 MiB."""
    cache_bytes = max(0, SRAM_BYTES - SRAM_RESERVE_BYTES - model.peak_activation_bytes)
    free = cache_bytes
    on_chip = np.zeros(len(model.ops))
    streamed = np.zeros(len(model.ops))
    for i, op in enumerate(model.ops):
        if not op.on_tpu or not op.param_bytes:
            continue
        if op.param_bytes <= free:
            on_chip[i] = op.param_bytes
            free -= op.param_bytes
        else:
            streamed[i] = op.param_bytes
    return Placement(cache_bytes=cache_bytes, on_chip=on_chip, streamed=streamed)


@dataclass(frozen=True)
class Arrays:
    """A model's features as per-op arrays of the terms the cost model scales, so a fit evaluates it cheaply.

    Compute seconds per op = conv / conv_efficiency + depthwise / depthwise_efficiency
                             + elements / elements_per_s + fc (each array is zero where it does not apply).
    """

    conv: np.ndarray       # seconds at efficiency 1
    depthwise: np.ndarray  # seconds at efficiency 1
    elements: np.ndarray   # element-wise ops' output elements
    fc: np.ndarray         # seconds (fixed: one array column per cycle)
    on_tpu: np.ndarray
    overhead: np.ndarray   # 1.0 where an Edge TPU op pays the per-op overhead (not layout ops)
    streamed: np.ndarray   # parameter bytes sent over the link every invoke
    all_macs: np.ndarray
    all_elements: np.ndarray
    input_bytes: float     # sent to the Edge TPU before its first op
    output_bytes: float    # read back: the output, or the Edge TPU part's last result when CPU ops follow
    cpu_macs: float
    cpu_elements: float

    @classmethod
    def of(cls, model: ModelFeatures) -> Arrays:
        kind = np.array([op.kind for op in model.ops])
        on_tpu = np.array([op.on_tpu for op in model.ops], dtype=bool)
        macs = np.array([op.macs for op in model.ops], dtype=np.float64)
        elements = np.array([op.out_elements for op in model.ops], dtype=np.float64)
        fills = fill([op.depth for op in model.ops]) * fill([op.channels for op in model.ops])
        at_peak = macs / (PEAK_MACS_PER_S * fills)
        tpu = lambda mask: np.where(mask & on_tpu, 1.0, 0.0)  # noqa: E731
        placement = place_parameters(model)
        tpu_ops = [op for op in model.ops if op.on_tpu]
        # when CPU ops follow, the Edge TPU part hands its last result to the CPU: that crosses the link instead
        output_bytes = tpu_ops[-1].out_elements if tpu_ops and not on_tpu.all() else model.output_bytes
        not_layout = kind != LAYOUT
        return cls(conv=at_peak * tpu(kind == CONV), depthwise=at_peak * tpu(kind == DEPTHWISE),
                   elements=elements * tpu(kind == ELEMENTWISE),
                   fc=macs / (PEAK_MACS_PER_S / ARRAY) * tpu(kind == FULLY_CONNECTED),
                   on_tpu=on_tpu, overhead=tpu(not_layout), streamed=placement.streamed,
                   all_macs=macs, all_elements=elements * not_layout, input_bytes=float(model.input_bytes),
                   output_bytes=float(output_bytes),
                   cpu_macs=float(macs[~on_tpu].sum()), cpu_elements=float(elements[~on_tpu & not_layout].sum()))


def op_compute_s(a: Arrays, hw: Hardware) -> np.ndarray:
    """Seconds of Edge TPU compute per op (0 for CPU ops), parameters assumed on chip."""
    return (a.conv / hw.conv_efficiency + a.depthwise / hw.depthwise_efficiency + a.elements / hw.elements_per_s
            + a.fc)


def op_busy_s(a: Arrays, hw: Hardware) -> np.ndarray:
    """Seconds each Edge TPU op keeps the array busy once its parameters are there: compute plus the op overhead."""
    return op_compute_s(a, hw) + a.overhead * hw.op_overhead_s


def tpu_seconds(a: Arrays, hw: Hardware, link: Link) -> float:
    """The Edge TPU part, from the input's first byte to its last op: the link and the array work as a pipeline.

    The host sends the input, then the streamed parameters in execution order, back to back; op k starts when
    op k-1 is done and its own parameters have arrived. So the part ends at max over k of (the time the link
    has delivered everything up to op k + the busy time of ops k..end), which is the sum of the busy times
    when nothing waits for the link, and the link time (plus the ops after the last streamed one) when it does.
    """
    busy = op_busy_s(a, hw) * link.busy_scale
    if not len(busy):
        return 0.0
    arrived = (a.input_bytes + np.cumsum(a.streamed)) / link.bytes_per_s  # op k's parameters are all there
    from_here = np.cumsum(busy[::-1])[::-1]                                # busy time of ops k..end
    return float(np.max(arrived + from_here))


def cpu_seconds(a: Arrays, link: Link) -> float:
    return a.cpu_macs / link.cpu_macs_per_s + a.cpu_elements / (link.cpu_macs_per_s * CPU_ELEMENTS_PER_S_PER_MAC_RATE)


def invoke_seconds(a: Arrays, hw: Hardware, link: Link) -> float:
    """One invoke: overhead, input and streamed parameters pipelined with the ops, the output back, CPU ops."""
    if not a.on_tpu.any():
        return cpu_seconds(a, link)
    return link.invoke_s + tpu_seconds(a, hw, link) + a.output_bytes / link.bytes_per_s + cpu_seconds(a, link)


# ---- the calibration -------------------------------------------------------------------------------------------

def _vector_to_params(x: np.ndarray) -> dict:
    values = np.exp(x)
    params = dict(zip(SHARED, values[:len(SHARED)]))
    start = len(SHARED)
    for link in CALIBRATED_LINKS:
        params[link] = dict(zip(PER_LINK[link], values[start:start + len(PER_LINK[link])]))
        start += len(PER_LINK[link])
    return {k: ({kk: float(vv) for kk, vv in v.items()} if isinstance(v, dict) else float(v))
            for k, v in params.items()}


def _bounds() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    names = list(SHARED) + [p for link in CALIBRATED_LINKS for p in PER_LINK[link]]
    return (np.log([LOWER[n] for n in names]), np.log([UPPER[n] for n in names]), np.log([START[n] for n in names]))


def calibration_points(table: dict, features: dict) -> list[dict]:
    """Table 1 rows that were built: name, the published ms per link, and the model's arrays."""
    points = []
    for row in table["rows"]:
        built = features.get(row.get("keras") or "")
        if built is None:
            continue
        points.append({"model": row["model"], "keras": row["keras"], "input_size": row["input_size"],
                       "measured_ms": {link: float(row[TABLE_COLUMN[link]]) for link in CALIBRATED_LINKS},
                       "arrays": Arrays.of(ModelFeatures.from_dict(built["features"]))})
    return points


def _params_to_vector(params: dict) -> np.ndarray:
    values = [params[n] for n in SHARED] + [params[link][n] for link in CALIBRATED_LINKS for n in PER_LINK[link]]
    return np.log(values)


def fit(points: list[dict], start_params: dict | None = None) -> dict:
    """Robust least squares on log(estimated / measured) over every (row, calibrated link).

    start_params: where the search starts (the fit on every row, for the leave-one-out fits); else START.
    """
    from scipy.optimize import least_squares

    lower, upper, start = _bounds()
    if start_params is not None:
        start = np.clip(_params_to_vector(start_params), lower, upper)

    def residuals(x):
        hw = Hardware.from_params(_vector_to_params(x))
        return [math.log(invoke_seconds(p["arrays"], hw, hw.links[link]) * 1e3 / p["measured_ms"][link])
                for p in points for link in CALIBRATED_LINKS]

    result = least_squares(residuals, start, bounds=(lower, upper), x_scale=1.0, loss=ROBUST_LOSS, f_scale=ROBUST_SCALE)
    return _vector_to_params(result.x)


def error_stats(rows: list[dict]) -> dict:
    """Per calibrated link: median absolute % error and the worst ratio (estimate/measured or its inverse)."""
    stats = {}
    for link in CALIBRATED_LINKS:
        ratios = [r["estimated_ms"][link] / r["measured_ms"][link] for r in rows]
        stats[link] = {"median_abs_pct": round(float(np.median([abs(q - 1) * 100 for q in ratios])), 1),
                       "max_ratio": round(float(max(max(q, 1 / q) for q in ratios)), 2), "rows": len(ratios)}
    return stats


def leave_one_out(points: list[dict], start_params: dict | None = None) -> list[dict]:
    """Each row estimated by a fit on all the other rows."""
    rows = []
    for i, held in enumerate(points):
        hw = Hardware.from_params(fit(points[:i] + points[i + 1:], start_params))
        rows.append({"model": held["model"], "keras": held["keras"], "input_size": held["input_size"],
                     "measured_ms": held["measured_ms"],
                     "estimated_ms": {link: round(invoke_seconds(held["arrays"], hw, hw.links[link]) * 1e3, 2)
                                      for link in CALIBRATED_LINKS}})
    return rows


def fit_calibration(table: dict, features: dict) -> dict:
    """The parameters fitted on every built row, the in-sample and leave-one-out tables and their errors."""
    points = calibration_points(table, features)
    if len(points) < 3:
        raise EstimateError(f"only {len(points)} calibration rows built: run `python -m converter.calibrate_estimate "
                            "features` first")
    params = fit(points)
    hw = Hardware.from_params(params)
    in_sample = [{"model": p["model"], "measured_ms": p["measured_ms"],
                  "estimated_ms": {link: round(invoke_seconds(p["arrays"], hw, hw.links[link]) * 1e3, 2)
                                   for link in CALIBRATED_LINKS}} for p in points]
    loo = leave_one_out(points, params)
    return {
        "source": table["source"]["url"],
        "params": params,
        "constants": {"peak_macs_per_s": PEAK_MACS_PER_S, "array": ARRAY, "sram_bytes": SRAM_BYTES,
                      "sram_reserve_bytes": SRAM_RESERVE_BYTES, "usb2_bytes_per_s": USB2_BYTES_PER_S,
                      "desktop_cpu_macs_per_s": DESKTOP_CPU_MACS_PER_S,
                      "devboard_cpu_macs_per_s": DEVBOARD_CPU_MACS_PER_S},
        "in_sample": in_sample,
        "in_sample_error": error_stats(in_sample),
        "leave_one_out": loo,
        "leave_one_out_error": error_stats(loo),
        "not_built": [{"model": r["model"], "why": r["not_built"]} for r in table["rows"] if r.get("not_built")],
        "out_of_sample": out_of_sample(table, features, hw),
    }


def out_of_sample(table: dict, features: dict, hw: Hardware) -> list[dict]:
    """Rows built only as checks (hand-written architectures whose exact published model is unknown),
    estimated by the fit that never saw them."""
    rows = []
    for row in table["rows"]:
        built = features.get(row.get("check") or "")
        if built is None:
            continue
        arrays = Arrays.of(ModelFeatures.from_dict(built["features"]))
        rows.append({"model": row["model"], "built": row["check"], "input_size": row["input_size"],
                     "measured_ms": {link: float(row[TABLE_COLUMN[link]]) for link in CALIBRATED_LINKS},
                     "estimated_ms": {link: round(invoke_seconds(arrays, hw, hw.links[link]) * 1e3, 2)
                                      for link in CALIBRATED_LINKS}})
    return rows


def calibration_report(fitted: dict) -> str:
    """The leave-one-out table as Markdown, then the fitted parameters."""
    lines = ["| model | USB 3 measured | USB 3 estimated | error | Dev Board measured | Dev Board estimated | error |",
             "|---|---|---|---|---|---|---|"]
    for row in fitted["leave_one_out"]:
        cells = [row["model"] + f" ({row['input_size']})"]
        for link in CALIBRATED_LINKS:
            m, e = row["measured_ms"][link], row["estimated_ms"][link]
            cells += [f"{m:g}", f"{e:.1f}", f"{(e / m - 1) * 100:+.0f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    for link in CALIBRATED_LINKS:
        s = fitted["leave_one_out_error"][link]
        lines.append(f"\nleave-one-out, {LINK_TITLES[link]}: median absolute error {s['median_abs_pct']}%, "
                     f"worst ratio {s['max_ratio']}x over {s['rows']} rows")
    for row in fitted.get("out_of_sample", []):
        lines.append(f"\nout of sample (not fitted): {row['model']} ({row['built']}, {row['input_size']}): " + ", ".join(
            f"{LINK_TITLES[link]} measured {row['measured_ms'][link]:g} ms, estimated {row['estimated_ms'][link]:.1f} "
            f"({(row['estimated_ms'][link] / row['measured_ms'][link] - 1) * 100:+.0f}%)" for link in CALIBRATED_LINKS))
    p = fitted["params"]
    lines.append(f"\nfitted: conv efficiency {p['conv_efficiency']:.2f}, depthwise efficiency "
                 f"{p['depthwise_efficiency']:.3f}, element-wise {p['elements_per_s'] / 1e9:.2f} G elements/s, "
                 f"per-op overhead {p['op_overhead_s'] * 1e6:.1f} us; " + "; ".join(
                     f"{link}: per invoke {p[link]['invoke_s'] * 1e3:.2f} ms, "
                     f"link {p[link]['bytes_per_s'] / 1e6:.0f} MB/s"
                     + (f", Edge TPU busy x{p[link]['busy_scale']:.2f}" if "busy_scale" in p[link] else "")
                     for link in CALIBRATED_LINKS))
    return "\n".join(lines)


# ---- the estimate ----------------------------------------------------------------------------------------------

@cache
def calibration() -> dict:
    try:
        return json.loads(PARAMS_FILE.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EstimateError(f"{PARAMS_FILE} is missing: run `python -m converter.calibrate_estimate fit`") from None


def hardware() -> Hardware:
    return Hardware.from_params(calibration()["params"])


def int8_model_path(model: Path) -> Path:
    """The plain int8 .tflite of a model directory, or the .tflite given; compiled models are refused."""
    model = Path(model)
    if model.is_dir():
        from app.model_dir import read_model_dir

        return read_model_dir(model).file("int8")
    if not model.is_file():
        raise EstimateError(f"{model} is neither a model directory nor a .tflite file")
    return model


def _features(model_path: Path) -> ModelFeatures:
    model = features_of_file(int8_model_path(model_path))
    if any(op.opcode == "edgetpu-custom-op" for op in model.ops):
        raise EstimateError(f"{model_path} is already compiled for the Edge TPU: its structure is inside the custom "
                            "op; estimate the plain int8 model it was compiled from")
    return model


def stated_error() -> dict:
    """The leave-one-out error of the calibration, as stated beside every estimate."""
    fitted = calibration()
    loo = fitted["leave_one_out_error"]
    usb3, dev = loo["usb3"], loo["devboard"]
    checks = "".join(
        f"; out of sample, {row['model']} (built from its paper) is estimated "
        f"{row['estimated_ms']['usb3'] / row['measured_ms']['usb3']:.1f}x its published USB 3 time"
        for row in fitted.get("out_of_sample", []))
    return {
        "usb3": usb3, "devboard": dev,
        "text": (f"leave-one-out over {usb3['rows']} of Coral's Table 1 architectures: median error "
                 f"{usb3['median_abs_pct']:g}% (USB 3) and {dev['median_abs_pct']:g}% (Dev Board), worst "
                 f"{max(usb3['max_ratio'], dev['max_ratio']):g}x{checks}; USB 2 and PCIe are not calibrated (no "
                 "published rows): derived from the same hardware with their link's bandwidth"),
    }


def estimate_features(model: ModelFeatures) -> dict:
    """The estimate as plain values (what model.json and `converter estimate --json` carry)."""
    hw = hardware()
    arrays = Arrays.of(model)
    placement = place_parameters(model)
    on_tpu = sum(op.on_tpu for op in model.ops)
    return {
        "latency_ms": {link: round(invoke_seconds(arrays, hw, hw.links[link]) * 1e3, 2) for link in LINKS},
        "parameters": {"bytes": model.param_bytes, "on_chip_bytes": placement.on_chip_bytes,
                       "streamed_bytes": placement.streamed_bytes, "cache_bytes": placement.cache_bytes},
        "ops": {"edgetpu": on_tpu, "cpu": len(model.ops) - on_tpu},
        "macs": model.macs,
        "error": stated_error(),
        "method": ("estimated from the model's structure by converter/estimate.py (a hardware model calibrated on "
                   f"Coral's Table 1, {calibration()['source']}); not a measurement"),
    }


def estimate(model_path: Path) -> dict:
    """Estimate a model directory or a plain int8 .tflite."""
    return estimate_features(_features(Path(model_path)))


def estimate_tflite_bytes(tflite: bytes) -> dict | None:
    """The estimate of an int8 model being written (for model.json at build); None if it cannot be made."""
    from app.tflite_file import TfliteFileError, read_tflite
    from converter.estimate_features import features

    try:
        return estimate_features(features(read_tflite(tflite)))
    except (EstimateError, TfliteFileError, ValueError, IndexError):
        return None


def segment_costs(model_path: Path, link: str = "usb3") -> list[float]:
    """Estimated Edge TPU milliseconds per op, in execution order, with each op's parameters on chip.

    For balancing segments: each segment gets its own device and its own 8 MiB, which is the point of
    segmenting, so streaming is left out; ops the Edge TPU would not run cost their CPU time.
    """
    model = _features(Path(model_path))
    hw = hardware()
    a = Arrays.of(model)
    tpu = op_busy_s(a, hw)
    chosen = hw.links[link]
    cpu = (a.all_macs / chosen.cpu_macs_per_s
           + a.all_elements / (chosen.cpu_macs_per_s * CPU_ELEMENTS_PER_S_PER_MAC_RATE))
    return [float(ms) for ms in np.where(a.on_tpu, tpu, cpu) * 1e3]


ESTIMATE_LABEL = "estimated Edge TPU"
LINK_SHORT = {"usb3": "USB 3", "usb2": "USB 2", "pcie": "PCIe", "devboard": "Dev Board"}


def estimate_row(model_dir: Path, link: str = "usb3") -> dict:
    """The row a benchmark table shows beside its measured CPU row when no Edge TPU is present.

    Labelled as an estimate in its name; `inference_ms` is the estimated invoke time on `link`,
    `device_req_s` the most one such device could serve (1000 / inference_ms), `error` the stated error.
    """
    return row_from_estimate(estimate(model_dir), link)


def row_from_estimate(result: dict, link: str = "usb3") -> dict:
    """estimate_row() from an estimate already made: model.json's or /v1/models' `edgetpu_estimate`."""
    ms = float(result["latency_ms"][link])
    return {"backend": f"{ESTIMATE_LABEL} ({LINK_SHORT[link]}, not measured)", "estimated": True, "link": link,
            "inference_ms": ms, "device_req_s": 1000.0 / ms, "latency_ms": result["latency_ms"],
            "error": result["error"]["text"]}


def render(result: dict, name: str) -> str:
    """The estimate as a few lines for people."""
    p, ops = result["parameters"], result["ops"]
    mib = lambda b: f"{b / 2**20:.2f} MiB"  # noqa: E731
    lines = [f"{name}: ESTIMATED Edge TPU latency per invoke (a model of the hardware, not a measurement)"]
    for link in LINKS:
        lines.append(f"  {LINK_TITLES[link]:<45} {result['latency_ms'][link]:>9.2f} ms")
    lines += [
        f"  parameters {mib(p['bytes'])}: {mib(p['on_chip_bytes'])} cached on chip, {mib(p['streamed_bytes'])} "
        f"streamed every invoke (cache left by the activations: {mib(p['cache_bytes'])})",
        f"  ops: {ops['edgetpu']} on the Edge TPU, {ops['cpu']} on the CPU; {result['macs'] / 1e9:.2f} G MACs"
        + (" (the CPU ops from their MACs at the host's int8 rate: `converter inspect` says why they are there)"
           if ops["cpu"] else ""),
        f"  stated error: {result['error']['text']}",
    ]
    return "\n".join(lines)
