"""How fast a model would run on a Coral Edge TPU, estimated from its structure: a model of the hardware.

Example usage:

    python -m converter estimate models/mobilenet_v2          # a model directory (its int8 model)
    python -m converter estimate my_model_int8.tflite --json

The Edge TPU is a 64 x 64 array of int8 multiply-accumulate units at 480 MHz: 4 TOPS counts two
operations per MAC, so the peak is 2 T MAC/s. It has 8 MiB of on-chip memory, which holds the
activations while the model runs and, in what is left, the parameters; the compiler caches
parameters first come, first served, in execution order, and the parameters that do not fit are
sent from the host over the link on every invoke. The host sends the input and reads back what
the Edge TPU part made. Per invoke, on a link (a host and how the Edge TPU hangs off it):

  t = invoke overhead(link)
    + the Edge TPU part: input, streamed parameters and the ops' busy time as a pipeline (tpu_seconds)
    + the bytes the Edge TPU part hands back / link bandwidth
    + the CPU ops after the Edge TPU part: MACs at the host's int8 rate, element work (a detector's
      TFLite_Detection_PostProcess: its box encodings and class scores) at the host's element rate

  busy time of an Edge TPU op (the same chip, at the same clock, behind every link):
    conv, depthwise   MACs / (2e12 * efficiency(kind) * fill(depth) * fill(channels))
                      fill(n) = n / (64 * ceil(n / 64)): how much of the 64-wide array the matrix uses
    fully connected   MACs / (2e12 / 64): batch 1 uses each weight once, so the array runs one column
    element-wise      output elements / element rate (adds, multiplies, pools, concatenations)
    layout            nothing (reshapes, quantize, pad: folded into addressing)
    + a fixed cost per op that is not a layout op

This module is the hardware model and the cost; converter/calibrate_estimate.py fits its few
parameters on published measurements (converter/data/edgetpu_measurements.json) and writes them,
with the leave-one-out error by link and model size, to converter/data/edgetpu_estimate.json.
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
# Host CPU int8 rates for the operators the Edge TPU does not run. The desktop: MobileNetV2 int8 on
# ai-edge-litert's XNNPACK, 1 thread, 4.6 ms for 300.8 M MACs on an x86-64 server core (FACTS.md). The ARM hosts:
# Coral's CPU-only reference figure for mobilenet_v1_1.0_224_quant (568.7 M MACs) on the same host
# (google-coral/edgetpu benchmarks/reference/basic_engine_reference_<host>.csv: Raspberry Pi 3 B 308.4 ms,
# Raspberry Pi 4 125.97 ms, Dev Board 184.99 ms). The same figures, with the Xeon E5-1650 v3's 43.89 ms, give each
# host's speed at the scalar work of TFLite's own kernels (`ref`), which the post-process op's cost scales with.
MOBILENET_V1_MACS = 568.7e6
DESKTOP_CPU_MACS_PER_S = 300.8e6 / 4.6e-3
CPU_MACS_PER_S = {"desktop": DESKTOP_CPU_MACS_PER_S, "rpi3": MOBILENET_V1_MACS / 308.4e-3,
                  "rpi4": MOBILENET_V1_MACS / 125.97e-3, "devboard": MOBILENET_V1_MACS / 184.99e-3}
CPU_REF_MACS_PER_S = {"desktop": MOBILENET_V1_MACS / 43.89e-3, "rpi3": CPU_MACS_PER_S["rpi3"],
                      "rpi4": CPU_MACS_PER_S["rpi4"], "devboard": CPU_MACS_PER_S["devboard"]}
# CPU operators that only re-label a buffer cost nothing on the host either
CPU_FREE_OPS = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS"})

# A link is the host and how the Edge TPU hangs off it. The calibrated ones have published measurements;
# PCIe (an M.2 or Mini PCIe card in a desktop) is derived from the Dev Board (below).
LINKS = ("usb3", "usb2", "rpi4", "pcie", "devboard")
CALIBRATED_LINKS = ("usb3", "usb2", "rpi4", "devboard")
LINK_TITLES = {"usb3": "USB 3 (USB Accelerator on a desktop)",
               "usb2": "USB 2 (USB Accelerator on a Raspberry Pi 3)",
               "rpi4": "USB 3 on a Raspberry Pi 4",
               "pcie": "PCIe (M.2 / Mini PCIe card in a desktop)",
               "devboard": "Dev Board (on-board PCIe, i.MX 8M host)"}
LINK_SHORT = {"usb3": "USB 3", "usb2": "USB 2", "rpi4": "Raspberry Pi 4", "pcie": "PCIe", "devboard": "Dev Board"}
HOST_OF_LINK = {"usb3": "desktop", "usb2": "rpi3", "rpi4": "rpi4", "pcie": "desktop", "devboard": "devboard"}

# The fitted parameters. Shared by every link: the Edge TPU's efficiencies, its element rate and per-op cost, and
# the host's element work per unit of its reference speed. Per calibrated link: the host's fixed cost per invoke
# (driver work and round trips) and the link's bandwidth. The Edge TPU's own speed is shared: a per-link busy scale
# (the Dev Board's compute-bound rows run 10-25% slower than over USB 3) fitted the Dev Board's fixed cost to zero,
# which put a tiny model there at 0.02 ms; one chip, one clock is the model, and those rows carry the error.
SHARED = ("conv_efficiency", "depthwise_efficiency", "elements_per_s", "op_overhead_s", "cpu_elements_per_ref_mac")
PER_LINK = {link: ("invoke_s", "bytes_per_s") for link in ("usb3", "usb2", "rpi4", "devboard")}
# Physical bounds the fit keeps to: an efficiency of at most 1; at most 500 MB/s over USB 3.0 (5 Gb/s with 8b/10b
# coding, 4 Gb/s of payload) and PCIe gen 2 x1 alike, at most 53 MB/s of bulk data over USB 2.0 (480 Mb/s signalling).
LINK_CEILING_BYTES_PER_S = {"usb3": 500e6, "usb2": 53e6, "rpi4": 500e6, "devboard": 500e6}
LOWER = {"conv_efficiency": 1e-3, "depthwise_efficiency": 1e-3, "elements_per_s": 1e7, "op_overhead_s": 1e-8,
         "cpu_elements_per_ref_mac": 1e-4, "invoke_s": 1e-6, "bytes_per_s": 1e6}
UPPER = {"conv_efficiency": 1.0, "depthwise_efficiency": 1.0, "elements_per_s": 1e12, "op_overhead_s": 1e-3,
         "cpu_elements_per_ref_mac": 10.0, "invoke_s": 20e-3, "bytes_per_s": 500e6}

# Model sizes, for the stated error: small runs in about a millisecond of Edge TPU work and keeps every parameter
# on chip (the MobileNets, SqueezeNet); large streams parameters from the host on every invoke; medium is between.
SMALL_MAX_MACS = 1e9
SIZES = ("small", "medium", "large")
SIZE_TITLES = {"small": "small (under 1 G MACs, every parameter on chip)",
               "medium": "medium (the rest, parameters on chip)",
               "large": "large (parameters streamed from the host every invoke)"}


class EstimateError(Exception):
    pass


@dataclass(frozen=True)
class Link:
    invoke_s: float
    bytes_per_s: float
    cpu_macs_per_s: float
    cpu_elements_per_s: float


@dataclass(frozen=True)
class Hardware:
    conv_efficiency: float
    depthwise_efficiency: float
    elements_per_s: float
    op_overhead_s: float
    links: dict[str, Link]

    @classmethod
    def from_params(cls, params: dict) -> Hardware:
        """Every link from the fitted values; PCIe derived from the Dev Board.

        PCIe (an M.2 or Mini PCIe card in a desktop) is the Dev Board's Edge TPU, link and per-invoke path (the
        same PCIe gen 2 x1 part and driver); the desktop's faster CPU can only shorten the host's share, so the
        Dev Board's overhead is its upper bound, and CPU ops run at the desktop's rate.
        """
        ratio = params["cpu_elements_per_ref_mac"]

        def link(name: str, fitted: dict) -> Link:
            host = HOST_OF_LINK[name]
            return Link(fitted["invoke_s"], fitted["bytes_per_s"], CPU_MACS_PER_S[host],
                        ratio * CPU_REF_MACS_PER_S[host])

        links = {name: link(name, params[name]) for name in CALIBRATED_LINKS}
        links["pcie"] = link("pcie", params["devboard"])
        return cls(**{k: params[k] for k in SHARED if k != "cpu_elements_per_ref_mac"}, links=links)


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


def size_class(model: ModelFeatures) -> str:
    """small, medium or large (SIZE_TITLES): what the stated error is grouped by."""
    if place_parameters(model).streamed_bytes:
        return "large"
    return "small" if model.macs < SMALL_MAX_MACS else "medium"


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
    cpu_macs: np.ndarray   # per op: MACs the host runs (0 for Edge TPU ops)
    cpu_elements: np.ndarray  # per op: elements the host reads and writes (0 for Edge TPU ops and reshapes)
    input_bytes: float     # sent to the Edge TPU before its first op
    output_bytes: float    # read back: the output, or what the CPU ops after the Edge TPU part read

    @classmethod
    def of(cls, model: ModelFeatures) -> Arrays:
        kind = np.array([op.kind for op in model.ops])
        on_tpu = np.array([op.on_tpu for op in model.ops], dtype=bool)
        macs = np.array([op.macs for op in model.ops], dtype=np.float64)
        elements = np.array([op.out_elements for op in model.ops], dtype=np.float64)
        fills = fill([op.depth for op in model.ops]) * fill([op.channels for op in model.ops])
        at_peak = macs / (PEAK_MACS_PER_S * fills)
        tpu = lambda mask: np.where(mask & on_tpu, 1.0, 0.0)  # noqa: E731
        host_work = np.array([0.0 if op.on_tpu or op.opcode in CPU_FREE_OPS else op.in_elements + op.out_elements
                              for op in model.ops])
        return cls(conv=at_peak * tpu(kind == CONV), depthwise=at_peak * tpu(kind == DEPTHWISE),
                   elements=elements * tpu(kind == ELEMENTWISE),
                   fc=macs / (PEAK_MACS_PER_S / ARRAY) * tpu(kind == FULLY_CONNECTED),
                   on_tpu=on_tpu, overhead=tpu(kind != LAYOUT), streamed=place_parameters(model).streamed,
                   cpu_macs=np.where(on_tpu, 0.0, macs), cpu_elements=host_work,
                   input_bytes=float(model.input_bytes), output_bytes=float(model.tpu_handoff_bytes))


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
    busy = op_busy_s(a, hw)
    if not len(busy):
        return 0.0
    arrived = (a.input_bytes + np.cumsum(a.streamed)) / link.bytes_per_s  # op k's parameters are all there
    from_here = np.cumsum(busy[::-1])[::-1]                                # busy time of ops k..end
    return float(np.max(arrived + from_here))


def cpu_op_seconds(a: Arrays, link: Link) -> np.ndarray:
    """Seconds each op takes on the host (0 for Edge TPU ops): its MACs and its element work."""
    return a.cpu_macs / link.cpu_macs_per_s + a.cpu_elements / link.cpu_elements_per_s


def cpu_seconds(a: Arrays, link: Link) -> float:
    return float(cpu_op_seconds(a, link).sum())


def invoke_seconds(a: Arrays, hw: Hardware, link: Link) -> float:
    """One invoke: overhead, input and streamed parameters pipelined with the ops, the hand-back, CPU ops."""
    if not a.on_tpu.any():
        return cpu_seconds(a, link)
    return link.invoke_s + tpu_seconds(a, hw, link) + a.output_bytes / link.bytes_per_s + cpu_seconds(a, link)


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
        from app.model_dir.reading import read_model_dir

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


def stated_error(size: str | None = None) -> dict:
    """The leave-one-out error of the calibration, as stated beside every estimate: per link, and per link for
    the model's size class when it is given."""
    fitted = calibration()
    by_link = fitted["leave_one_out_error"]["by_link"]
    by_size = fitted["leave_one_out_error"]["by_link_and_size"]
    figures, architectures = fitted["calibration_set"]["figures"], fitted["calibration_set"]["architectures"]

    def said(stats: dict) -> str:
        return f"{stats['median_abs_pct']:g}% median, worst {stats['max_ratio']:g}x over {stats['figures']}"

    text = (f"leave-one-architecture-out over {figures} published figures of {architectures} architectures "
            "(converter/data/edgetpu_measurements.json): " + "; ".join(
                f"{LINK_SHORT[link]} {said(by_link[link])}" for link in CALIBRATED_LINKS))
    if size is not None:
        text += f"; for {size} models: " + "; ".join(
            f"{LINK_SHORT[link]} {said(by_size[link][size])}" for link in CALIBRATED_LINKS
            if by_size[link].get(size))
    text += "; PCIe is not calibrated (no published figures): the Dev Board's Edge TPU and link with a desktop's CPU"
    result = {"by_link": by_link, "text": text}
    if size is not None:
        result.update(size=size, by_link_for_size={link: by_size[link].get(size) for link in CALIBRATED_LINKS})
    return result


def cpu_ops_summary(model: ModelFeatures, hw: Hardware) -> list[dict]:
    """The ops the host runs after the Edge TPU part, each with its estimated ms per link (part of latency_ms)."""
    arrays = Arrays.of(model)
    per_link = {link: cpu_op_seconds(arrays, hw.links[link]) * 1e3 for link in LINKS}
    return [{"index": op.index, "opcode": op.opcode, "ms": {link: round(float(per_link[link][i]), 3) for link in LINKS}}
            for i, op in enumerate(model.ops) if not op.on_tpu and op.opcode not in CPU_FREE_OPS]


def estimate_features(model: ModelFeatures) -> dict:
    """The estimate as plain values (what model.json and `converter estimate --json` carry)."""
    hw = hardware()
    arrays = Arrays.of(model)
    placement = place_parameters(model)
    on_tpu = sum(op.on_tpu for op in model.ops)
    size = size_class(model)
    return {
        "latency_ms": {link: round(invoke_seconds(arrays, hw, hw.links[link]) * 1e3, 2) for link in LINKS},
        "parameters": {"bytes": model.param_bytes, "on_chip_bytes": placement.on_chip_bytes,
                       "streamed_bytes": placement.streamed_bytes, "cache_bytes": placement.cache_bytes},
        "ops": {"edgetpu": on_tpu, "cpu": len(model.ops) - on_tpu},
        "cpu_ops": cpu_ops_summary(model, hw),
        "macs": model.macs,
        "size": size,
        "error": stated_error(size),
        "method": ("estimated from the model's structure by converter/estimate.py (a hardware model calibrated on "
                   "published Edge TPU measurements, converter/data/edgetpu_measurements.json); not a measurement"),
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
    chosen = hw.links[link]
    a = Arrays.of(model)
    host = Arrays.of(model.on_cpu())  # every op as the host would run it
    return [float(ms) for ms in np.where(a.on_tpu, op_busy_s(a, hw), cpu_op_seconds(host, chosen)) * 1e3]


ESTIMATE_LABEL = "estimated Edge TPU"


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
        if link in result["latency_ms"]:
            lines.append(f"  {LINK_TITLES[link]:<45} {result['latency_ms'][link]:>9.2f} ms")
    lines += [
        f"  parameters {mib(p['bytes'])}: {mib(p['on_chip_bytes'])} cached on chip, {mib(p['streamed_bytes'])} "
        f"streamed every invoke (cache left by the activations: {mib(p['cache_bytes'])})",
        f"  ops: {ops['edgetpu']} on the Edge TPU, {ops['cpu']} on the CPU; {result['macs'] / 1e9:.2f} G MACs"
        + (" (`converter inspect` says why the CPU ones are there)" if ops["cpu"] else ""),
    ]
    for op in result.get("cpu_ops", []):
        costs = ", ".join(f"{op['ms'][link]:.2f} ms ({LINK_SHORT[link]})" for link in ("usb3", "usb2", "devboard"))
        lines.append(f"  on the CPU after the Edge TPU: {op['opcode']} (op {op['index']}), estimated {costs}, "
                     "included above")
    lines.append(f"  size class: {SIZE_TITLES.get(result.get('size'), result.get('size'))}")
    lines.append(f"  stated error: {result['error']['text']}")
    return "\n".join(lines)
