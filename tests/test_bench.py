"""The benchmark scripts run end to end, briefly, against a real service: they must not rot.

Timings belong to benchmarks, not tests, so no figure is compared with a threshold. What is
asserted is what any correct run satisfies and a broken script would not: every figure
present, parseable and positive, percentiles in order, orderings that hold request by request
(a request's inference is part of its total, which is part of what the client waited), no
errors, and no process of the script's left alive after it exits.
"""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, Service
from tests.waiting import until

BENCH = ROOT / "bench"
TIMEOUT_S = 300
PERCENTILES = (50, 90, 99)
SPEEDUP = re.compile(r"^(\d+\.\d\d)x$")

pytestmark = pytest.mark.slow


def session_members(sid: int) -> list[int]:
    """PIDs of the live processes in session `sid` (a zombie has exited: not counted)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited while we looked
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # after ")": state, ppid, pgrp, session
            members.append(int(stat.parent.name))
    return members


def run(*args: str) -> subprocess.CompletedProcess:
    """Run a bench script in a session of its own; after it exits, nothing it started may be left."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGETPU_SERVE_")}
    env["PYTHON"] = sys.executable  # curl_bench.sh's Python: the one running the tests, wherever its venv is
    process = subprocess.Popen(list(args), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    left = session_members(process.pid)
    if left:
        os.killpg(process.pid, signal.SIGKILL)  # not leaked by the test either
    assert not left, f"{args[1] if len(args) > 1 else args[0]} left processes alive: {left}"
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def markdown_rows(stdout: str) -> dict[str, dict[str, str]]:
    header, _, *rows = [line for line in stdout.splitlines() if line.startswith("|")]
    titles = [c.strip() for c in header.strip("|").split("|")]
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == len(titles), row
        table[cells[0]] = dict(zip(titles, cells))
    return table


def assert_sound_curl_row(row: dict[str, str]) -> None:
    """One backend's row of curl_bench.sh: what every correct run satisfies."""
    assert row["errors"] == "0", row
    ms = {title: float(value) for title, value in row.items()
          if title not in ("backend", "errors", "infer speed-up vs cpu")}  # "-" (no figure) fails here
    assert all(value > 0 for value in ms.values()), row
    for stage in ("infer", "total"):
        assert ms[f"{stage} p50"] <= ms[f"{stage} p90"] <= ms[f"{stage} p99"], row
    for p in PERCENTILES:  # request by request inference <= total, so every percentile too
        assert ms[f"infer p{p}"] <= ms[f"total p{p}"], row
    assert ms["cold infer ms"] <= ms["cold total ms"], row
    speedup = SPEEDUP.match(row["infer speed-up vs cpu"])
    assert speedup and float(speedup.group(1)) > 0, row


@pytest.fixture(scope="module")
def bench_service():
    """A service of its own: curl_bench.sh reloads the model, which makes the next request cold."""
    with Service({"EDGETPU_SERVE_WORKERS": "1"}) as service:
        yield service


def test_curl_bench_prints_cold_and_warm_figures_against_a_running_service(bench_service):
    done = run("bash", str(BENCH / "curl_bench.sh"), "--url", bench_service.url, "--backends", "cpu",
               "-n", "5", "--markdown")
    assert done.returncode == 0, done.stderr
    table = markdown_rows(done.stdout)
    estimated = [name for name in table if name.startswith("estimated Edge TPU")]
    assert [name for name in table if name not in estimated] == ["cpu"]
    # no Edge TPU here: the model's edgetpu_estimate is shown beside the CPU row, labelled as an estimate
    assert estimated == ["estimated Edge TPU (USB 3, not measured)"] and float(table[estimated[0]]["infer p50"]) > 0
    assert_sound_curl_row(table["cpu"])
    assert "served by" not in done.stdout  # the backend asked for is the one that ran
    assert bench_service.process.poll() is None  # a service it did not start, it leaves running


def test_curl_bench_times_a_detector_through_its_detection_route(bench_service):
    """The person detector served beside the classifiers: curl_bench.sh asks it through /detect (its task, from
    /v1/models), with its default photo of two people."""
    done = run("bash", str(BENCH / "curl_bench.sh"), "--url", bench_service.url, "--backends", "cpu",
               "--model", "ssdlite_mobilenet_v2_person", "-n", "5", "--markdown")
    assert done.returncode == 0, done.stderr
    assert "photo basketball1.png" in done.stdout
    table = markdown_rows(done.stdout)
    assert_sound_curl_row(table["cpu"])
    assert float(table["estimated Edge TPU (USB 3, not measured)"]["infer p50"]) > 0


def test_curl_bench_starts_and_stops_its_own_service_for_cpu_and_emulated():
    done = run("bash", str(BENCH / "curl_bench.sh"), "--start", "--backends", "cpu,emulated", "-n", "3", "--markdown")
    assert done.returncode == 0, done.stderr
    table = markdown_rows(done.stdout)
    assert set(table) == {"cpu", "emulated", "estimated Edge TPU (USB 3, not measured)"}
    for name, row in table.items():
        if not name.startswith("estimated"):
            assert_sound_curl_row(row)
    assert "served by" not in done.stdout  # each backend ran as asked, no fallback
    # run() has checked that the service it started is gone


def test_curl_bench_stops_its_service_when_interrupted():
    """SIGTERM mid-run (Ctrl-C, a CI timeout): the service it started goes with it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGETPU_SERVE_")} | {"PYTHON": sys.executable}
    script = subprocess.Popen(["bash", str(BENCH / "curl_bench.sh"), "--start", "-n", "100000"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in script.stderr:  # the script says when the warm requests start
            if "warm requests" in line:
                break
        assert script.poll() is None, "curl_bench.sh ended before its requests started"
        script.terminate()
        script.wait(60)
        # the service is stopped before the script exits; allow a slow reap
        left = lambda: [pid for pid in session_members(script.pid) if pid != script.pid]  # noqa: E731
        until(lambda: not left(), 30, "no process left after curl_bench.sh was terminated", poll_s=0.2)
    finally:
        if script.poll() is None:
            script.kill()
        try:
            os.killpg(script.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        script.wait()


def test_curl_bench_refuses_a_service_that_is_not_there():
    done = run("bash", str(BENCH / "curl_bench.sh"), "--url", "http://127.0.0.1:9", "-n", "1")
    assert done.returncode == 1 and "no service answering" in done.stderr


def test_the_launcher_runs_a_command_while_the_service_is_up_and_passes_its_exit_code():
    """bench/service.py's command-line form (curl_bench.sh --start uses it): {url} names the service."""
    check = ("import sys, urllib.request; "
             "sys.exit(3 if urllib.request.urlopen('{url}/readyz').status == 200 else 1)")
    done = run(sys.executable, str(BENCH / "service.py"), "--only-these", "--set", "EDGETPU_SERVE_BACKENDS=cpu",
               "--", sys.executable, "-c", check)
    assert done.returncode == 3, done.stderr  # the command's own code; run() has checked nothing is left


def test_the_launcher_reports_a_service_that_does_not_start():
    done = run(sys.executable, str(BENCH / "service.py"), "--only-these", "--set", "EDGETPU_SERVE_BACKENDS=nonsense",
               "--", sys.executable, "-c", "raise SystemExit(0)")
    assert done.returncode == 1 and "service exited" in done.stderr and "nonsense" in done.stderr, done.stderr


def test_service_overhead_measures_both_sides():
    done = run(sys.executable, str(BENCH / "service_overhead.py"), "-n", "20", "--warmup", "2", "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["errors"] == 0 and figures["requests"] == 20
    ms = figures["ms"]
    assert set(ms) >= {"raw invoke", "HTTP end to end", "service decode", "service preprocess",
                       "service inference", "service postprocess", "service total"}
    for name, row in ms.items():
        assert 0 < row["p50"] <= row["p90"] <= row["p99"], (name, row)
    for p in PERCENTILES:  # request by request: the client waited for the service's total, which includes inference
        key = f"p{p}"
        assert ms["HTTP end to end"][key] >= ms["service total"][key] >= ms["service inference"][key], (key, ms)
    # the raw side really invoked the model: an HTTP request does that and more
    assert ms["HTTP end to end"]["p50"] > ms["raw invoke"]["p50"] > 0
    assert figures["image_work_p50_ms"] > 0 and figures["overhead_p50_ms"] > 0


def test_load_sweep_reports_service_and_raw_throughput():
    duration_s, levels, workers = 1.0, (1, 2), 1
    done = run(sys.executable, str(BENCH / "load.py"), "--concurrency", ",".join(map(str, levels)),
               "--duration", str(duration_s), "--rounds", "2", "--workers", str(workers), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert [r["concurrency"] for r in rows] == list(levels)
    for r in rows:
        assert r["service"]["errors"] == 0
        in_flight = {"service": r["concurrency"], "pipeline": r["concurrency"],
                     "invoke": min(r["concurrency"], workers)}
        for side, concurrent in in_flight.items():
            s = r[side]
            assert s["requests"] > 0 and s["rps"] > 0 and 0 < s["p50"] <= s["p99"], (side, s)
            # at least half the requests took the median or longer, `concurrent` at a time, within the
            # duration (plus one overrunning request per thread per round): a throughput that breaks this
            # was not measured over the time it claims
            assert s["rps"] * s["p50"] / 1000 <= 2 * concurrent * 1.5, (side, s)


OVERLOAD_ROW = re.compile(r"^\| (?P<name>[^|]+?) \| (?P<n>\d+) \| (?P<p50>[^|]+) \| (?P<p99>[^|]+) \|$")
OVERLOAD_TAIL = re.compile(r"^other statuses: (?P<others>.+); transport errors: (?P<errors>.+); "
                           r"admitted p99 / unloaded p99 = (?P<ratio>\d+\.\d)x$", re.M)
OVERLOAD_CPU = re.compile(r"^CPU during the overload phase: service (?P<service>\d+\.\d\d) s, load generator "
                          r"\((?P<client>\w+)\) (?P<generator>\d+\.\d\d) s, of (?P<available>\d+\.\d\d) s ", re.M)


@pytest.mark.parametrize("client", ["curl", "python"])
def test_hostile_overload_answers_every_request_with_200_or_503(client):
    """5x overload of a service that admits 2 (1 interpreter + MAX_WAITING 1): 10 clients, 2 requests each."""
    admitted, factor, per_client, unloaded = 2, 5, 2, 10
    done = run(sys.executable, str(BENCH / "hostile.py"), "--only", "overload", "--overload-client", client,
               "--workers", "1", "--max-waiting", str(admitted - 1), "--overload-factor", str(factor),
               "--overload-requests", str(per_client), "--unloaded-requests", str(unloaded))
    assert done.returncode == 0, done.stderr
    assert f"{admitted * factor} concurrent clients ({factor}x the {admitted} the service admits" in done.stdout
    rows = {}
    for line in done.stdout.splitlines():
        if (row := OVERLOAD_ROW.match(line)) and row["name"] != "":
            rows[row["name"]] = (int(row["n"]), float(row["p50"]), float(row["p99"]))  # "nan" parses, fails below
    # every request answered: the unloaded ones all 200, the overloaded ones 200 or 503, nothing else
    assert rows["unloaded 200 (1 client)"][0] == unloaded, done.stdout
    assert rows["overload 200"][0] + rows["overload 503"][0] == admitted * factor * per_client, done.stdout
    tail = OVERLOAD_TAIL.search(done.stdout)
    assert tail and tail["others"] == "none" and tail["errors"] == "none", done.stdout
    # overloaded 5x, the service both served and refused; every 503 has its reason, the reasons add up
    assert rows["overload 200"][0] > 0 and rows["overload 503"][0] > 0, done.stdout
    reasons = {name: row for name, row in rows.items() if name.startswith("503 ")}
    assert reasons and sum(n for n, _, _ in reasons.values()) == rows["overload 503"][0], done.stdout
    assert all("?" not in name and "unreadable" not in name for name in reasons), reasons
    for name, (n, p50, p99) in rows.items():
        assert 0 < p50 <= p99, (name, done.stdout)
    assert float(tail["ratio"]) > 0
    cpu = OVERLOAD_CPU.search(done.stdout)
    assert cpu and cpu["client"] == client, done.stdout
    # the service did the overload phase's work; the whole run cannot have used more than the cores had
    assert 0 < float(cpu["service"]) and 0 <= float(cpu["generator"]), done.stdout
    assert float(cpu["service"]) + float(cpu["generator"]) <= float(cpu["available"]) + 0.05, done.stdout


OPEN_LOOP_HEAD = re.compile(r"^## overload, open loop: requests arriving at (?P<rate>\d+)/s \(5x the ~(?P<capacity>\d+)/s "
                            r"1 interpreters serve at the unloaded p50\), each on a new connection, (?P<n>\d+) in ",
                            re.M)


def test_hostile_open_loop_overload_answers_every_arrival_with_200_or_503():
    """Arrivals at 5x what one interpreter serves, for 1 s, by h2load: every one answered, 200 or 503."""
    done = run(sys.executable, str(BENCH / "hostile.py"), "--only", "overload", "--overload-client", "h2load",
               "--workers", "1", "--max-waiting", "1", "--overload-factor", "5", "--overload-seconds", "1",
               "--unloaded-requests", "10")
    assert done.returncode == 0, done.stderr
    head = OPEN_LOOP_HEAD.search(done.stdout)
    assert head, done.stdout
    rows = {row["name"]: (int(row["n"]), float(row["p50"]), float(row["p99"]))
            for line in done.stdout.splitlines() if (row := OVERLOAD_ROW.match(line)) and row["name"] != ""}
    assert rows["unloaded 200 (1 client)"][0] == 10, done.stdout
    # every arrival answered: 200 or 503, nothing else, no transport error
    assert rows["overload 200"][0] + rows["overload 503"][0] == int(head["n"]), done.stdout
    assert rows["overload 200"][0] > 0 and rows["overload 503"][0] > 0, done.stdout
    tail = OVERLOAD_TAIL.search(done.stdout)
    assert tail and tail["others"] == "none" and tail["errors"] == "none", done.stdout
    for name, (n, p50, p99) in rows.items():
        assert 0 < p50 <= p99, (name, done.stdout)
    cpu = OVERLOAD_CPU.search(done.stdout)
    assert cpu and cpu["client"] == "h2load" and float(cpu["service"]) > 0, done.stdout
