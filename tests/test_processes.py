"""Several worker processes on one port (app/processes), over a real socket: `python -m app` with
EDGETPU_SERVE_PROCESSES=2 and four TPUs of the libedgetpu TEST DOUBLE, in exclusive mode (a process that
opens a TPU another process holds is refused, as with a claimed USB Accelerator, and the double logs
which process opened and closed which TPU), and `gunicorn -c python:app.gunicorn_conf` on the CPU.

Which worker took a connection is read from Linux's /proc (the server side of the socket is in that
worker's file descriptors), so that each check is made against every worker."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.processes.arbiter import migrates_queued_connections
from bench.service import free_port
from tests.conftest import DEFAULT_MODEL, Service, live_children
from tests.doubles.edgetpu_models import plain_as_compiled
from tests.doubles.libedgetpu import DEVICES, EXCLUSIVE, LOG, PluggedTpus, libedgetpu_double, pci_tpu  # noqa: F401
from tests.test_metrics import assert_documented
from tests.test_http_server import closed_by_server, read_response
from tests.waiting import until

TPUS = 4
WAIT_S = 60  # a worker's restart, a reload, on a loaded 2-core machine
POLL_S = 0.1


# ---- which worker took a connection --------------------------------------------------------------

def _tcp_inode(server_port: int, client_port: int) -> int | None:
    """The inode of the server side of the loopback connection between these ports (/proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], int(fields[9])
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port and inode:
            return inode
    return None


def worker_of(s: socket.socket, pids: list[int], timeout_s: float = 10) -> int:
    """The pid, among `pids`, of the worker that accepted this client socket's connection."""
    server_port, client_port = s.getpeername()[1], s.getsockname()[1]

    def accepted_by() -> int | None:  # None while in the listen queue still: not accepted yet
        inode = _tcp_inode(server_port, client_port)
        if inode is None:
            return None
        target = f"socket:[{inode}]"
        for pid in pids:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
                except OSError:
                    pass
        return None

    return until(accepted_by, timeout_s, f"a worker among {pids} accepting the connection from port {client_port}",
                 poll_s=0.01)


def workers(service: Service) -> list[int]:
    return sorted(int(entry.split()[0]) for entry in live_children(service.process.pid))


def ready_workers(service: Service) -> dict[int, dict]:
    """slot -> that worker's own view, from /readyz (every worker answering)."""

    def all_ready() -> dict[int, dict] | None:
        try:
            answer = httpx.get(f"{service.url}/readyz", timeout=10).json()
        except httpx.HTTPError:
            return None
        if answer["ready"] and all(w["answering"] and w["ready"] for w in answer["workers"]):
            return {w["slot"]: w for w in answer["workers"]}
        return None

    try:
        return until(all_ready, WAIT_S, "every worker answering ready", POLL_S)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{service.output()[-3000:]}") from None


def opened_by(log: Path) -> list[tuple[str, int, str]]:
    """(created | destroyed | busy, pid, device path) in the double's order."""
    events = []
    for line in log.read_text().splitlines():
        what = line.split()[0]
        fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
        events.append((what, int(fields["pid"]), fields["path"]))
    return events


def never_two_processes_on_one_tpu(log: Path, killed: set[int] = frozenset()) -> None:
    """Replays the double's log: no TPU held by two processes at once (a killed one lets go when it dies:
    its next line is the replacement's), and no process refused for a TPU another one held."""
    held: dict[str, dict[int, int]] = {}
    for what, pid, path in opened_by(log):
        assert what != "busy", f"process {pid} was refused {path}: another process held it"
        holders = held.setdefault(path, {})
        if what == "created":
            for other in [p for p in holders if p != pid and p in killed]:
                del holders[other]
            holders[pid] = holders.get(pid, 0) + 1
            assert set(holders) == {pid}, f"{path} opened by {sorted(holders)} at once"
        else:
            holders[pid] -= 1
            if holders[pid] == 0:
                del holders[pid]


# ---- the group on four TPUs ----------------------------------------------------------------------

def on_tpus(root: Path, count: int, library: Path, processes: int, **settings: str) -> tuple[Service, list[Path]]:
    """`python -m app` with `processes` workers on `count` PCIe TPUs of the double (files standing for
    /dev/apex_N, which exclusive mode locks), the default model listed as compiled."""
    nodes = [root / f"apex_{i}" for i in range(count)]
    for node in nodes:
        node.write_bytes(b"")
    env = {"EDGETPU_SERVE_MODEL_DIR": str(plain_as_compiled(root / "models")), "EDGETPU_SERVE_BACKENDS": "edgetpu",
           "EDGETPU_SERVE_PROCESSES": str(processes), "EDGETPU_SERVE_EDGETPU_LIBRARY": str(library),
           "EDGETPU_SERVE_EDGETPU_VERSION_CHECK": "warn", DEVICES: ",".join(f"pci:{node}" for node in nodes)}
    return Service({**env, **settings}), nodes


@pytest.fixture(scope="module")
def tpus(tmp_path_factory, libedgetpu_double):
    root = tmp_path_factory.mktemp("group")
    log = root / "delegates.log"
    service, nodes = on_tpus(root, TPUS, libedgetpu_double, 2, **{EXCLUSIVE: "1", LOG: str(log)})
    try:
        service.wait_ready()
        ready_workers(service)
        yield service, [str(n) for n in nodes], log
    finally:
        service.stop()


def test_each_worker_owns_its_share_of_the_tpus(tpus):
    service, nodes, log = tpus
    pids = workers(service)
    assert len(pids) == 2
    answer = httpx.get(f"{service.url}/v1/devices", timeout=10).json()
    devices = answer["backends"]["edgetpu"]["devices"]
    assert [d["path"] for d in devices] == nodes  # all four, each once
    assert all(d["health"] == "healthy" and len(d["interpreters"]) == 1 for d in devices)
    # slot 0 the first two TPUs, slot 1 the last two: contiguous shares, two each
    assert [d["worker"] for d in devices] == [0, 0, 1, 1]
    assert answer["workers"] == [{"slot": 0, "answering": True, "devices": nodes[:2]},
                                 {"slot": 1, "answering": True, "devices": nodes[2:]}]
    # the double: each TPU opened by one process, the two processes are the workers, two TPUs each
    created = [(pid, path) for what, pid, path in opened_by(log) if what == "created"]
    by_pid = {pid: sorted(path for p, path in created if p == pid) for pid, _ in created}
    assert sorted(by_pid) == pids and sorted(by_pid.values()) == [nodes[:2], nodes[2:]]
    never_two_processes_on_one_tpu(log)


def test_both_workers_answer(tpus, cat_png):
    service, _, _ = tpus
    pids = workers(service)
    answered = set()
    for _ in range(40):  # bounded: the kernel spreads new connections over the workers that accept
        with socket.create_connection(("127.0.0.1", service.port), timeout=10) as s:
            pid = worker_of(s, pids)
            body = cat_png.read_bytes()
            s.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                      b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            status, _, answer = read_response(s)
        assert status == 200 and answer["backend"] == "edgetpu", answer
        answered.add(pid)
        if answered == set(pids):
            break
    assert answered == set(pids)


def requests_counted(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("edgetpu_serve_requests_total{") and 'status="200"' in line)


def test_metrics_count_every_request_once_whichever_worker_answers(tpus, cat_png):
    service, _, _ = tpus
    pids = workers(service)
    before = requests_counted(httpx.get(f"{service.url}/metrics", timeout=10).text)
    served_by = []
    for _ in range(24):
        with socket.create_connection(("127.0.0.1", service.port), timeout=10) as s:
            served_by.append(worker_of(s, pids))
            body = cat_png.read_bytes()
            s.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                      b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            assert read_response(s)[0] == 200
    scraped_by = set()
    for _ in range(20):  # scraped from each worker: every one reports the same totals
        with socket.create_connection(("127.0.0.1", service.port), timeout=10) as s:
            pid = worker_of(s, pids)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            text = b""
            while chunk := s.recv(65536):
                text += chunk
        text = text.decode()
        assert requests_counted(text) - before == 24, text
        # the state of every worker, merged: four interpreters, four TPUs, two workers answering
        assert f'edgetpu_serve_pool_interpreters{{backend="edgetpu",model="{DEFAULT_MODEL}"}} 4.0' in text
        assert "edgetpu_serve_edgetpu_devices 4.0" in text and "edgetpu_serve_processes_answering 2.0" in text
        assert f'edgetpu_serve_model_ready{{model="{DEFAULT_MODEL}"}} 1.0' in text
        scraped_by.add(pid)
        if scraped_by == set(pids):
            break
    assert set(served_by) == set(pids) and scraped_by == set(pids)


class Load:
    """Clients that each send classify requests one after another, each on a new connection (so every
    worker gets some), until stopped; every answer's status or exception kept."""

    def __init__(self, url: str, image: bytes, clients: int = 3):
        self.url, self.image = url, image
        self.statuses: list[int] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        deadline = time.monotonic() + 3 * WAIT_S  # bounded whatever the test does
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                r = httpx.post(f"{self.url}/v1/classify", files={"image": self.image}, timeout=30)
                self.statuses.append(r.status_code)
            except httpx.HTTPError as e:
                self.failures.append(f"{type(e).__name__}: {e}")

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def test_a_reload_under_load_reaches_every_worker_and_fails_nothing(tpus, cat_png):
    service, _, log = tpus
    pids = workers(service)
    versions = {slot: w["versions"][DEFAULT_MODEL] for slot, w in ready_workers(service).items()}
    with Load(service.url, cat_png.read_bytes()) as load:
        answered(load, 10)  # under load
        # the admin route, taken by one worker: it answers once every worker has reloaded
        r = httpx.post(f"{service.url}/v1/models/{DEFAULT_MODEL}/reload", timeout=WAIT_S)
        assert r.status_code == 200, r.text
        after = {slot: w["versions"][DEFAULT_MODEL] for slot, w in ready_workers(service).items()}
        assert after == {slot: v + 1 for slot, v in versions.items()}
        # HUP to gunicorn's master: every worker reloads, in place
        os.kill(service.process.pid, signal.SIGHUP)
        until(lambda: {s: w["versions"][DEFAULT_MODEL] for s, w in ready_workers(service).items()} == {
            slot: v + 2 for slot, v in versions.items()}, WAIT_S, "HUP reaching every worker", POLL_S)
        answered(load, 10)  # served after the reloads too
    assert load.failures == [] and load.statuses and set(load.statuses) == {200}, (load.failures, set(load.statuses))
    assert workers(service) == pids  # the same processes: reloaded in place, nothing restarted
    never_two_processes_on_one_tpu(log)


def connections_of(pid: int, port: int, listening: bool = False) -> tuple[int, int]:
    """(requests the process has accepted on `port` and not closed, connections queued on its own listening
    socket there and not accepted yet), from /proc: its sockets' inodes, /proc/net/tcp's states and, for a
    listening socket, the length of its accept queue (rx_queue). `listening`: (its listening sockets there, 0)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    accepted = queued = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) != port or int(fields[9]) not in inodes:
            continue
        if fields[3] == "01":  # ESTABLISHED
            accepted += 1
        elif fields[3] == "0A":  # LISTEN: rx_queue is the accept queue
            queued += 1 if listening else int(fields[4].split(":")[1], 16)
    return (queued, 0) if listening else (accepted, queued)


def test_a_killed_worker_comes_back_with_its_tpus_and_fails_only_the_connections_it_held(tpus, cat_png):
    """SIGKILL fails what the worker held and nothing else: its requests in flight, and the connections the kernel
    had queued on its own listening socket (moved to the other worker instead where net.ipv4.tcp_migrate_req is
    1); nothing while its replacement loads and starts listening (a worker listens only once loaded).

    Made exact, so that a loaded machine changes nothing: the worker is stopped (SIGSTOP) at a moment it holds no
    request, and killed once each client's connection waits in its queue (each client has one at a time, so none
    can make another meanwhile): then exactly those connections fail."""
    service, nodes, log = tpus
    before = ready_workers(service)
    victim = before[1]["pid"]
    clients = 3
    with Load(service.url, cat_png.read_bytes(), clients) as load:
        answered(load, 10)  # under load
        for _ in range(200):  # bounded: the victim answers in milliseconds, and is caught between two requests
            os.kill(victim, signal.SIGSTOP)
            if connections_of(victim, service.port)[0] == 0:
                break
            os.kill(victim, signal.SIGCONT)
            time.sleep(0.01)
        else:
            raise AssertionError("the worker was never caught between two requests")
        try:
            until(lambda: connections_of(victim, service.port) == (0, clients), WAIT_S,
                  "every client's connection queued on the stopped worker's socket", POLL_S)
            failed_before = len(load.failures)
        finally:
            os.kill(victim, signal.SIGKILL)

        def replaced() -> dict[int, dict] | None:
            ready = ready_workers(service)
            return ready if ready[1]["pid"] not in (victim, None) else None
        now = until(replaced, WAIT_S, "the killed worker replaced", POLL_S)
        answered(load, 10)  # served by both again
    assert now[0]["pid"] == before[0]["pid"] and now[1]["pid"] not in (victim, None)
    devices = httpx.get(f"{service.url}/v1/devices", timeout=10).json()["workers"]
    assert devices[1] == {"slot": 1, "answering": True, "devices": nodes[2:]}  # its TPUs, taken up again
    # exactly the queued connections failed, at the kill; nothing before, nothing after, never an HTTP error
    assert failed_before == 0, load.failures
    assert len(load.failures) == (0 if migrates_queued_connections() == "1" else clients), load.failures
    assert set(load.statuses) == {200} and len(load.statuses) > 10
    never_two_processes_on_one_tpu(log, killed={victim})
    reopened = [pid for what, pid, path in opened_by(log) if what == "created" and path in nodes[2:]][-2:]
    assert reopened == [now[1]["pid"]] * 2


# ---- TPUs that come and go under a group -----------------------------------------------------------

def held_by_worker(service: Service) -> dict[int, list[str]]:
    """slot -> the names of the TPUs that worker serves on, from /v1/devices."""
    workers = httpx.get(f"{service.url}/v1/devices", timeout=10).json()["workers"]
    return {w["slot"]: [Path(path).name for path in w["devices"]] for w in workers}


def until_held(service: Service, condition, what: str) -> dict[int, list[str]]:
    """Poll /v1/devices until condition(held_by_worker) holds (bounded): a condition, not a time window."""
    seen = {}

    def holding() -> dict[int, list[str]] | None:
        seen["held"] = held = held_by_worker(service)
        return held if condition(held) else None

    try:
        return until(holding, WAIT_S, what, POLL_S)
    except AssertionError as e:
        raise AssertionError(f"{e}; held: {seen.get('held')}\n{service.output()[-3000:]}") from None


def answered(load: Load, more: int) -> None:
    """Wait until the load has had `more` answers since now (bounded)."""
    target = len(load.statuses) + len(load.failures) + more
    until(lambda: len(load.statuses) + len(load.failures) >= target, WAIT_S, f"{more} answers", POLL_S)


def test_tpus_unplugged_plugged_back_and_plugged_in_under_load_stay_one_process_each_and_even_out(
        tmp_path, libedgetpu_double, cat_png):
    """Two workers on four TPUs of the double, in exclusive mode, its list a file: under load one TPU of worker
    0 is unplugged (its requests go to its other TPU) and plugged back (worker 0, the one below its fair
    share, takes it again), then a fifth is plugged in (3 and 2). No request is lost, and the double's log
    shows no TPU ever opened by two processes; /v1/devices, /readyz and /metrics follow, each TPU once."""
    plugged = PluggedTpus(tmp_path, *(pci_tpu(tmp_path, i) for i in range(4)))
    log = tmp_path / "delegates.log"
    service = Service({
        "EDGETPU_SERVE_MODEL_DIR": str(plain_as_compiled(tmp_path / "models")), "EDGETPU_SERVE_PROCESSES": "2",
        "EDGETPU_SERVE_BACKENDS": "edgetpu,cpu", "EDGETPU_SERVE_EDGETPU_ON_FAILURE": "fallback",
        "EDGETPU_SERVE_EDGETPU_LIBRARY": str(libedgetpu_double), "EDGETPU_SERVE_EDGETPU_VERSION_CHECK": "warn",
        "EDGETPU_SERVE_EDGETPU_PROBE_INTERVAL_S": "0.2", EXCLUSIVE: "1", LOG: str(log), **plugged.env(),
    })
    try:
        service.wait_ready()
        ready_workers(service)
        assert held_by_worker(service) == {0: ["apex_0", "apex_1"], 1: ["apex_2", "apex_3"]}
        with Load(service.url, cat_png.read_bytes()) as load:
            answered(load, 10)
            plugged.unplug(pci_tpu(tmp_path, 1))
            until_held(service, lambda h: h == {0: ["apex_0"], 1: ["apex_2", "apex_3"]}, "apex_1 gone from worker 0")
            answered(load, 10)
            plugged.plug(pci_tpu(tmp_path, 1))
            until_held(service, lambda h: h == {0: ["apex_0", "apex_1"], 1: ["apex_2", "apex_3"]},
                       "apex_1 back with worker 0")
            answered(load, 10)
            plugged.plug(pci_tpu(tmp_path, 4))
            held = until_held(service, lambda h: sorted(map(len, h.values())) == [2, 3],
                              "the fifth TPU taken by one worker")
            answered(load, 10)
        ready = httpx.get(f"{service.url}/readyz", timeout=10).json()
        devices = httpx.get(f"{service.url}/v1/devices", timeout=10).json()
        metrics = httpx.get(f"{service.url}/metrics", timeout=10).text
    finally:
        output = service.stop()
    assert load.failures == [] and set(load.statuses) == {200}, (load.failures, Counter(load.statuses), output[-3000:])
    never_two_processes_on_one_tpu(log)
    assert sorted(sum(held.values(), [])) == [f"apex_{i}" for i in range(5)]
    # each TPU once, with the worker that serves on it; the probe's rounds merged
    report = devices["backends"]["edgetpu"]
    owners = {Path(d["path"]).name: d["worker"] for d in report["devices"]}
    assert owners == {tpu: slot for slot, tpus in held.items() for tpu in tpus}
    assert all(d["health"] == "healthy" and d["in_service"] for d in report["devices"])
    assert report["probe"]["in_service"] == 5 and report["probe"]["changes"]["left"] == 1
    assert report["probe"]["changes"]["joined"] == 4 + 1 + 1  # at start, apex_1 back, apex_4
    assert ready["ready"] and {w["slot"]: [Path(p).name for p in w["devices"]] for w in ready["workers"]} == held
    # the gauges summed (each TPU is one worker's) or the most (every worker lists them all); the probe's
    # counters one series per worker
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics) for s in family.samples}
    assert samples[("edgetpu_serve_edgetpu_devices", ())] == 5
    assert samples[("edgetpu_serve_edgetpu_devices_listed", ())] == 5
    changes = "edgetpu_serve_edgetpu_device_changes_total"
    joined = {slot: samples[(changes, (("change", "joined"), ("worker", str(slot))))] for slot in (0, 1)}
    assert sum(joined.values()) == 6 and joined[0] >= 3
    assert f'edgetpu_serve_pool_interpreters{{backend="edgetpu",model="{DEFAULT_MODEL}"}} 5.0' in metrics
    assert_documented(metrics)


# ---- the HTTP limits in every worker (CPU only: every worker serves) ----------------------------

DEADLINE_S = 1.0
CAP = 12  # the host's; each of the two workers holds half
INFERENCE_KEY, ADMIN_KEY = "inference-key-for-tests", "admin-key-for-tests"
GUNICORN = [sys.executable, "-m", "gunicorn", "-c", "python:app.gunicorn_conf", "--workers", "2",
            "--bind", "127.0.0.1:{port}", "app.main:app"]


@pytest.fixture(scope="module")
def cpu_group():
    port = free_port()
    service = Service({
        "EDGETPU_SERVE_MODELS": "fashion_mnist", "EDGETPU_SERVE_DEFAULT_MODEL": "fashion_mnist",
        "EDGETPU_SERVE_BACKENDS": "cpu", "EDGETPU_SERVE_HEADER_TIMEOUT_S": str(DEADLINE_S),
        "EDGETPU_SERVE_BODY_TIMEOUT_S": str(DEADLINE_S), "EDGETPU_SERVE_MAX_CONNECTIONS": str(CAP),
        "EDGETPU_SERVE_API_KEYS": INFERENCE_KEY, "EDGETPU_SERVE_ADMIN_KEYS": ADMIN_KEY,
    }, argv=[arg.format(port=port) for arg in GUNICORN], port=port)
    try:
        service.wait_ready()
        ready_workers(service)
        yield service
    finally:
        service.stop()


def each_worker(service: Service, check, attempts: int = 30) -> None:
    """Run check(socket) on new connections until each worker has passed it (bounded)."""
    pids = workers(service)
    passed = set()
    for _ in range(attempts):
        with socket.create_connection(("127.0.0.1", service.port), timeout=10) as s:
            pid = worker_of(s, pids)
            if pid not in passed:
                check(s)
                passed.add(pid)
        if passed == set(pids):
            return
    raise AssertionError(f"checked in workers {sorted(passed)} of {pids} only")


def test_the_head_cap_holds_in_every_worker(cpu_group):
    def bomb(s):
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bomb: " + b"a" * (1 << 20) + b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, headers, body = read_response(s)
        assert status == 431 and body == {"error": "request line and headers exceed 16384 bytes"}

    each_worker(cpu_group, bomb)


def test_the_read_deadlines_hold_in_every_worker(cpu_group):
    def trickled_head(s):
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        status, _, body = read_response(s)
        assert status == 408 and body == {"error": f"request headers not received within {DEADLINE_S:g} s"}
        assert closed_by_server(s, 3)

    def trickled_body(s):
        s.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nX-API-Key: " + INFERENCE_KEY.encode() +
                  b"\r\nContent-Type: image/png\r\nContent-Length: 5000\r\n\r\n\x89PNG")
        status, _, body = read_response(s)
        assert status == 408 and body == {"error": f"request body not received within {DEADLINE_S:g} s"}

    each_worker(cpu_group, trickled_head)
    each_worker(cpu_group, trickled_body)


def test_the_admin_key_is_checked_in_every_worker(cpu_group):
    def not_admin(s):
        s.sendall(b"POST /v1/models/fashion_mnist/reload HTTP/1.1\r\nHost: x\r\nX-API-Key: " +
                  INFERENCE_KEY.encode() + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        status, _, body = read_response(s)
        assert status == 403 and body == {"error": "this API key is not an admin key"}

    each_worker(cpu_group, not_admin)


def test_each_worker_holds_its_share_of_the_connection_cap(cpu_group):
    """12 for the host: each of the two workers refuses (503 at connect) beyond its 6."""
    pids = workers(cpu_group)
    held: dict[int, list[socket.socket]] = {pid: [] for pid in pids}
    refused: set[int] = set()
    try:
        for _ in range(3 * CAP):  # bounded; well within the head deadline
            s = socket.create_connection(("127.0.0.1", cpu_group.port), timeout=10)
            pid = worker_of(s, pids)
            if len(held[pid]) < CAP // 2:
                held[pid].append(s)
                continue
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = read_response(s)
            s.close()
            assert status == 503 and "too many open connections (the limit is 6)" in body["error"]
            refused.add(pid)
            if refused == set(pids):
                break
    finally:
        for sockets in held.values():
            for s in sockets:
                s.close()
    assert refused == set(pids)


def test_only_the_workers_listen_each_on_a_socket_of_its_own(cpu_group):
    """gunicorn's master holds the address without listening; each worker listens on its own socket, made once
    its models were loaded (the kernel spreads connections over them, and resets only a killed one's queue)."""
    assert connections_of(cpu_group.process.pid, cpu_group.port, listening=True) == (0, 0)
    assert [connections_of(pid, cpu_group.port, listening=True) for pid in workers(cpu_group)] == [(1, 0), (1, 0)]


def test_the_master_reserves_the_address_and_gunicorn_makes_no_listening_socket(monkeypatch):
    """Whatever the command line says (--reuse-port), gunicorn's own listening sockets, the master's at its start
    and each worker's at its fork (tests/test_gunicorn_worker.py names where it makes them), are never made."""
    from types import SimpleNamespace

    from gunicorn.config import Config

    from app.processes import arbiter

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # on_starting sets it for the workers; restored after
    cfg = Config()
    cfg.set("bind", ["127.0.0.1:0"])
    cfg.set("reuse_port", True)
    server = SimpleNamespace(cfg=cfg, log=SimpleNamespace(info=lambda *a: None), LISTENERS=[])
    arbiter.on_starting(server)
    try:
        assert cfg.reuse_port is False
        (reservation,) = server.LISTENERS
        assert reservation.guard.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 0
        assert str(reservation) == f"http://127.0.0.1:{cfg.address[0][1]} (each worker once its models are loaded)"
        (listener,) = arbiter.listeners(cfg)  # a worker's, once loaded: on the same port beside the reservation
        with listener:
            assert listener.getsockname() == reservation.getsockname()
            assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    finally:
        arbiter.on_exit(server)
    unix = Config()
    unix.set("bind", ["unix:/tmp/edgetpu-serve-test.sock"])
    with pytest.raises(RuntimeError, match="TCP addresses only"):
        arbiter.on_starting(SimpleNamespace(cfg=unix, log=server.log, LISTENERS=[]))


def test_cpu_only_serving_uses_every_worker(cpu_group):
    answer = httpx.get(f"{cpu_group.url}/readyz", timeout=10).json()
    assert answer["ready"] and [w["slot"] for w in answer["workers"]] == [0, 1]
    pool = re.search(r'edgetpu_serve_pool_interpreters\{backend="cpu",model="fashion_mnist"\} (\S+)',
                     httpx.get(f"{cpu_group.url}/metrics", headers={"X-API-Key": INFERENCE_KEY}, timeout=10).text)
    # WORKERS unset: the cores split among the workers, one interpreter each here (2 cores, 2 workers)
    assert pool and float(pool.group(1)) == 2 * max(1, (os.cpu_count() or 1) // 2)


# ---- how many processes, and what each one takes ---------------------------------------------------

def test_more_processes_than_tpus_with_fail_stop_the_start_saying_how_many_fit(tmp_path, libedgetpu_double):
    """EDGETPU_ON_FAILURE=fail: the worker left without a TPU stops the start, as one process without one does
    (with fallback it serves on the CPU until one is free: tests/test_edgetpu_claims.py)."""
    service, _ = on_tpus(tmp_path, 2, libedgetpu_double, 3)
    try:
        assert service.process.wait(WAIT_S) != 0
    finally:
        output = service.stop()
    assert ("edgetpu-serve: cannot start: none of the 2 Edge TPU(s) listed is this process's: 3 processes share 2 "
            "usable TPU(s); the others hold them, and a TPU is opened by one process only. Fix: at most 2 "
            "process(es)") in output, output


@pytest.mark.parametrize("tpus, segments, cores, expected", [
    (0, 1, 16, 1), (1, 1, 16, 1), (2, 1, 2, 2), (8, 1, 16, 8), (12, 1, 4, 4), (8, 3, 16, 2), (2, 3, 16, 1),
])
def test_auto_runs_one_process_per_tpu_or_per_pipeline_within_the_cores(tpus, segments, cores, expected):
    from app.processes import processes_for

    assert processes_for(tpus, segments, cores) == expected


def test_the_shares_split_the_tpus_into_contiguous_parts_each_once():
    from app.settings import DeviceShare

    for n_items in range(0, 13):
        for count in range(1, 6):
            items = list(range(n_items))
            parts = [DeviceShare(i, count).of(items) for i in range(count)]
            assert sum(parts, []) == items
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert [DeviceShare(i, 2).of(["a", "b", "c", "d"]) for i in range(2)] == [["a", "b"], ["c", "d"]]


def test_a_worker_takes_its_part_of_the_hosts_limits():
    from app.processes import Slot, process_settings
    from app.settings import Settings

    base = Settings(max_connections=256, max_body_bytes=4 << 20, max_body_bytes_in_flight=40 << 20)
    mine = process_settings(base, Slot(1, 4, Path("/nonexistent")))
    assert str(mine.device_share) == "1/4" and mine.device_claims_dir == Path("/nonexistent")
    assert mine.max_connections == 64
    assert mine.max_body_bytes_in_flight == 10 << 20
    assert mine.workers == max(1, (os.cpu_count() or 1) // 4)
    small = process_settings(Settings(max_body_bytes=20 << 20, max_body_bytes_in_flight=40 << 20),
                             Slot(0, 4, Path("/nonexistent")))
    assert small.max_body_bytes_in_flight == 40 << 20  # never less than one multipart body held twice
    assert process_settings(Settings(workers=3), Slot(0, 2, Path("/x"))).workers == 3  # as set


def test_readiness_of_the_group_is_degraded_where_a_worker_does_not_serve():
    from app.processes import views

    def worker(pid, state, error=None, version=1):
        return {"slot": 0, "pid": pid, "ready": state == "ready", "devices": [f"/dev/apex_{pid}"],
                "models": {"m": {"state": state, "error": error, "since": 10.0 + pid, "version": version}}}

    ready, models, each = views.readiness({0: worker(1, "ready"), 1: worker(2, "ready", version=2)})
    assert ready and models["m"] == {"state": "ready", "error": None, "since": 12.0}
    assert [(w["slot"], w["pid"], w["versions"], w["devices"]) for w in each] == [
        (0, 1, {"m": 1}, ["/dev/apex_1"]), (1, 2, {"m": 2}, ["/dev/apex_2"])]
    ready, models, each = views.readiness({0: worker(1, "ready"), 1: None})
    assert ready and models["m"]["state"] == "degraded"
    assert models["m"]["error"] == "worker 1: did not answer (gone, or starting)" and not each[1]["answering"]
    ready, models, _ = views.readiness({0: worker(1, "failed", "bad file"), 1: worker(2, "loading")})
    assert not ready and models["m"] == {"state": "failed", "error": "worker 0: failed: bad file; worker 1: loading",
                                         "since": 12.0}


def test_the_devices_of_the_group_show_each_tpu_once_with_the_worker_serving_on_it():
    from app.processes import views

    def report(serving, interpreters, rounds):
        devices = [{"path": p, "health": "healthy" if p in serving else "unused", "in_service": p in serving,
                    "interpreters": interpreters.get(p, [])} for p in ("/dev/apex_0", "/dev/apex_1", "/dev/apex_2")]
        probe = {"interval_s": 2.0, "running": True, "last_probe": f"2026-01-01T00:00:0{rounds}Z",
                 "in_service": len(serving), "waiting_for": [],
                 "probes": {"unchanged": rounds, "changed": 1, "failed": 0},
                 "changes": {"joined": len(serving), "left": 0}, "error": None}
        return {"backends": {"edgetpu": {"library": {"path": "x"}, "devices": devices, "probe": probe}}}

    # worker 0 lost apex_1 (an interpreter out of its pool still counted there); worker 1 serves on it now
    lost = {"model": "m", "healthy": False}
    first = report(["/dev/apex_0"], {"/dev/apex_0": [{"model": "m"}], "/dev/apex_1": [lost]}, 3)
    second = report(["/dev/apex_1"], {"/dev/apex_1": [{"model": "m"}]}, 4)
    merged, workers = views.devices({0: first, 1: second, 2: None})
    devices = merged["edgetpu"]["devices"]
    assert [(d["path"], d["worker"], d["health"]) for d in devices] == [
        ("/dev/apex_0", 0, "healthy"), ("/dev/apex_1", 1, "healthy"), ("/dev/apex_2", None, "unused")]
    assert devices[1]["interpreters"] == [lost, {"model": "m"}]  # every worker's, each said as it is
    assert workers == [{"slot": 0, "answering": True, "devices": ["/dev/apex_0"]},
                       {"slot": 1, "answering": True, "devices": ["/dev/apex_1"]},
                       {"slot": 2, "answering": False, "devices": []}]
    probe = merged["edgetpu"]["probe"]
    assert probe["in_service"] == 2 and probe["probes"]["unchanged"] == 7 and probe["last_probe"].endswith("04Z")


def test_the_state_gauges_of_the_workers_merge_by_their_rules(tmp_path):
    from app.metrics import group_exposition

    def family(name, merge, *samples):
        return {"name": name, "documentation": name, "type": "gauge", "merge": merge,
                "samples": [[name, labels, value] for labels, value in samples]}

    workers_state = {
        0: [family("x_busy", "sum", ({"model": "m"}, 2.0)), family("x_ready", "min", ({"model": "m"}, 1.0)),
            family("x_temp", "max", ({"device": "apex_0"}, 50.0)), family("x_rounds", "each", ({"result": "ok"}, 7.0))],
        2: [family("x_busy", "sum", ({"model": "m"}, 3.0)), family("x_ready", "min", ({"model": "m"}, 0.0)),
            family("x_temp", "max", ({"device": "apex_0"}, 52.5), ({"device": "apex_1"}, 40.0)),
            family("x_rounds", "each", ({"result": "ok"}, 2.0))],
    }
    text = group_exposition(tmp_path, workers_state, 3).decode()
    for line in ('x_busy{model="m"} 5.0', 'x_ready{model="m"} 0.0', 'x_temp{device="apex_0"} 52.5',
                 'x_temp{device="apex_1"} 40.0', 'x_rounds{result="ok",worker="0"} 7.0',
                 'x_rounds{result="ok",worker="2"} 2.0',
                 "edgetpu_serve_processes 3.0", "edgetpu_serve_processes_answering 2.0"):
        assert line in text.splitlines(), text


def test_auto_counts_the_tpus_in_a_child_process(tmp_path, libedgetpu_double, monkeypatch):
    from app.processes import inventory
    from app.settings import Settings

    nodes = [tmp_path / f"apex_{i}" for i in range(3)]
    for node in nodes:
        node.write_bytes(b"")
    monkeypatch.setenv(DEVICES, ",".join(f"pci:{node}" for node in nodes))
    monkeypatch.setenv("EDGETPU_SERVE_EDGETPU_LIBRARY", str(libedgetpu_double))
    monkeypatch.setenv("EDGETPU_SERVE_EDGETPU_VERSION_CHECK", "warn")
    monkeypatch.setenv("EDGETPU_SERVE_BACKENDS", "edgetpu,cpu")
    assert inventory.count() == inventory.Inventory(3, 1, None)  # listed in a child, none opened
    assert inventory.process_count(Settings()) == min(3, os.cpu_count() or 1)
    monkeypatch.setenv("EDGETPU_SERVE_EDGETPU_DEVICES", "pci:0")  # named: one process, nothing listed
    assert inventory.process_count(Settings()) == 1
    monkeypatch.setenv("EDGETPU_SERVE_BACKENDS", "cpu")
    assert inventory.process_count(Settings()) == 1 and inventory.process_count(Settings(processes=3)) == 3
    monkeypatch.setenv(DEVICES, "")
    monkeypatch.setenv("EDGETPU_SERVE_BACKENDS", "edgetpu")
    monkeypatch.delenv("EDGETPU_SERVE_EDGETPU_DEVICES")
    none = inventory.count()
    assert none.tpus == 0 and "no Edge TPU found" in none.error


def test_hup_reloads_a_single_process_in_place_too():
    """SIGHUP to `python -m app` alone reloads every model (it used to end the process)."""
    with Service({"EDGETPU_SERVE_MODELS": "fashion_mnist", "EDGETPU_SERVE_DEFAULT_MODEL": "fashion_mnist",
                  "EDGETPU_SERVE_BACKENDS": "cpu", "EDGETPU_SERVE_WORKERS": "1"}) as service:
        version = lambda: httpx.get(f"{service.url}/v1/models/fashion_mnist", timeout=10).json()["version"]  # noqa: E731
        assert version() == 1
        os.kill(service.process.pid, signal.SIGHUP)

        def reloaded() -> bool:
            assert service.process.poll() is None, service.output()[-2000:]
            return version() == 2
        until(reloaded, WAIT_S, "the reload SIGHUP asked for", POLL_S)
        assert "SIGHUP: reloading every model" in service.output()


def test_a_second_group_on_a_port_in_use_refuses(cpu_group):
    """Each worker listens with SO_REUSEPORT, which would let a second instance of the same user share the
    port: the master checks that nothing answers there first, and holds the address."""
    env = {**os.environ, "EDGETPU_SERVE_MODELS": "fashion_mnist", "EDGETPU_SERVE_DEFAULT_MODEL": "fashion_mnist",
           "EDGETPU_SERVE_BACKENDS": "cpu", "EDGETPU_SERVE_PROCESSES": "2", "EDGETPU_SERVE_PORT": str(cpu_group.port)}
    done = subprocess.run([sys.executable, "-m", "app"], env=env, capture_output=True, text=True, timeout=WAIT_S,
                          stdin=subprocess.DEVNULL)
    assert done.returncode != 0 and f"127.0.0.1:{cpu_group.port} is in use" in done.stderr, done.stderr


def test_gunicorn_kills_a_worker_only_after_its_drain_and_its_close():
    from app.processes.arbiter import options
    from app.settings import Settings

    settings = Settings(drain_timeout_s=10, close_timeout_s=7.5)
    assert options(settings, 2)["graceful_timeout"] == 18  # whole seconds, rounded up
