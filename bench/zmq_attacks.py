"""The ZMQ door against hostile peers (issue 42): bench/hostile.py --only zmq runs these, and so can this file.

For each attack, against `python -m app` with its ZMQ door on a loopback tcp endpoint and every other setting at its
default (the person detector, the cpu backend): a good Frigate client (a pyzmq REQ socket in a process of its own, a
tensor every 1/RATE s, Frigate's 200 ms timeout, after which it makes a new socket and asks for its model again, as
Frigate does) is measured alone, during the attack and after it, and the service's RSS before, at its peak during
(sampled every 20 ms) and after. Each row says whether the issue's targets hold: p99 under 50 ms during the attack,
RSS growth under 100 MB, every request answered afterwards. Beside the good client, a probe of the event loop alone:
GET /healthz every 20 ms (the HTTP door shares the loop with the ZMQ door and /healthz needs nothing else), so that a
loop held by the door is told apart from compute threads starved of the 2 cores.

The attacks, the issue's first, then more of the same kinds:
  many_frames      messages of 300,000 one-byte frames, one after another, and beside them one of 2,000,000
                   without its last frame
  stalled          8 connections each declare a 64 MiB frame, send 60 MiB of it, and stall
  deep_header      a header of 2,000 nested brackets (under 4 KiB), sent as fast as it is answered
  model_flood      32 connections each send a 60 MiB model_data at once (uploads off, the default)
  slow_greetings   200 connections each send one byte of their greeting a second
  idle             500 connections greet and then say nothing
  huge_command     connection after connection declares a command of 2**62 bytes
  header_flood     4 peers send distinct 4 KiB headers nested as deep as the door reads (int8: refused once read),
                   as fast as answered
  garbage          connection after connection sends 4 KiB of random bytes instead of a greeting
  interleaved      50 peers send tensor requests of the input's size (int8: refused once whole) 512 bytes at a time,
                   round robin
  pipelined        a peer sends 100,000 small requests back to back without reading a reply
and a control, no attack at all:
  busy_core        a process that only spins, taking a core as an attacker on this machine does: what sharing 2 cores
                   costs the good client, apart from anything the door does

`--design b` runs the same against design (b), libzmq with every limit it offers (bench/zmq_libzmq_server.py).

    python bench/zmq_attacks.py --seconds 5                      # every attack, design (a): the product
    python bench/zmq_attacks.py --design a,b --only many_frames,stalled
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service import ServiceProcess, free_port  # noqa: E402
from bench.stats import percentile_or_none  # noqa: E402
from bench.zmtp_peer import frame_head, greeting, message, ready_command  # noqa: E402

PERSON = "ssdlite_mobilenet_v2_person"
SHAPE = (1, 300, 300, 3)
HEADER = json.dumps({"shape": list(SHAPE), "dtype": "uint8", "model_type": "ssd"}).encode()
OPENING = greeting() + ready_command()
MIB = 1024 * 1024
FRIGATE_TIMEOUT_MS = 200
TARGET_P99_MS, TARGET_RSS_MB = 50.0, 100.0
DESIGNS = {"a": "the door's own ZMTP reader (the product)", "b": "libzmq, every limit it offers (prototype)"}


# -- the good client: a process of its own ------------------------------------------------------------------

def good_client(endpoint: str, seconds: float, rate: float) -> dict:
    """Frigate's detector: one tensor every 1/rate s (or as soon as answered, if later), its 200 ms timeout."""
    import zmq

    from bench.frigate_client import FrigateClient

    context = zmq.Context()
    client = FrigateClient(endpoint, PERSON, timeout_ms=FRIGATE_TIMEOUT_MS, context=context)
    deadline = time.monotonic() + 60
    while not client.start():  # the model check has its own 30 s timeout
        if time.monotonic() > deadline:
            return {"error": "no model"}
    tensor = np.random.default_rng(0).integers(0, 256, SHAPE, dtype=np.uint8)
    latencies, timeouts = [], 0
    stop = time.perf_counter() + seconds
    next_at = time.perf_counter()
    while (now := time.perf_counter()) < stop:
        if now < next_at:
            time.sleep(next_at - now)
        next_at += 1 / rate
        start = time.perf_counter()
        before = client.timeouts
        client.detect(tensor)
        if client.timeouts > before:
            timeouts += 1
            latencies.append(FRIGATE_TIMEOUT_MS / 1000)
            client.start()  # Frigate asks for its model again on its new socket
        else:
            latencies.append(time.perf_counter() - start)
    context.destroy(linger=0)
    ms = np.array(latencies) * 1000
    return {"requests": len(ms), "timeouts": timeouts, "p50_ms": percentile_or_none(ms, 50),
            "p99_ms": percentile_or_none(ms, 99)}


def loop_probe(url: str, seconds: float) -> dict:
    """GET /healthz every 20 ms on one keep-alive connection: the event loop's own delay (the HTTP door shares the
    loop with the ZMQ door, and /healthz needs nothing else), apart from the compute threads the good client needs."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    latencies = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        start = time.perf_counter()
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        latencies.append(time.perf_counter() - start)
        time.sleep(0.02)
    ms = np.array(latencies) * 1000
    return {"requests": len(ms), "p50_ms": percentile_or_none(ms, 50), "p99_ms": percentile_or_none(ms, 99),
            "max_ms": float(ms.max()) if len(ms) else None}


def measure_probe(url: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "probe", url, str(seconds)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def measure_client(endpoint: str, seconds: float, rate: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "client", endpoint, str(seconds), str(rate)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def client_result(process: subprocess.Popen, timeout_s: float) -> dict:
    out, err = process.communicate(timeout=timeout_s)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": err[-300:]}


# -- attacks ----------------------------------------------------------------------------------------------------

async def _connect(port: int):
    return await asyncio.open_connection("127.0.0.1", port)


async def _greeted(port: int):
    reader, writer = await _connect(port)
    writer.write(OPENING)
    await writer.drain()
    return reader, writer


def _close(writer) -> None:
    try:
        writer.transport.abort()
    except Exception:  # noqa: BLE001 - already gone
        pass


async def _until_closed(reader, stop: asyncio.Event) -> None:
    """Read (and drop) what the service sends until it closes or the attack ends."""
    while not stop.is_set():
        try:
            data = await asyncio.wait_for(reader.read(65536), 0.2)
        except asyncio.TimeoutError:
            continue
        except OSError:
            return
        if not data:
            return


async def many_frames(port: int, stop: asyncio.Event) -> None:
    head = frame_head(0, more=True) + frame_head(len(HEADER), more=True) + HEADER
    one = frame_head(1, more=True) + b"x"

    async def whole():  # the issue's: 300,000 one-byte frames, the message whole, again once answered
        while not stop.is_set():
            reader, writer = await _greeted(port)
            try:
                await reader.readexactly(64)
                writer.write(head + one * 299_998 + frame_head(1) + b"x")
                await writer.drain()
                await asyncio.wait_for(_read_message(reader), 30)  # answered (and closed, or not)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                pass
            _close(writer)

    async def withheld():  # FACTS.md's: 2,000,000 of them, the last withheld until the attack ends
        reader, writer = await _greeted(port)
        try:
            writer.write(head + one * 2_000_000)
            await writer.drain()
        except OSError:
            pass
        await _until_closed(reader, stop)
        _close(writer)

    await asyncio.gather(whole(), withheld())


async def _declare_and_stall(port: int, stop: asyncio.Event, head: bytes, declared: int) -> None:
    """One connection: a request whose last frame declares `declared` bytes, 60 MiB of it sent, then silence until
    the door drops the peer (or the attack ends)."""
    try:
        reader, writer = await _greeted(port)
    except OSError:  # refused at once (past the door's connection cap): nothing held
        return
    chunk = bytes(MIB)
    try:
        writer.write(frame_head(0, more=True) + frame_head(len(head), more=True) + head + frame_head(declared))
        for _ in range(60):
            writer.write(chunk)
            await writer.drain()
    except OSError:
        pass
    await _until_closed(reader, stop)
    _close(writer)


async def stalled(port: int, stop: asyncio.Event) -> None:
    await asyncio.gather(*(_declare_and_stall(port, stop, HEADER, 64 * MIB) for _ in range(8)))


async def _requests(port: int, stop: asyncio.Event, make) -> None:
    """A REQ-like raw peer sending make(i) as its request, one at a time, reading each reply."""
    reader, writer = await _greeted(port)
    await reader.readexactly(64)
    i = 0
    try:
        while not stop.is_set():
            writer.write(message([b"", *make(i)]))
            await writer.drain()
            await _read_message(reader)
            i += 1
    except (OSError, asyncio.IncompleteReadError):
        pass
    _close(writer)


async def _read_message(reader) -> None:
    while True:
        flags = (await reader.readexactly(1))[0]
        size = int.from_bytes(await reader.readexactly(8), "big") if flags & 2 else (await reader.readexactly(1))[0]
        await reader.readexactly(size)
        if not flags & 1 and not flags & 4:
            return


async def deep_header(port: int, stop: asyncio.Event) -> None:
    deep = b'{"shape": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    await _requests(port, stop, lambda i: [deep, bytes(int(np.prod(SHAPE)))])


async def header_flood(port: int, stop: asyncio.Event) -> None:
    def make(i):
        nested = '{"a": [[{"b": [[{"c": [%d]}]]}]]}' % i
        filler = ", ".join(f'"k{j}": "{i:08d}{j:04d}"' for j in range(150))
        header = ('{"shape": [1, 300, 300, 3], "dtype": "int8", "deep": %s, %s}' % (nested, filler)).encode()
        return [header[:4096], bytes(int(np.prod(SHAPE)))]

    await asyncio.gather(*(_requests(port, stop, make) for _ in range(4)))


async def model_flood(port: int, stop: asyncio.Event) -> None:
    heads = [json.dumps({"model_data": True, "model_name": f"flood{i}.tflite"}).encode() for i in range(32)]
    await asyncio.gather(*(_declare_and_stall(port, stop, head, 60 * MIB) for head in heads))


async def slow_greetings(port: int, stop: asyncio.Event) -> None:
    async def one():
        try:
            reader, writer = await _connect(port)
            for byte in greeting():
                if stop.is_set():
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1)
        except OSError:
            return
        _close(writer)

    await asyncio.gather(*(one() for _ in range(200)))


async def idle(port: int, stop: asyncio.Event) -> None:
    async def one():
        try:
            reader, writer = await _greeted(port)
        except OSError:
            return
        await _until_closed(reader, stop)
        _close(writer)

    await asyncio.gather(*(one() for _ in range(500)))


async def _churn(port: int, stop: asyncio.Event, opening) -> None:
    while not stop.is_set():
        try:
            reader, writer = await _connect(port)
            writer.write(opening())
            await writer.drain()
            await asyncio.wait_for(reader.read(65536), 2)
        except (OSError, asyncio.TimeoutError):
            pass
        _close(writer)


async def huge_command(port: int, stop: asyncio.Event) -> None:
    await _churn(port, stop, lambda: greeting() + frame_head(1 << 62, command=True))


async def garbage(port: int, stop: asyncio.Event) -> None:
    await _churn(port, stop, lambda: os.urandom(4096))


async def interleaved(port: int, stop: asyncio.Event) -> None:
    wrong = json.dumps({"shape": list(SHAPE), "dtype": "int8", "model_type": "ssd"}).encode()
    request = message([b"", wrong, bytes(int(np.prod(SHAPE)))])
    peers = [await _greeted(port) for _ in range(50)]
    for reader, _ in peers:
        await reader.readexactly(64)
    while not stop.is_set():
        for start in range(0, len(request), 512):
            for reader, writer in peers:
                writer.write(request[start:start + 512])
            await asyncio.sleep(0)
        for reader, writer in peers:
            try:
                await asyncio.wait_for(_read_message(reader), 10)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, OSError):
                pass
    for _, writer in peers:
        _close(writer)


async def pipelined(port: int, stop: asyncio.Event) -> None:
    reader, writer = await _greeted(port)
    small = message([b"", json.dumps({"model_request": True, "model_name": PERSON}).encode()])
    try:
        for _ in range(100):
            writer.write(small * 1000)
            await writer.drain()
            if stop.is_set():
                break
    except OSError:
        pass
    await _until_closed(reader, stop)
    _close(writer)


async def busy_core(port: int, stop: asyncio.Event) -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        await stop.wait()
    finally:
        spinner.kill()
        spinner.wait()


ATTACKS = {"many_frames": many_frames, "stalled": stalled, "deep_header": deep_header, "model_flood": model_flood,
           "slow_greetings": slow_greetings, "idle": idle, "huge_command": huge_command,
           "header_flood": header_flood, "garbage": garbage, "interleaved": interleaved, "pipelined": pipelined,
           "busy_core": busy_core}


# -- one attack, measured ----------------------------------------------------------------------------------------

class RssSampler:
    """The service's VmRSS every 20 ms while running: the peak of a window."""

    def __init__(self, service: ServiceProcess):
        self.service, self.peak, self._running = service, 0.0, False

    def __enter__(self):
        self.peak, self._running = self.service.memory_mb()["VmRSS"], True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while self._running:
            try:
                self.peak = max(self.peak, self.service.memory_mb()["VmRSS"])
            except OSError:
                return
            time.sleep(0.02)

    def __exit__(self, *exc):
        self._running = False
        self.thread.join(5)


def cpu_s(pid: int) -> float:
    """A process's CPU time so far (user and system), s."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_attack(service: ServiceProcess, port: int, name: str, seconds: float, rate: float) -> dict:
    endpoint = f"tcp://127.0.0.1:{port}"
    probe = measure_probe(service.url, seconds)
    alone = client_result(measure_client(endpoint, seconds, rate), seconds + 120)
    probe_alone = client_result(probe, 120)
    before = service.memory_mb()["VmRSS"]
    client = measure_client(endpoint, seconds + 1, rate)
    probe = measure_probe(service.url, seconds + 1)
    time.sleep(1.0)  # the client has started and asked for its model: the attack begins under it

    async def attack():
        stop = asyncio.Event()
        task = asyncio.create_task(ATTACKS[name](port, stop))
        await asyncio.sleep(seconds)
        stop.set()
        try:
            await asyncio.wait_for(task, 30)
        except asyncio.TimeoutError:
            task.cancel()

    cpu_before, started = cpu_s(service.process.pid), time.monotonic()
    with RssSampler(service) as rss:
        asyncio.run(attack())
    cpu_share = (cpu_s(service.process.pid) - cpu_before) / (time.monotonic() - started)
    during = client_result(client, 120)
    probe_during = client_result(probe, 120)
    time.sleep(2.0)  # what the attack left behind, once its connections are gone
    after_rss = service.memory_mb()["VmRSS"]
    after = client_result(measure_client(endpoint, seconds, rate), seconds + 120)
    return {"attack": name, "alone": alone, "during": during, "after": after, "rss_before": before,
            "rss_peak": rss.peak, "rss_after": after_rss, "service_cpu": cpu_share, "loop_alone": probe_alone,
            "loop_during": probe_during}


def _client_cell(r: dict) -> str:
    if "error" in r:
        return f"error: {r['error'][:60]}"
    p50, p99 = r.get("p50_ms"), r.get("p99_ms")
    timeouts = f", {r['timeouts']} timeouts" if r.get("timeouts") else ""
    return f"{p50:.1f} / {p99:.1f}{timeouts}" if p50 is not None else "none answered"


def _loop_cell(r: dict) -> str:
    return f"{r['p99_ms']:.1f} / {r['max_ms']:.1f}" if r.get("p99_ms") is not None else "-"


def verdict(row: dict) -> str:
    during, after = row["during"], row["after"]
    misses = []
    if "error" in during or (during.get("p99_ms") or 1e9) >= TARGET_P99_MS:
        misses.append("p99")
    if row["rss_peak"] - row["rss_before"] >= TARGET_RSS_MB:
        misses.append("RSS")
    if "error" in after or after.get("timeouts") or not after.get("requests"):
        misses.append("after")
    return "met" if not misses else "missed: " + ", ".join(misses)


def print_rows(design: str, rows: list[dict]) -> None:
    print(f"\n### Design ({design}): {DESIGNS[design]}\n")
    print("| attack | good client p50 / p99 ms: alone | during | after | RSS MB: before, peak during, after "
          "(growth) | service CPU during | event loop's delay (/healthz) p99 / max ms: alone, during | targets |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['attack']} | {_client_cell(r['alone'])} | {_client_cell(r['during'])} | "
              f"{_client_cell(r['after'])} | {r['rss_before']:.0f}, {r['rss_peak']:.0f}, {r['rss_after']:.0f} "
              f"(+{r['rss_peak'] - r['rss_before']:.0f}) | {r['service_cpu']:.0%} | {_loop_cell(r['loop_alone'])}, "
              f"{_loop_cell(r['loop_during'])} | {verdict(r)} |")


def service_for(design: str, port: int, settings: dict[str, str]) -> ServiceProcess:
    env = {"PYTHONPATH": str(ROOT), "EDGETPU_SERVE_LOG_LEVEL": "warning",
           "EDGETPU_SERVE_ZMQ_ENDPOINT": f"tcp://127.0.0.1:{port}",
           **{f"EDGETPU_SERVE_{k.upper()}": v for k, v in settings.items()}}
    argv = [sys.executable, str(ROOT / "bench" / "zmq_libzmq_server.py")] if design == "b" else None
    return ServiceProcess(env, argv=argv).wait_ready()


def run(designs: list[str], attacks: list[str], seconds: float, rate: float, settings: dict[str, str]) -> dict:
    report = {}
    for design in designs:
        print(f"  design ({design}), load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at its start",
              flush=True)
        port = free_port()
        service = service_for(design, port, settings)
        rows = []
        try:
            for name in attacks:
                rows.append(run_attack(service, port, name, seconds, rate))
                print(f"  ({design}) {name}: {verdict(rows[-1])}", flush=True)
        finally:
            log = service.stop()
        print_rows(design, rows)
        report[design] = rows
        tail = [line for line in log.splitlines() if "Traceback" in line]
        if tail:
            print(f"\n(the service's log holds {len(tail)} tracebacks)")
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "client":
        endpoint, seconds, rate = argv[1], float(argv[2]), float(argv[3])
        print(json.dumps(good_client(endpoint, seconds, rate)))
        return 0
    if argv and argv[0] == "probe":
        print(json.dumps(loop_probe(argv[1], float(argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--design", default="a", help="a (the product), b (libzmq), or a,b side by side")
    parser.add_argument("--only", default=",".join(ATTACKS), help="attacks, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="each window: alone, during, after")
    parser.add_argument("--rate", type=float, default=20.0, help="the good client's requests per second")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a service setting (EDGETPU_SERVE_ left out), e.g. --set zmq_accept_models=true")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    settings = dict(pair.split("=", 1) for pair in args.set)
    print(f"ZMQ attacks: python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; each window {args.seconds:g} s, the good client "
          f"{args.rate:g} req/s with Frigate's {FRIGATE_TIMEOUT_MS} ms timeout; targets: p99 < {TARGET_P99_MS:g} ms "
          f"during, RSS growth < {TARGET_RSS_MB:g} MB, all answered after")
    report = run(args.design.split(","), args.only.split(","), args.seconds, args.rate, settings)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
