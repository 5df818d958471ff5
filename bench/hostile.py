"""Hostile clients against the real service (python -m app, loopback): the figures of issue 13.

  header bombs   1 MiB header, 64 MiB header, 4000 small headers, 8 bombs at once: time to the
                 431 and RSS, while another client's /healthz latency is measured beside them
  slow clients   N connections that send half a head or half a body and stall: when each is
                 dropped (408) and the p50/p99 of normal classify requests beside them
  large bodies   N concurrent 14-18 MB JPEGs: statuses, peak RSS (VmHWM) and RSS after the
                 burst, against MAX_BODY_BYTES_IN_FLIGHT; once with the default budget and
                 once with the budget out of the way (side by side, same run)
  base64 bodies  DOODS' POST /detect with 26 MB of base64 that decodes to no image (MAX_BODY_BYTES' worth), one
                 after another, then N at once: statuses, peak RSS (VmHWM, from the phase's start) and RSS
                 after, against idle + MAX_BODY_BYTES_IN_FLIGHT
  images         decode time and peak RSS of the largest images each format may be
  cost           what the protocol subclass costs per request against plain uvicorn + httptools
  overload       10x more concurrent clients than the service admits (workers + MAX_WAITING),
                 each a new connection per request: 503 latency (by reason), admitted latency
                 vs the unloaded p99, and the CPU the service and the load generator each used
  zmq            Frigate's ZMQ door (issue 42, bench/zmq_attacks.py): eleven attacks on a loopback
                 endpoint (a message of 300,000 frames, stalled 64 MiB frames, a deep header, slow
                 greetings, idle connections, ...), each with a good Frigate client's p50/p99 alone,
                 during and after, and the service's RSS before, at its peak and after; --zmq-design
                 a,b runs libzmq's design beside the door's own

The overload clients are curl --parallel processes (C), so that no Python event loop of ours
stands between the service's answer and the figure; the CPU the service and the load generator
each used is printed beside the figures (`--overload-client python` runs the asyncio client it
replaced, for comparison). The other scenarios' clients are raw asyncio sockets (few connections,
or connections that mostly wait). Every loop is bounded in count and time; the service is stopped
at the end.

Example usage:
    python bench/hostile.py                 # all eight
    python bench/hostile.py --only base64 --base64-bodies 16
    python bench/hostile.py --only bombs,slow --slow-clients 200
    python bench/hostile.py --only overload --overload-client python   # the old client, side by side
    python bench/hostile.py --only zmq --zmq-design a,b --zmq-seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024

sys.path.insert(0, str(ROOT))

from bench.service import ServiceProcess, free_port  # noqa: E402
from bench.stats import median, percentile, ratio  # noqa: E402


PLAIN_UVICORN = ("import sys, uvicorn; from app.main import create_app; from app.settings import Settings; "
                 "uvicorn.run(create_app(Settings()), host='127.0.0.1', port=int(sys.argv[1]), http='httptools', "
                 "log_level='warning', access_log=False)")


class Service(ServiceProcess):
    """python -m app (our server), or with plain=True uvicorn with its own protocol on the same app (the baseline),
    through the shared launcher; ready when constructed. The caller's EDGETPU_SERVE_* settings are
    kept, `settings` (lower-case names, the prefix left out) go on top."""

    def __init__(self, plain: bool = False, **settings: str):
        env = {"PYTHONPATH": str(ROOT), "EDGETPU_SERVE_LOG_LEVEL": "warning",
               **{f"EDGETPU_SERVE_{k.upper()}": str(v) for k, v in settings.items()}}
        port, argv = None, None
        if plain:
            port = free_port()
            # uvicorn's CLI refuses to start the app with its own protocol (app/launch.py), so the baseline
            # runs it through uvicorn.run with settings given: the same app, uvicorn's own httptools protocol.
            argv = [sys.executable, "-c", PLAIN_UVICORN, str(port)]
        super().__init__(env, argv=argv, port=port)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise


# -- raw HTTP over asyncio ------------------------------------------------------------------------

@dataclass
class Answer:
    """One request's outcome as the client saw it."""
    status: int                # 0: no HTTP answer
    seconds: float             # from the connect to the status line (curl: to the whole, small, answer)
    reason: str | None = None  # a 503's error message, numbers as N (which limit said no)
    error: str | None = None   # a transport error: no answer at all


def reason_of(body: bytes) -> str:
    """The error message of a JSON error body, its figures replaced by N so that equal reasons group."""
    try:
        message = str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        message = body[:60].decode("utf-8", "replace")
    return re.sub(r"\b\d+(?:\.\d+)?\b", "N", message)[:90]


async def exchange_answer(port: int, request: bytes, timeout_s: float = 30.0, read_reason: bool = False
                          ) -> Answer:
    """Send one request on a new connection and read the status line (and a 503's reason if asked)."""
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout_s)
    except (OSError, asyncio.TimeoutError) as e:
        return Answer(0, time.perf_counter() - start, error=type(e).__name__)
    try:
        async def send():
            try:
                writer.write(request)
                await writer.drain()
            except (ConnectionError, OSError):
                pass  # answered (and closed) before all was sent: the answer is what counts

        sending = asyncio.ensure_future(send())
        line = await asyncio.wait_for(reader.readline(), timeout_s)
        elapsed = time.perf_counter() - start
        sending.cancel()
        if not line.startswith(b"HTTP/"):
            return Answer(0, elapsed, error=f"no status line: {line[:40]!r}")
        answer = Answer(int(line.split()[1]), elapsed)
        if read_reason and answer.status == 503:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                answer.reason = reason_of(await asyncio.wait_for(
                    reader.readexactly(int(length.group(1))) if length else reader.read(), timeout_s))
            except (ConnectionError, OSError, asyncio.TimeoutError, asyncio.IncompleteReadError,
                    asyncio.LimitOverrunError) as e:
                answer.reason = f"(body unreadable: {type(e).__name__})"  # the 503 itself did arrive
        return answer
    except (ConnectionError, OSError, asyncio.TimeoutError, ValueError, IndexError) as e:
        return Answer(0, time.perf_counter() - start, error=type(e).__name__)
    finally:
        writer.close()


async def exchange(port: int, request: bytes, timeout_s: float = 30.0) -> tuple[int, float]:
    """Send one request on a new connection; (status, seconds to the status line). 0 = no answer."""
    answer = await exchange_answer(port, request, timeout_s)
    return answer.status, answer.seconds


def post(path: str, body: bytes, content_type: str = "image/jpeg") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"


def pct(values: list[float], q: float) -> float:
    """The q-th percentile of latencies in seconds, in ms (bench.stats.percentile); nan when there are none."""
    return percentile(values, q) * 1000 if values else float("nan")


async def probe(port: int, request: bytes, stop: asyncio.Event, interval_s: float = 0.01,
                limit: int = 5000) -> tuple[list[float], list[int]]:
    """A well-behaved client beside the hostile ones: latencies and statuses."""
    latencies, statuses = [], []
    for _ in range(limit):
        if stop.is_set():
            break
        status, seconds = await exchange(port, request, 10)
        latencies.append(seconds)
        statuses.append(status)
        await asyncio.sleep(interval_s)
    return latencies, statuses


def photo_jpeg(width: int, height: int, quality: int = 90, noise: float = 0.0) -> bytes:
    """china.jpg at any size; `noise` (sensor-like Gaussian, in grey levels) makes it compress
    like a camera's full-resolution frame rather than a smooth upscale."""
    from sklearn.datasets import load_sample_image
    image = Image.fromarray(load_sample_image("china.jpg")).resize((width, height), Image.Resampling.BILINEAR)
    if noise:
        pixels = np.asarray(image, np.float32) + np.random.default_rng(0).normal(0, noise, (height, width, 3))
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


# -- the four scenarios ----------------------------------------------------------------------------

async def header_bombs(svc: Service) -> None:
    print("\n## header bombs (MAX_HEADER_BYTES 16 KiB)")
    print("| bomb | status | time to answer ms | /healthz beside it: p50 / p99 ms, n | RSS MB before -> after |")
    print("|---|---|---|---|---|")
    bombs = {
        "1 MiB header": b"GET /healthz HTTP/1.1\r\nHost: b\r\nX-Bomb: " + b"a" * MIB + b"\r\n\r\n",
        "64 MiB header": b"GET /healthz HTTP/1.1\r\nHost: b\r\nX-Bomb: " + b"a" * (64 * MIB) + b"\r\n\r\n",
        "4000 headers of 100 B": b"GET /healthz HTTP/1.1\r\nHost: b\r\n"
                                 + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 100) for i in range(4000)) + b"\r\n",
        "1 MiB URL": b"GET /healthz?" + b"q" * MIB + b" HTTP/1.1\r\nHost: b\r\n\r\n",
    }
    for name, request in list(bombs.items()) + [("8 x 1 MiB at once", None)]:
        before = svc.memory_mb()["VmRSS"]
        stop = asyncio.Event()
        beside = asyncio.ensure_future(probe(svc.port, GET_HEALTHZ, stop))
        await asyncio.sleep(0.05)
        if request is None:
            results = await asyncio.gather(*(exchange(svc.port, bombs["1 MiB header"]) for _ in range(8)))
        else:
            results = [await exchange(svc.port, request)]
        await asyncio.sleep(0.1)
        stop.set()
        latencies, _ = await beside
        after = svc.memory_mb()["VmRSS"]
        statuses = sorted({s for s, _ in results})
        times = [t * 1000 for _, t in results]
        print(f"| {name} | {statuses} | {max(times):.1f} | {pct(latencies, 50):.1f} / {pct(latencies, 99):.1f}, "
              f"{len(latencies)} | {before:.0f} -> {after:.0f} |")


async def slow_clients(svc: Service, count: int, header_timeout_s: float, body_timeout_s: float,
                       classify: bytes) -> None:
    print(f"\n## {count} slow clients (HEADER_TIMEOUT_S {header_timeout_s:g}, BODY_TIMEOUT_S {body_timeout_s:g})")

    async def slow(kind: str) -> tuple[str, int, float]:
        start = time.perf_counter()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", svc.port)
        except OSError:
            return kind, -1, 0.0
        try:
            if kind == "half a head":
                writer.write(b"POST /v1/classify HTTP/1.1\r\nHost: b\r\nX-Slow: ")
            else:
                writer.write(b"POST /v1/classify HTTP/1.1\r\nHost: b\r\nContent-Type: image/jpeg\r\n"
                             b"Content-Length: 100000\r\n\r\n" + classify[:5000])
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 3 * max(header_timeout_s, body_timeout_s) + 10)
            status = int(line.split()[1]) if line.startswith(b"HTTP/") else 0
        except (ConnectionError, asyncio.TimeoutError, ValueError, IndexError):
            status = 0
        finally:
            writer.close()
        return kind, status, time.perf_counter() - start

    alone_stop = asyncio.Event()
    alone = asyncio.ensure_future(probe(svc.port, post("/v1/classify", classify), alone_stop, interval_s=0.02))
    await asyncio.sleep(3.0)
    alone_stop.set()
    alone_latencies, _ = await alone
    files_before = svc.open_files()
    stop = asyncio.Event()
    beside = asyncio.ensure_future(probe(svc.port, post("/v1/classify", classify), stop, interval_s=0.02))
    await asyncio.sleep(0.5)
    tasks = [asyncio.ensure_future(slow("half a head" if i % 2 else "half a body")) for i in range(count)]
    await asyncio.sleep(1.0)
    files_during = svc.open_files()
    results = await asyncio.gather(*tasks)
    await asyncio.sleep(0.5)
    stop.set()
    latencies, statuses = await beside
    files_after = svc.open_files()
    print("| slow client | n | statuses | dropped after: min / median / max s |")
    print("|---|---|---|---|")
    for kind in ("half a head", "half a body"):
        rows = [r for r in results if r[0] == kind]
        times = [t for _, _, t in rows]
        print(f"| {kind} | {len(rows)} | {dict(sorted(_count(s for _, s, _ in rows).items()))} | "
              f"{min(times):.2f} / {median(times):.2f} / {max(times):.2f} |")
    print(f"normal classify alone (same service, before): n {len(alone_latencies)}, "
          f"p50 {pct(alone_latencies, 50):.1f} ms, p99 {pct(alone_latencies, 99):.1f} ms")
    print(f"normal classify beside them: n {len(latencies)}, statuses {dict(_count(statuses))}, "
          f"p50 {pct(latencies, 50):.1f} ms, p99 {pct(latencies, 99):.1f} ms; "
          f"open files {files_before} -> {files_during} (during) -> {files_after} (after)")


def _count(values) -> dict:
    counts: dict = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return counts


async def large_bodies(svc: Service, count: int, bodies: list[bytes], label: str) -> None:
    svc_idle = svc.memory_mb()["VmRSS"]
    start = time.perf_counter()
    results = await asyncio.gather(*(exchange(svc.port, post("/v1/classify", bodies[i % len(bodies)]), 60)
                                     for i in range(count)))
    elapsed = time.perf_counter() - start
    peak = svc.memory_mb()["VmHWM"]
    await asyncio.sleep(2.0)
    after = svc.memory_mb()["VmRSS"]
    statuses = dict(sorted(_count(s for s, _ in results).items()))
    print(f"| {label} | {count} | {statuses} | {elapsed:.1f} | {svc_idle:.0f} | {peak:.0f} | {after:.0f} |")


def base64_bodies(args: argparse.Namespace) -> None:
    """DOODS' bodies of base64 that is not an image, as big as MAX_BODY_BYTES allows, sequential then concurrent."""
    svc = Service()
    try:
        data = base64.b64encode(os.urandom(20 * MIB - 100_000)).decode()
        body = json.dumps({"data": data, "detector_name": "default", "detect": {"*": 50}}).encode()
        request = post("/detect", body, "application/json")
        asyncio.run(exchange(svc.port, request, 60))  # warmed up
        time.sleep(1.5)  # malloc's trim after it
        print(f"\n## DOODS bodies of base64 that decodes to no image ({len(body) / 1e6:.1f} MB each), default settings")
        print("| phase | n | statuses | s | idle RSS MB | peak RSS MB (VmHWM) | RSS 2 s after MB |")
        print("|---|---|---|---|---|---|---|")
        for phase, count, at_once in (("one after another", args.base64_bodies, 1),
                                      ("all at once", args.base64_bodies, args.base64_bodies)):
            svc.reset_peak_memory()
            idle = svc.memory_mb()["VmRSS"]
            start = time.perf_counter()
            results = []
            for first in range(0, count, at_once):
                results += asyncio.run(_all(exchange(svc.port, request, 120) for _ in range(first, min(count, first + at_once))))
            elapsed = time.perf_counter() - start
            peak = svc.memory_mb()["VmHWM"]
            time.sleep(2.0)
            statuses = dict(sorted(_count(s for s, _ in results).items()))
            print(f"| {phase} | {count} | {statuses} | {elapsed:.1f} | {idle:.0f} | {peak:.0f} | "
                  f"{svc.memory_mb()['VmRSS']:.0f} |")
    finally:
        svc.stop()


async def _all(coroutines) -> list:
    return await asyncio.gather(*coroutines)


# -- overload: N concurrent clients from curl (C, event-driven) or from this process -------------

CURL_MAX_PARALLEL = 300  # curl's --parallel-max limit (above it, silently 50): more clients, more curl processes
CURL_TIMEOUT_S = 30      # per transfer, as the Python client's
# time_total, not time_starttransfer: curl 7.88 stamps the latter when a POST's upload starts, not at the
# answer's first byte. time_total is the time to the whole answer: under 1 KB of JSON with a Content-Length,
# written with its status line; and curl stops uploading when a status >= 300 arrives mid-body ("HTTP error
# before end of send, stop sending"), so an early 503 is not held back by the rest of the upload.
CURL_WRITE_OUT = "%{filename_effective} %{http_code} %{time_total} %{exitcode}\\n"


def curl_requests(url: str, body: Path, content_type: str, clients: int, count: int, keep_alive: bool,
                  workdir: Path) -> tuple[list[Answer], float]:
    """`count` POSTs of `body` to `url`, `clients` at a time, by curl --parallel; (answers, curl's CPU s).

    Each answer's body goes to a file of its own, read afterwards for a 503's reason. Without
    keep_alive every request asks `Connection: close`, so each is a new connection, as a camera's
    one-shot POST is; with it, curl reuses the connections of its pool."""
    processes = -(-clients // CURL_MAX_PARALLEL)
    headers = [f"Content-Type: {content_type}", "Expect:"]  # no 100-continue wait: the body goes at once
    if not keep_alive:
        headers.append("Connection: close")
    commands = []
    for p in range(processes):
        parallel = clients // processes + (p < clients % processes)
        transfers = count // processes + (p < count % processes)
        if transfers == 0:
            continue
        config = [f'data-binary = "@{body}"'] + [f'header = "{h}"' for h in headers]
        for i in range(transfers):
            config += [f'url = "{url}"', f'output = "{workdir / f"answer-{p}-{i}"}"']
        (workdir / f"curl-{p}.conf").write_text("\n".join(config) + "\n")
        command = ["curl", "--silent", "--show-error", "--max-time", str(CURL_TIMEOUT_S), "--write-out",
                   CURL_WRITE_OUT, "--config", str(workdir / f"curl-{p}.conf")]
        if parallel > 1:
            command[1:1] = ["--parallel", "--parallel-immediate", "--parallel-max", str(parallel)]
        commands.append(command)
    running = []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        for p, command in enumerate(commands):
            out = (workdir / f"curl-{p}.out").open("w")  # a file, not a pipe: nothing stalls a curl mid-run
            running.append((subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL), out))
        for process, out in running:
            process.wait(CURL_TIMEOUT_S * (-(-count // clients)) + 60)
    finally:
        for process, out in running:
            if process.poll() is None:
                process.kill()
                process.wait()
            out.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    answers = []
    for p in range(len(running)):
        for line in (workdir / f"curl-{p}.out").read_text().splitlines():
            path, code, seconds, exitcode = line.rsplit(" ", 3)
            answer = Answer(int(code), float(seconds))
            if exitcode != "0":
                answer = Answer(0, answer.seconds, error=f"curl exit {exitcode}")
            elif answer.status == 503:
                answer.reason = reason_of(Path(path).read_bytes())
            answers.append(answer)
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return answers, cpu_s


H2LOAD_PERIOD_MS = 10  # h2load's --rate-period: the arrivals come in bursts this far apart


def h2load_requests(url: str, body: Path, content_type: str, count: int, per_second: float | None
                    ) -> tuple[list[Answer], float]:
    """`count` POSTs of `body` by h2load (nghttp2's load generator, C++), each on a new connection;
    (answers, h2load's CPU s). With `per_second`, open loop: arrivals at that rate whatever the
    answers (h2load's --rate: connections made per period, one request each); without, one client
    sending them one after another. Times from h2load's per-request log (to the end of the answer)."""
    with tempfile.NamedTemporaryFile(prefix="h2load-", suffix=".log") as log:
        command = ["h2load", "--h1", "-n", str(count), "-d", str(body), "-H", f"content-type: {content_type}",
                   f"--log-file={log.name}"]
        if per_second:
            per_period = max(1, round(per_second * H2LOAD_PERIOD_MS / 1000))
            command += ["-c", str(count), "-r", str(per_period), f"--rate-period={H2LOAD_PERIOD_MS}ms"]
        else:
            command += ["-c", "1"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(command + [url], capture_output=True, text=True, timeout=CURL_TIMEOUT_S + count)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise RuntimeError(f"h2load failed: {done.stdout}{done.stderr}")
        answers = []
        for line in Path(log.name).read_text().splitlines():
            _, status, micros = line.split("\t")[:3]
            answers.append(Answer(int(status), int(micros) / 1e6) if int(status) > 0 else
                           Answer(0, int(micros) / 1e6, error="no answer"))
        missing = count - len(answers)  # requests h2load could not complete are not in its log
        answers += [Answer(0, float("nan"), error="not completed")] * missing
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return answers, cpu_s


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process, all its threads (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def overload_closed(svc: Service, admitted: int, factor: int, body: bytes, per_client: int, unloaded_requests: int,
                    client: str, keep_alive: bool) -> None:
    """Closed loop: the unloaded baseline (1 client), then admitted x factor concurrent clients, per_client
    requests each, every client sending its next request as soon as it has an answer."""
    clients = admitted * factor
    url = f"http://127.0.0.1:{svc.port}/v1/classify"
    with tempfile.TemporaryDirectory(prefix="hostile-overload-") as tmp:
        workdir = Path(tmp)
        if client == "curl":
            (workdir / "body.jpg").write_bytes(body)

            def run(concurrent: int, count: int) -> tuple[list[Answer], float]:
                return curl_requests(url, workdir / "body.jpg", "image/jpeg", concurrent, count, keep_alive, workdir)
        else:
            request = post("/v1/classify", body)

            def run(concurrent: int, count: int) -> tuple[list[Answer], float]:
                async def one_client(requests: int) -> list[Answer]:
                    return [await exchange_answer(svc.port, request, CURL_TIMEOUT_S, read_reason=True)
                            for _ in range(requests)]

                async def all_clients() -> list[list[Answer]]:
                    shares = [count // concurrent + (i < count % concurrent) for i in range(concurrent)]
                    return await asyncio.gather(*(one_client(n) for n in shares))

                before = resource.getrusage(resource.RUSAGE_SELF)
                answers = [a for rows in asyncio.run(all_clients()) for a in rows]
                after = resource.getrusage(resource.RUSAGE_SELF)
                return answers, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)

        unloaded, _ = run(1, unloaded_requests)
        service_before = process_cpu_s(svc.process.pid)
        start = time.perf_counter()
        answers, client_cpu_s = run(clients, clients * per_client)
        elapsed = time.perf_counter() - start
        service_cpu_s = process_cpu_s(svc.process.pid) - service_before

    generator = {"curl": "curl --parallel", "python": "Python asyncio, in this process"}[client]
    connections = "keep-alive connections" if keep_alive else "a new connection per request"
    print(f"\n## overload, closed loop: {clients} concurrent clients ({factor}x the {admitted} the service admits: "
          f"workers + MAX_WAITING), {per_client} requests each, {connections}; load generator: {generator}; "
          f"{elapsed:.1f} s")
    print_overload(unloaded, answers, elapsed, service_cpu_s, client, client_cpu_s)


def overload_open(svc: Service, workers: int, factor: int, body: bytes, seconds: float, unloaded_requests: int,
                  title: str = "") -> None:
    """Open loop: the unloaded baseline (1 client, one request after another), then requests arriving at
    `factor` times the rate the service can serve (workers / the unloaded p50), each on a new connection,
    for `seconds`: arrivals do not wait for answers, as independent cameras' do not."""
    url = f"http://127.0.0.1:{svc.port}/v1/classify"
    with tempfile.TemporaryDirectory(prefix="hostile-overload-") as tmp:
        path = Path(tmp) / "body.jpg"
        path.write_bytes(body)
        unloaded, _ = h2load_requests(url, path, "image/jpeg", unloaded_requests, None)
        capacity = workers / median(a.seconds for a in unloaded if a.status == 200)
        rate = factor * capacity
        service_before = process_cpu_s(svc.process.pid)
        start = time.perf_counter()
        answers, client_cpu_s = h2load_requests(url, path, "image/jpeg", round(rate * seconds), rate)
        elapsed = time.perf_counter() - start
        service_cpu_s = process_cpu_s(svc.process.pid) - service_before
    print(f"\n## overload, open loop{title}: requests arriving at {rate:.0f}/s ({factor}x the ~{capacity:.0f}/s "
          f"{workers} interpreters serve at the unloaded p50), each on a new connection, {len(answers)} in "
          f"{elapsed:.1f} s; load generator: h2load (503 reasons: --overload-client curl)")
    print_overload(unloaded, answers, elapsed, service_cpu_s, "h2load", client_cpu_s)


def print_overload(unloaded: list[Answer], answers: list[Answer], elapsed: float, service_cpu_s: float,
                   client: str, client_cpu_s: float) -> None:
    print("| | n | p50 ms | p99 ms |")
    print("|---|---|---|---|")
    ok_unloaded = [a.seconds for a in unloaded if a.status == 200]
    ok = [a.seconds for a in answers if a.status == 200]
    busy = [a.seconds for a in answers if a.status == 503]
    print(f"| unloaded 200 (1 client) | {len(ok_unloaded)} | {pct(ok_unloaded, 50):.1f} | {pct(ok_unloaded, 99):.1f} |")
    print(f"| overload 200 | {len(ok)} | {pct(ok, 50):.1f} | {pct(ok, 99):.1f} |")
    print(f"| overload 503 | {len(busy)} | {pct(busy, 50):.1f} | {pct(busy, 99):.1f} |")
    reasons: dict[str, list[float]] = {}
    for a in answers:
        if a.status == 503 and a.reason is not None:
            reasons.setdefault(a.reason, []).append(a.seconds)
    for reason, times in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
        print(f"| 503 {reason!r} | {len(times)} | {pct(times, 50):.1f} | {pct(times, 99):.1f} |")
    others = _count(f"{a.status} ({label})" for label, rows in (("unloaded", unloaded), ("overload", answers))
                    for a in rows if a.status and a.status not in ((200,) if label == "unloaded" else (200, 503)))
    errors = _count(f"{a.error} ({label})" for label, rows in (("unloaded", unloaded), ("overload", answers))
                    for a in rows if not a.status)
    print(f"other statuses: {others or 'none'}; transport errors: {errors or 'none'}; "
          f"admitted p99 / unloaded p99 = {pct(ok, 99) / pct(ok_unloaded, 99):.1f}x")
    print(f"CPU during the overload phase: service {service_cpu_s:.2f} s, load generator ({client}) "
          f"{client_cpu_s:.2f} s, of {elapsed * (os.cpu_count() or 1):.2f} s the {os.cpu_count()} cores had "
          f"in {elapsed:.2f} s")


async def keep_alive_rate(port: int, requests: int) -> float:
    """Seconds per request for `requests` sequential GET /healthz on one keep-alive connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n"
    start = time.perf_counter()
    for _ in range(requests):
        writer.write(request)
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(13)  # {"live":true}
    elapsed = time.perf_counter() - start
    writer.close()
    return elapsed / requests


def protocol_cost(rounds: int, requests: int) -> None:
    print(f"\n## what the limits cost per request: GET /healthz, one keep-alive connection, {requests} requests "
          f"x {rounds} alternating rounds")
    ours, plain = Service(), Service(plain=True)
    try:
        times = {"uvicorn + httptools (plain)": [], "ours (LimitedHttpToolsProtocol)": []}
        for _ in range(rounds):
            times["uvicorn + httptools (plain)"].append(asyncio.run(keep_alive_rate(plain.port, requests)))
            times["ours (LimitedHttpToolsProtocol)"].append(asyncio.run(keep_alive_rate(ours.port, requests)))
    finally:
        ours.stop()
        plain.stop()
    print("| server | median us per request (client included) |")
    print("|---|---|")
    for name, values in times.items():
        print(f"| {name} | {median(values) * 1e6:.0f} |")
    ours_over_plain = ratio(median(times["ours (LimitedHttpToolsProtocol)"]),
                            median(times["uvicorn + httptools (plain)"]))
    print(f"ours / plain = {ours_over_plain:.2f}")


def large_images() -> None:
    """Decode time and peak RSS per image kind, each in a fresh service (VmHWM only rises)."""
    from sklearn.datasets import load_sample_image
    china = Image.fromarray(load_sample_image("china.jpg"))

    def encoded(size, fmt, **kw):
        buf = io.BytesIO()
        china.resize(size, Image.Resampling.NEAREST).save(buf, fmt, **kw)
        return buf.getvalue()

    cases = [
        ("JPEG 8600x5700 (49 MP), decoded at 1/8", encoded((8600, 5700), "JPEG", quality=90), "image/jpeg", {}),
        ("PNG 6000x4000 (24 MP, = MAX_DECODED_PIXELS)", encoded((6000, 4000), "PNG", compress_level=1),
         "image/png", {}),
        ("PNG 8600x5700 (49 MP), default budget", encoded((8600, 5700), "PNG", compress_level=1), "image/png", {}),
        ("PNG 8600x5700 (49 MP), MAX_DECODED_PIXELS 50 M (as before)", None, "image/png",
         {"max_decoded_pixels": 50_000_000}),
    ]
    cases[3] = (cases[3][0], cases[2][1], cases[3][2], cases[3][3])
    print("\n## large images: 3 sequential requests each, a fresh service per row")
    print("| image | body MB | status | ms per request (median) | idle RSS MB | peak RSS MB | RSS after MB |")
    print("|---|---|---|---|---|---|---|")
    for name, body, content_type, settings in cases:
        svc = Service(max_body_bytes=64 * MIB, max_body_bytes_in_flight=128 * MIB, **settings)
        try:
            idle = svc.memory_mb()["VmRSS"]
            results = [asyncio.run(exchange(svc.port, post("/v1/classify", body, content_type), 60)) for _ in range(3)]
            peak = svc.memory_mb()["VmHWM"]
            time.sleep(1.0)
            after = svc.memory_mb()["VmRSS"]
        finally:
            svc.stop()
        print(f"| {name} | {len(body) / 1e6:.1f} | {sorted({s for s, _ in results})} | "
              f"{median(t for _, t in results) * 1000:.0f} | {idle:.0f} | {peak:.0f} | {after:.0f} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="bombs,slow,bodies,base64,images,cost,overload,zmq",
                        help="scenarios to run, comma-separated")
    parser.add_argument("--slow-clients", type=int, default=200, help="slow connections at once")
    parser.add_argument("--deadline", type=float, default=5.0, help="HEADER_TIMEOUT_S and BODY_TIMEOUT_S for the "
                        "slow-client run (the defaults, 10 and 60 s, make a long benchmark)")
    parser.add_argument("--bodies", type=int, default=48, help="concurrent large bodies (issue: 32-64)")
    parser.add_argument("--base64-bodies", type=int, default=16, help="DOODS' base64 bodies, each phase")
    parser.add_argument("--overload-factor", type=int, default=10,
                        help="overload: concurrent clients as a multiple of what the service admits")
    parser.add_argument("--overload-requests", type=int, default=3, help="overload: requests per client")
    parser.add_argument("--unloaded-requests", type=int, default=100,
                        help="overload: sequential requests of the unloaded baseline (1 client)")
    parser.add_argument("--overload-client", choices=("h2load", "curl", "python"), default="h2load",
                        help="overload: h2load, open loop (arrivals at --overload-factor x the service's rate); or a "
                             "closed loop of --overload-factor x the admitted count concurrent clients: curl "
                             "--parallel (C, with each 503's reason) or this script's asyncio client")
    parser.add_argument("--overload-seconds", type=float, default=3.0, help="overload, open loop: how long")
    parser.add_argument("--overload-variant", action="append", default=None, metavar="'NAME=VALUE ...'",
                        help="overload: service settings (EDGETPU_SERVE_ prefix left out) to run side by side, "
                             "one service each; '' = the defaults")
    parser.add_argument("--keep-alive", action="store_true",
                        help="overload with curl: no Connection: close, curl reuses the connections of its pool")
    parser.add_argument("--max-waiting", type=int, default=32, help="overload: the service's MAX_WAITING")
    parser.add_argument("--workers", type=int, help="overload: the service's WORKERS (default: its own)")
    parser.add_argument("--zmq-design", default="a", help="zmq: a (the door's own ZMTP reader), b (libzmq), or a,b")
    parser.add_argument("--zmq-attacks", default=None, help="zmq: the attacks, comma-separated (default: all)")
    parser.add_argument("--zmq-seconds", type=float, default=5.0, help="zmq: each window (alone, during, after)")
    parser.add_argument("--zmq-rate", type=float, default=20.0, help="zmq: the good client's requests per second")
    args = parser.parse_args(argv)
    if args.keep_alive and args.overload_client != "curl":
        parser.error("--keep-alive needs --overload-client curl")
    return args


def bombs_and_slow_clients(args: argparse.Namespace, only: set[str], small: bytes) -> None:
    svc = Service(header_timeout_s=args.deadline, body_timeout_s=args.deadline)
    try:
        if "bombs" in only:
            asyncio.run(header_bombs(svc))
        if "slow" in only:
            asyncio.run(slow_clients(svc, args.slow_clients, args.deadline, args.deadline, small))
    finally:
        svc.stop()


def concurrent_large_bodies(args: argparse.Namespace) -> None:
    sizes = [(5600, 3700), (5800, 3900), (6000, 4000)]
    bodies = [photo_jpeg(w, h, 97, noise=12) for w, h in sizes]
    print(f"\n## {args.bodies} concurrent large bodies ({', '.join(f'{len(b) / 1e6:.1f}' for b in bodies)} MB "
          "JPEGs: a real photo upscaled, with sensor-like noise), one fresh service each")
    print("| budget (MAX_BODY_BYTES_IN_FLIGHT) | n | statuses | s | idle RSS MB | peak RSS MB (VmHWM) | "
          "RSS 2 s after MB |")
    print("|---|---|---|---|---|---|---|")
    for label, settings in (("default (160 MiB)", {}),
                            ("out of the way (4 GiB)", {"max_body_bytes_in_flight": 4096 * MIB}),
                            ("out of the way, TUNE_MALLOC=false (glibc defaults)",
                             {"max_body_bytes_in_flight": 4096 * MIB, "tune_malloc": "false"})):
        svc = Service(**settings)
        try:
            asyncio.run(large_bodies(svc, args.bodies, bodies, label))
        finally:
            svc.stop()


def overload(args: argparse.Namespace, small: bytes) -> None:
    for variant in args.overload_variant or [""]:
        settings = {"max_waiting": args.max_waiting} | ({"workers": args.workers} if args.workers else {})
        settings |= {name.lower(): value for name, _, value in (pair.partition("=") for pair in variant.split())}
        svc = Service(**settings)
        try:
            models = httpx.get(f"http://127.0.0.1:{svc.port}/v1/models").json()
            workers = models["models"][0]["backends"]["cpu"]["interpreters"]
            if args.overload_client == "h2load":
                overload_open(svc, workers, args.overload_factor, small, args.overload_seconds,
                              args.unloaded_requests, f" [{variant}]" if variant else "")
            else:
                overload_closed(svc, workers + args.max_waiting, args.overload_factor, small,
                                args.overload_requests, args.unloaded_requests, args.overload_client,
                                args.keep_alive)
        finally:
            svc.stop()


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the service on the way out
    args = parse_args(argv)
    only = set(args.only.split(","))
    small = photo_jpeg(640, 427)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; classify body: china.jpg 640x427 "
          f"({len(small)} B); default model, cpu backend")
    if only & {"bombs", "slow"}:
        bombs_and_slow_clients(args, only, small)
    if "bodies" in only:
        concurrent_large_bodies(args)
    if "base64" in only:
        base64_bodies(args)
    if "images" in only:
        large_images()
    if "cost" in only:
        protocol_cost(9, 2000)
    if "overload" in only:
        overload(args, small)
    if "zmq" in only:
        from bench import zmq_attacks

        print("\n## Frigate's ZMQ door against hostile peers (bench/zmq_attacks.py)")
        zmq_attacks.run(args.zmq_design.split(","), (args.zmq_attacks or ",".join(zmq_attacks.ATTACKS)).split(","),
                        args.zmq_seconds, args.zmq_rate, {})
    return 0

if __name__ == "__main__":
    sys.exit(main())
