"""Does a pipeline of K devices run at the pace of its slowest segment? Simulated devices, side by side.

A model cut into K segments (converter/segment.py, with converter/segment_plan.py's cuts and costs)
runs on K simulated devices (bench/simulated_device.py: a device takes D ms with the GIL
released); segment i takes D_i = D x its share of the model's cost. Ideal throughput is
1 / max(D_i); one device running the whole model manages 1 / D. Both are driven through the
service's own machinery without HTTP (app.pool.EnginePool, admission and deadlines included,
and app.pool.pipeline.Pipeline for the segmented model), by asyncio clients keeping every lane
busy, in alternating rounds; each figure is the median over the rounds. HTTP and image work
are the device-capacity bench's subject (bench/device_capacity.py), not this one's.

Example usage:
    python bench/pipeline_capacity.py                           # both models, K = 2, 3, 4, D = 50 ms
    python bench/pipeline_capacity.py --models efficientnet_lite0 --segments 2 --device-ms 20 --rounds 5
    python bench/pipeline_capacity.py --duration 0.3 --rounds 1  # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engines import TensorSpec  # noqa: E402
from app.pool.pipeline import Pipeline  # noqa: E402
from app.pool import EnginePool, InterpreterMember, Stage  # noqa: E402
from bench.common import load_average, repo_root  # noqa: E402
from bench.simulated_device import SimulatedTpuEngine  # noqa: E402
from bench.stats import median  # noqa: E402

MODELS = ("efficientnet_lite0", "mobilenet_v2")
TARGET = 0.90  # of 1 / max(segment time)
MAX_REQUESTS = 200_000  # per point, with the duration: every load loop is bounded in count and time


@dataclass(frozen=True)
class Split:
    model: str
    segments_ms: list[float]
    specs: list[tuple[TensorSpec, TensorSpec]]  # (input, output) per segment

    @property
    def bound_req_s(self) -> float:
        return 1000 / max(self.segments_ms)


def split(model: str, k: int, device_ms: float) -> Split:
    """The committed model cut into k segments as `python -m converter segment` cuts it; each
    segment's device time its cost share of device_ms."""
    from app.model_dir.reading import read_model_dir
    from app.tflite_file import read_tflite
    from converter.segment import segment_bytes

    path = read_model_dir(repo_root() / "models" / model).file("int8")
    result = segment_bytes(path.read_bytes(), path, k)
    total = sum(p.cost for p in result.parts)
    specs = []
    for data in result.files:
        graph = read_tflite(data).graph
        pair = []
        for index in (graph.inputs[0], graph.outputs[0]):
            t = graph.tensors[index]
            pair.append(TensorSpec(t.name, t.shape, t.dtype, float(t.quantization.scale[0]),
                                   int(t.quantization.zero_point[0])))
        specs.append(tuple(pair))
    return Split(model, [device_ms * p.cost / total for p in result.parts], specs)


def simulated(spec_in: TensorSpec, spec_out: TensorSpec, ms: float) -> SimulatedTpuEngine:
    return SimulatedTpuEngine((spec_in,), (spec_out,), [np.zeros(spec_out.shape, spec_out.dtype)], ms / 1000)


def whole_pool(s: Split, device_ms: float, lanes: int) -> EnginePool:
    engine = simulated(s.specs[0][0], s.specs[-1][1], device_ms)
    return EnginePool(f"{s.model}/whole", [InterpreterMember(Stage(engine))], max_waiting=lanes, wait_timeout_s=30,
                      retry_after_s=1, invoke_timeout_s=30)


def pipeline_pool(s: Split) -> EnginePool:
    stages = [Stage(simulated(a, b, ms), device=f"sim{i}", index=i)
              for i, ((a, b), ms) in enumerate(zip(s.specs, s.segments_ms))]
    pipeline = Pipeline(f"{s.model}/x{len(stages)}", stages)
    return EnginePool(f"{s.model}/pipeline", [pipeline], max_waiting=pipeline.lanes, wait_timeout_s=30,
                      retry_after_s=1, invoke_timeout_s=30)


async def drive(pool: EnginePool, concurrency: int, seconds: float, warmup_s: float) -> float:
    """Completions per second with `concurrency` clients, after a warm-up; bounded in time and count."""
    spec = pool.members.inputs[0]
    x = [np.zeros(spec.shape, spec.dtype)]
    loop = asyncio.get_running_loop()
    start_at = loop.time() + warmup_s
    end_at = start_at + seconds
    done = [0]

    async def client():
        while loop.time() < end_at and done[0] < MAX_REQUESTS:
            with pool.admit() as place:  # a place in line, given back once answered
                await place.run(x)
            if start_at <= loop.time() <= end_at:
                done[0] += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return done[0] / seconds


def measure(s: Split, device_ms: float, seconds: float, rounds: int) -> dict:
    lanes = 2 * len(s.segments_ms)
    whole, piped = whole_pool(s, device_ms, lanes), pipeline_pool(s)
    try:
        got = {"whole": [], "pipeline": []}
        for _ in range(rounds):  # alternating: whatever the machine does meanwhile hits both
            got["whole"].append(asyncio.run(drive(whole, lanes, seconds, min(0.5, seconds / 2))))
            got["pipeline"].append(asyncio.run(drive(piped, lanes, seconds, min(0.5, seconds / 2))))
    finally:
        for pool in (whole, piped):
            pool.close()
            pool.members.join(5)
    pipeline_req_s = median(got["pipeline"])
    whole_req_s = median(got["whole"])
    return {"model": s.model, "segments": len(s.segments_ms), "segments_ms": s.segments_ms,
            "bound_req_s": s.bound_req_s, "pipeline_req_s": pipeline_req_s, "whole_req_s": whole_req_s,
            "of_bound": pipeline_req_s / s.bound_req_s, "speedup": pipeline_req_s / whole_req_s,
            "whole_bound_req_s": 1000 / device_ms, "rounds": rounds}


def print_table(rows: list[dict], device_ms: float, seconds: float) -> None:
    print(f"\n### pipeline capacity: simulated devices, whole model D = {device_ms:g} ms, {seconds:g} s per point, "
          f"medians of {rows[0]['rounds']} alternating rounds ({os.cpu_count()} cores, load average "
          f"{load_average()})\n")
    print("| model | K | segment ms | bound 1/max req/s | pipeline req/s | of bound | one device, whole model req/s "
          "(bound) | pipeline / one device |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['segments']} | {' + '.join(f'{ms:.2f}' for ms in r['segments_ms'])} | "
              f"{r['bound_req_s']:.0f} | {r['pipeline_req_s']:.0f} | {r['of_bound']:.0%} | "
              f"{r['whole_req_s']:.0f} ({r['whole_bound_req_s']:.0f}) | {r['speedup']:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="committed models to cut (comma-separated)")
    parser.add_argument("--segments", default="2,3,4", help="K values (comma-separated)")
    parser.add_argument("--device-ms", type=float, default=50.0,
                        help="simulated device time of the whole model on one device, ms (default 50: a model "
                             "whose parameters do not fit the TPU's cache, as ResNet-50's 49 ms on a USB "
                             "Accelerator, the case pipelining is for)")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measured point")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians reported")
    args = parser.parse_args(argv)
    rows = []
    for model in args.models.split(","):
        for k in (int(v) for v in args.segments.split(",")):
            rows.append(measure(split(model, k, args.device_ms), args.device_ms, args.duration, args.rounds))
    print_table(rows, args.device_ms, args.duration)
    below = [r for r in rows if r["of_bound"] < TARGET]
    if below:
        print(f"\nbelow {TARGET:.0%} of 1/max(segment time): "
              + ", ".join(f"{r['model']} K={r['segments']} ({r['of_bound']:.0%})" for r in below))
    return 1 if below else 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"\n({time.monotonic() - started:.0f} s)")
    sys.exit(code)
