"""Format curl_bench.sh's results: one row per backend, from the service's own timing fields,
and a PNG chart beside the table: each backend's warm latency by stage as a stacked bar.

Input lines: backend <TAB> curl time_total (s) <TAB> HTTP status <TAB> response JSON.
A request is cold when the service says so (`"cold": true`): after a reload, each of a
pool's interpreters pays its first inference once, so there may be several cold ones.

The table and the chart take a list of rows: a caller may append a labelled row of its own
(an estimate, say) with any of the same keys; a figure it lacks prints as "-" and charts as 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.charts import CHART_DIR, STAGES  # noqa: E402
from bench.common import load_average  # noqa: E402
from bench.stats import median, percentile_or_none, ratio  # noqa: E402

PERCENTILES = (50, 90, 99)
BASELINE = "cpu"


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
            # each stage's own median over the warm requests (what the chart stacks)
            "stages_ms": {s: median(r["timing_ms"][s] for r in row["warm"]) for s in STAGES} if row["warm"] else {},
        }
        for p in PERCENTILES:
            summary[f"inference_p{p}"] = percentile_or_none(warm_inference, p)
            summary[f"total_p{p}"] = percentile_or_none(warm_total, p)
        rows.append(summary)
    base = next((r for r in rows if r["backend"] == BASELINE and r["inference_p50"]), None)
    for r in rows:
        r["speedup"] = ratio(base["inference_p50"], r["inference_p50"]) if base else None
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
    value = row.get(key)
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


def write_chart(rows, path: Path, caption: str) -> Path | None:
    """The rows' warm stages as stacked bars in a PNG at `path`; None (and why, on stderr) without
    matplotlib or without a row that has stages."""
    from bench import charts

    if not charts.available():
        print("no chart: matplotlib is not installed (pip install -e '.[dev]')", file=sys.stderr)
        return None
    drawn = [{"label": r["backend"], "stages_ms": r["stages_ms"]} for r in rows if r.get("stages_ms")]
    if not drawn:
        print("no chart: no warm request answered", file=sys.stderr)
        return None
    return charts.stage_bars(drawn, path, caption)


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
    parser.add_argument("--chart", type=Path, default=CHART_DIR / "curl_bench.png",
                        help="write the stage chart (PNG) here (default: build/bench/curl_bench.png); '' for none")
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
          f"req/s from curl's time_total (sequential); ms; load average {load_average()}")
    for r in rows:
        if r["ran"] and r["ran"] != [r["backend"]]:
            print(f"note: backend {r['backend']} was served by {', '.join(r['ran'])}")
    print_table(rows, args.markdown)
    if estimated:
        print(f"{estimated['backend']}: no Edge TPU here; estimated from the model's structure, {estimated['note']}")
    if str(args.chart) not in ("", "."):
        where = "" if "127.0.0.1" in args.url or "localhost" in args.url else f"{args.url}, "
        caption = (f"curl_bench: where a request's time goes, by backend ({where}photo {args.photo or '?'}, "
                   f"{max(r.get('warm') or 0 for r in rows)} warm requests each; load average {load_average()})")
        if (written := write_chart(rows, args.chart, caption)) is not None:
            print(f"\nchart: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
