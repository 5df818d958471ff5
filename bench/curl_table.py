"""Format curl_bench.sh's results: one row per backend, from the service's own timing fields.

Input lines: backend <TAB> curl time_total (s) <TAB> HTTP status <TAB> response JSON.
A request is cold when the service says so (`"cold": true`): after a reload, each of a
pool's interpreters pays its first inference once, so there may be several cold ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # converter.estimate, for the estimated row

PERCENTILES = (50, 90, 99)
BASELINE = "cpu"


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, round(p / 100 * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


def read(lines):
    by_backend = defaultdict(lambda: {"cold": [], "warm": [], "client_s": [], "errors": 0})
    for line in lines:
        backend, client_s, status, body = line.rstrip("\n").split("\t", 3)
        row = by_backend[backend]
        if status != "200":
            row["errors"] += 1
            continue
        response = json.loads(body)
        (row["cold"] if response["cold"] else row["warm"]).append(response)
        if not response["cold"]:
            row["client_s"].append(float(client_s))
    return by_backend


def summarize(by_backend) -> list[dict]:
    rows = []
    for backend, row in by_backend.items():
        warm_inference = [r["timing_ms"]["inference"] for r in row["warm"]]
        warm_total = [r["timing_ms"]["total"] for r in row["warm"]]
        first = row["cold"][0] if row["cold"] else None
        summary = {
            "backend": backend,
            "ran": sorted({r["backend"] for r in row["cold"] + row["warm"]}),
            "cold_total": first["timing_ms"]["total"] if first else None,
            "cold_inference": first["timing_ms"]["inference"] if first else None,
            "warm": len(warm_inference),
            "errors": row["errors"],
            "rps": len(row["client_s"]) / sum(row["client_s"]) if row["client_s"] else None,
        }
        for p in PERCENTILES:
            summary[f"inference_p{p}"] = percentile(warm_inference, p) if warm_inference else None
            summary[f"total_p{p}"] = percentile(warm_total, p) if warm_total else None
        rows.append(summary)
    base = next((r for r in rows if r["backend"] == BASELINE and r["inference_p50"]), None)
    for r in rows:
        r["speedup"] = base["inference_p50"] / r["inference_p50"] if base and r["inference_p50"] else None
    return rows


COLUMNS = (
    ("backend", "backend", "{}"),
    ("cold_total", "cold total ms", "{:.1f}"),
    ("cold_inference", "cold infer ms", "{:.1f}"),
    *((f"inference_p{p}", f"infer p{p}", "{:.2f}") for p in PERCENTILES),
    *((f"total_p{p}", f"total p{p}", "{:.2f}") for p in PERCENTILES),
    ("rps", "req/s", "{:.1f}"),
    ("speedup", "infer speed-up vs cpu", "{:.2f}x"),
    ("errors", "errors", "{}"),
)


def cell(row, key, fmt):
    value = row[key]
    return "-" if value is None else fmt.format(value)


def print_table(rows, markdown: bool, out=sys.stdout) -> None:
    headers = [title for _, title, _ in COLUMNS]
    body = [[cell(r, key, fmt) for key, _, fmt in COLUMNS] for r in rows]
    if markdown:
        print("| " + " | ".join(headers) + " |", file=out)
        print("|" + "---|" * len(headers), file=out)
        for line in body:
            print("| " + " | ".join(line) + " |", file=out)
        return
    widths = [max(len(h), *(len(line[i]) for line in body)) for i, h in enumerate(headers)]
    for line in [headers, *body]:
        print("  ".join(v.rjust(w) for v, w in zip(line, widths)), file=out)


def described_model(path: str) -> dict:
    """The saved /v1/models/NAME answer; {} when the service did not give one."""
    try:
        answer = json.loads(open(path, encoding="utf-8").read() or "{}")
    except (OSError, ValueError):
        return {}
    return answer if isinstance(answer, dict) else {}


def estimated_row(rows: list[dict], described: dict) -> dict | None:
    """The estimated Edge TPU row (converter/estimate.py), labelled as an estimate, when no edgetpu row was measured."""
    if any(r["backend"] == "edgetpu" and r["warm"] for r in rows) or not described.get("edgetpu_estimate"):
        return None
    from converter.estimate import row_from_estimate

    est = row_from_estimate(described["edgetpu_estimate"])
    base = next((r for r in rows if r["backend"] == BASELINE and r["inference_p50"]), None)
    return dict({key: None for key, _, _ in COLUMNS}, backend=est["backend"], ran=[], errors=None, note=est["error"],
                inference_p50=est["inference_ms"], speedup=base["inference_p50"] / est["inference_ms"] if base else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    parser.add_argument("--photo", default="", help="photo name, for the caption")
    parser.add_argument("--url", default="", help="service URL, for the caption")
    parser.add_argument("--model-json", default=None,
                        help="the model's /v1/models/NAME answer: its edgetpu_estimate becomes an estimated row")
    args = parser.parse_args()
    rows = summarize(read(sys.stdin))
    if not rows:
        print("no results", file=sys.stderr)
        return 1
    estimated = estimated_row(rows, described_model(args.model_json)) if args.model_json else None
    if estimated:
        rows.append(estimated)
    print(f"{args.url}, photo {args.photo}; warm figures are medians/percentiles of the service's own timing_ms, "
          f"req/s from curl's time_total (sequential); ms")
    for r in rows:
        if r["ran"] and r["ran"] != [r["backend"]]:
            print(f"note: backend {r['backend']} was served by {', '.join(r['ran'])}")
    print_table(rows, args.markdown)
    if estimated:
        print(f"{estimated['backend']}: no Edge TPU here; estimated from the model's structure, {estimated['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
