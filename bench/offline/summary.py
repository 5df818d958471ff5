"""The compact table of a device_capacity.py --json report, one process and several on one port (and
replicas.py's, several on their own ports, if given)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

KINDS = ("event loop", "image", "device", "other")


def short(name: str) -> str:
    return "v2 raw" if name.startswith("raw") else name.replace(" JPEG", "").replace("224x224", "224 JPEG")


def merge(target: Path, parts: list[Path]) -> int:
    """device_capacity.py reports, one per device count, as one report (its --redraw reads it)."""
    reports = [json.loads(p.read_text()) for p in parts if p.is_file()]
    if not reports:
        print(f"nothing to merge into {target}", file=sys.stderr)
        return 1
    reports.sort(key=lambda r: min(((p.get("processes", 1), p["devices"]) for p in r["points"]), default=(0, 0)))
    merged = {"points": [p for r in reports for p in r["points"]], "stages": [s for r in reports for s in r["stages"]],
              "bounds": [b for r in reports for b in r["bounds"]],
              "chart_title": reports[0].get("chart_title", "device busy against concurrency")}
    target.write_text(json.dumps(merged, indent=2))
    print(f"merged {len(reports)} report(s) into {target}")
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--merge"]:
        return merge(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
    paths = [Path(p) for p in sys.argv[1:]]
    cap = json.loads(paths[0].read_text()) if paths and paths[0].exists() else None
    if cap:
        bounds = {(b["input"], b["devices"]): b for b in cap.get("bounds", [])}
        print("\n## P processes on one port: D, devices, input, c -> req/s (2xx), device busy, shed, latency, server CPU")
        print("(P = 1: one process; loop core = the event-loop thread's CPU per second, 1.00 = one core, one process "
              "only; cores = all threads of all processes; bound = without HTTP, same image threads)\n")
        print(f"{'P':>2} {'dev':>3} {'input':<9} {'c':>3} {'req/s':>6} {'busy':>5} {'shed':>6} {'p50':>6} {'p99':>6} "
              f"{'cpu/req':>7} {'loop':>5} {'image':>5} {'dev':>5} {'oth':>5} {'loopcore':>8} {'cores':>5} {'bound':>10} "
              f"{'err':>4}")
        for r in cap["points"]:
            cpu = r.get("cpu_ms_per_request", {})
            total = r.get("cpu_ms_per_request_total", float("nan"))
            b = bounds.get((r["input"], r["devices"]))
            bound = (f"{b['req_s']:.0f}/{b['req_s'] * b['device_ms'] / 1000 / b['devices']:.0%}" if b else "-")
            print(f"{r.get('processes', 1):>2} {r['devices']:>3} {short(r['input']):<9} {r['concurrency']:>3} "
                  f"{r['req_s']:>6.0f} {r['device_busy']:>5.0%} {r.get('shed', 0):>6} {r['p50_ms']:>6.2f} "
                  f"{r['p99_ms']:>6.2f} {total:>7.2f} "
                  + " ".join(f"{cpu.get(k, 0):>5.2f}" for k in KINDS)
                  + f" {cpu.get('event loop', 0) * r['req_s'] / 1000:>8.2f} {total * r['req_s'] / 1000:>5.1f} "
                  f"{bound:>10} {r['errors']:>4}")
        print("\n## best point per process and device count (2xx only)")
        best: dict = {}
        for r in cap["points"]:
            key = (r["input"], r.get("processes", 1), r["devices"])
            if key not in best or r["req_s"] > best[key]["req_s"]:
                best[key] = r
        for (name, processes, n), r in sorted(best.items()):
            print(f"  {short(name):<9} {processes:>2} process(es), {n:>2} devices: {r['req_s']:>5.0f} req/s, "
                  f"{r['device_busy']:.0%} busy at c={r['concurrency']} ({r.get('shed', 0)} shed), "
                  f"{r.get('cpu_ms_per_request_total', float('nan')):.2f} CPU ms/req")
    if len(paths) > 1 and paths[1].exists():
        rep = json.loads(paths[1].read_text())
        print("\n## replicas: P processes x k devices, load split evenly, all at once")
        print(f"{'PxK':>5} {'input':<9} {'c':>3} {'req/s':>6} {'busy':>5} {'p50':>6} {'p99':>6} {'cpu/req':>7} "
              f"{'cores':>5} {'err':>4}  per-process req/s")
        for r in rep["points"]:
            print(f"{str(r['processes']) + 'x' + str(r['devices_each']):>5} {short(r['input']):<9} {r['concurrency']:>3} "
                  f"{r['req_s']:>6.0f} {r['device_busy']:>5.0%} {r['p50_ms']:>6.2f} {r['p99_ms']:>6.2f} "
                  f"{r['cpu_ms_per_request_total']:>7.2f} {r['cpu_cores_used']:>5.1f} {r['errors']:>4}  "
                  + ",".join(f"{x:.0f}" for x in r["per_process_req_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
