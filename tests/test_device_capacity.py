"""bench/device_capacity.py runs end to end, briefly: it must not rot, and its figures must be
consistent with what they claim to measure (properties, not timings: those belong to the bench)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from PIL import Image

from bench.charts import utilisation_chart_size
from tests.conftest import ROOT

TIMEOUT_S = 240
DEVICE_MS = 5.0


@pytest.mark.slow
def test_device_capacity_measures_the_simulated_device_and_the_stages(tmp_path):
    assert shutil.which("wrk"), "the benchmark's load generator is Debian's wrk: make test installs it (tests/debian-packages.txt)"
    out = tmp_path / "figures.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGETPU_SERVE_", "BENCH_"))}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "device_capacity.py"), "--device-ms", str(DEVICE_MS),
                           "--devices", "1", "--concurrency", "1,4", "--duration", "1", "--inputs", "224",
                           "--floor", "--rounds", "1", "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| 224x224 JPEG | 4 |" in done.stdout and "total server CPU" in done.stdout
    figures = json.loads(out.read_text())
    for point in figures["points"]:
        assert point["errors"] == 0 and point["requests"] > 0
        # one device of 5 ms cannot answer faster than 200/s, nor a request faster than 5 ms
        assert 0 < point["device_busy"] <= 1.05
        assert point["p99_ms"] >= point["p50_ms"] >= DEVICE_MS
        cpu = point["cpu_ms_per_request"]
        assert cpu["event loop"] > 0  # the threads were named and found
        if "JPEG" in point["input"] and not point["run"].startswith("floor"):
            assert cpu["image"] > 0  # the raw tensor through /v2 has no image work, the floor no image thread
    floor = [p for p in figures["points"] if p["run"].startswith("floor")]
    # the floor serves the JPEG at each concurrency, one request at a time: never above the device's rate
    assert [p["concurrency"] for p in floor] == [1, 4] and all(p["req_s"] <= 1000 / DEVICE_MS * 1.05 for p in floor)
    (bound,) = figures["bounds"]
    assert 0 < bound["req_s"] <= 1000 / DEVICE_MS * 1.05
    (stages,) = figures["stages"]
    ms = stages["stages_ms"]
    for stage in ("decode", "resize", "HTTP, framework, event loop", "post-processing", "response serialization"):
        assert ms[stage] > 0, stage
    assert stages["total_ms"] >= ms["decode"] + ms["resize"]
    # the service has /v2: the raw-tensor row joins
    assert any("v2" in p["input"] for p in figures["points"]), done.stdout
    # beside the --json file, the chart: one panel per table (the service, the floor)
    chart = out.with_suffix(".png")
    assert f"chart: {chart}" in done.stdout
    with Image.open(chart) as image:
        assert image.format == "PNG" and image.size == utilisation_chart_size(2)
        assert len(image.convert("RGB").getcolors(1 << 20)) > 50  # lines and text, not a blank canvas


@pytest.mark.slow
def test_device_capacity_has_a_detection_row(tmp_path):
    """--model of a detector: a 640x480 frame to /v1/detect and as DeepStack's multipart, the simulated device
    answering with that frame's real outputs, the stages of both (post-processing: boxes to the frame's pixels)."""
    out = tmp_path / "figures.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGETPU_SERVE_", "BENCH_"))}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "device_capacity.py"), "--model",
                           "ssdlite_mobilenet_v2_person", "--device-ms", "7", "--devices", "1", "--concurrency", "4",
                           "--duration", "1", "--rounds", "1", "--json", str(out), "--chart", ""], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    assert [p["input"] for p in figures["points"]] == ["640x480 JPEG, /v1/detect", "640x480 JPEG, DeepStack, multipart"]
    for point in figures["points"]:
        assert point["errors"] == 0 and point["requests"] > 0 and 0 < point["device_busy"] <= 1.05
        assert point["p99_ms"] >= point["p50_ms"] >= 7
    assert len(figures["bounds"]) == 2 and all(0 < b["req_s"] <= 1000 / 7 * 1.05 for b in figures["bounds"])
    for stages in figures["stages"]:
        ms = stages["stages_ms"]
        for stage in ("decode", "resize", "quantize", "post-processing", "response serialization", "body read"):
            assert ms[stage] > 0, (stages["input"], stage)
    assert "v2" not in done.stdout  # no raw-tensor row: it ranks a classifier's scores


def test_idle_penalty_times_the_same_work_after_each_sleep_length():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "idle_penalty.py"), "-n", "3", "--rounds", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["0", "0.5", "2", "4", "10"]
    assert rows[0].count("(1.0x)") == 2  # back to back is the reference for both columns


def test_only_2xx_answers_are_served_and_count_toward_device_busy():
    from bench.device_capacity import wrk_figures

    # wrk's summary: 1,000 answers in 1 s, 600 of them 503 (a status error to wrk), 3 broken connections
    figures = wrk_figures({"requests": 1000, "us": 1_000_000, "p50": 2000, "p99": 9000, "status": 600,
                           "connect": 0, "read": 3, "write": 0, "timeout": 0})
    assert figures["req_s"] == 400 and figures["requests"] == 400
    assert figures["shed"] == 600 and figures["shed_s"] == 600 and figures["errors"] == 3


@pytest.mark.slow
def test_several_processes_on_one_port_and_shed_requests_apart(tmp_path):
    """--processes 2 --devices 2: two workers, one device each. With no waiting line (MAX_WAITING=0) and 16
    connections, most answers are 503s: shed, reported apart, and never counted as served or busy."""
    out = tmp_path / "figures.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGETPU_SERVE_", "BENCH_"))}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "device_capacity.py"), "--device-ms", str(DEVICE_MS),
                           "--devices", "2", "--processes", "2", "--concurrency", "16", "--duration", "1",
                           "--inputs", "224", "--no-stages", "--variant", "MAX_WAITING=0", "--json", str(out),
                           "--chart", ""], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 processes on one port (1 each)" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["points"] and all(p["processes"] == 2 and p["devices"] == 2 for p in figures["points"])
    for point in figures["points"]:
        # two devices of 5 ms serve at most 400/s: whatever was shed, busy stays within what they can do
        assert point["shed"] > 0 and point["requests"] > 0 and point["errors"] == 0
        assert 0 < point["device_busy"] <= 1.05 and point["req_s"] <= 2 * 1000 / DEVICE_MS * 1.05
        assert point["cpu_ms_per_request_total"] > 0  # every process's threads counted
