"""The benchmark scripts run end to end, briefly, against a real service: they must not rot.

Figures are not asserted (timings belong to benchmarks, not tests); what is asserted is
that each script measures what it says, with no errors, and prints its table.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, Service

BENCH = ROOT / "bench"
TIMEOUT_S = 180


def run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGETPU_SERVE_")}
    env["PYTHON"] = sys.executable  # curl_bench.sh's Python: the one running the tests, wherever its venv is
    return subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)


@pytest.fixture(scope="module")
def bench_service():
    """A service of its own: curl_bench.sh reloads the model, which makes the next request cold."""
    service = Service({"EDGETPU_SERVE_WORKERS": "1"})
    service.wait_ready()
    yield service
    service.stop()


def test_curl_bench_prints_cold_and_warm_per_backend(bench_service):
    done = run("bash", str(BENCH / "curl_bench.sh"), "--url", bench_service.url, "--backends", "cpu",
               "-n", "5", "--markdown")
    assert done.returncode == 0, done.stderr
    header, rule, row = [line for line in done.stdout.splitlines() if line.startswith("|")]
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert cells["backend"] == "cpu" and cells["errors"] == "0"
    # the first request after the reload paid the interpreter's first inference
    assert float(cells["cold infer ms"]) > 0 and float(cells["infer p50"]) > 0
    assert cells["infer speed-up vs cpu"] == "1.00x"


def test_curl_bench_starts_its_own_service_for_cpu_and_emulated():
    done = run("bash", str(BENCH / "curl_bench.sh"), "--start", "--backends", "cpu,emulated", "-n", "3", "--markdown")
    assert done.returncode == 0, done.stderr
    header, _, *rows = [line for line in done.stdout.splitlines() if line.startswith("|")]
    titles = [c.strip() for c in header.strip("|").split("|")]
    table = {cells[0]: dict(zip(titles, cells)) for cells in
             ([c.strip() for c in row.strip("|").split("|")] for row in rows)}
    assert set(table) == {"cpu", "emulated"}
    assert all(row["errors"] == "0" and float(row["cold infer ms"]) > 0 for row in table.values())
    assert table["emulated"]["infer speed-up vs cpu"].endswith("x")
    assert "served by" not in done.stdout  # each backend ran as asked, no fallback


def test_curl_bench_refuses_a_service_that_is_not_there():
    done = run("bash", str(BENCH / "curl_bench.sh"), "--url", "http://127.0.0.1:9", "-n", "1")
    assert done.returncode == 1 and "no service answering" in done.stderr


def test_service_overhead_measures_both_sides():
    done = run(sys.executable, str(BENCH / "service_overhead.py"), "-n", "20", "--warmup", "2", "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["errors"] == 0 and figures["requests"] == 20
    ms = figures["ms"]
    assert ms["HTTP end to end"]["p50"] > ms["raw invoke"]["p50"] > 0
    assert figures["overhead_p50_ms"] == pytest.approx(ms["HTTP end to end"]["p50"] - ms["raw invoke"]["p50"])


def test_load_sweep_reports_service_and_raw_throughput():
    done = run(sys.executable, str(BENCH / "load.py"), "--concurrency", "1,2", "--duration", "1", "--rounds", "2",
               "--workers", "1", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    for r in rows:
        assert r["service"]["errors"] == 0
        for side in ("service", "pipeline", "invoke"):
            assert r[side]["requests"] > 0 and r[side]["rps"] > 0
