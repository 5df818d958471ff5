"""What a killed worker costs, and how the worker processes share connections (app/processes, docs/launch.md).

For each checkout, one `python -m app` group of two worker processes (the cpu backend, fashion_mnist):
  kills     C clients, each sending classify requests one after another on a new connection each, while a
            worker is SIGKILLed K times (each time once the group is whole and ready again): the requests that
            failed at each kill, and whether any client failed twice at one kill (more than it had in flight).
            --stall S stops each replacement for S seconds as soon as it is forked (SIGSTOP, then SIGCONT), as
            a loaded machine delays it: a replacement that listens before its models are loaded shows then.
  spread    N connections opened one after another (and N at once), T times: how many the busier worker
            accepted, read from /proc (the server side of each connection is in one worker's descriptors).
--busy B runs B busy loops beside it all (a loaded machine). Every loop and wait is bounded; the services and the
busy loops are stopped at the end.

Example usage:
    python bench/worker_kill.py --busy 2                                   # this checkout, ~2 minutes
    python bench/worker_kill.py --checkout /work/main --checkout . --busy 2 --stall 1 --kills 3
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import repo_root  # noqa: E402
from bench.service import ServiceProcess  # noqa: E402

WAIT_S = 120  # a replacement loading, or the group starting, on a loaded 2-core machine


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def until(condition, timeout_s: float, what: str, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout_s} s: {what}")
        time.sleep(poll_s)
    return value


class Group(ServiceProcess):
    """Two worker processes of `checkout` on the cpu backend; ready (every worker answering) when constructed."""

    def __init__(self, checkout: Path):
        env = {"PYTHONPATH": str(checkout), "EDGETPU_SERVE_MODELS": "fashion_mnist",
               "EDGETPU_SERVE_DEFAULT_MODEL": "fashion_mnist", "EDGETPU_SERVE_BACKENDS": "cpu",
               "EDGETPU_SERVE_PROCESSES": "2", "EDGETPU_SERVE_LOG_LEVEL": "warning"}
        super().__init__(env, inherit_settings=False, cwd=checkout)
        self.wait_whole()

    def wait_whole(self, without: int | None = None) -> list[int]:
        """The workers' pids once both answer ready (and `without` is not among them)."""
        def whole():
            try:
                answer = httpx.get(f"{self.url}/readyz", timeout=10).json()
            except (httpx.HTTPError, ValueError):
                return None
            pids = [w["pid"] for w in answer.get("workers", [])]
            ready = answer.get("ready") and len(pids) == 2 and all(w["answering"] and w["ready"]
                                                                   for w in answer["workers"])
            return pids if ready and without not in pids else None
        return until(whole, WAIT_S, "both workers ready")


def kills(group: Group, clients: int, count: int, stall_s: float, image: bytes) -> list[tuple[int, bool]]:
    """(failed requests, whether a client failed twice) at each of `count` kills."""
    stop = threading.Event()
    events: list[tuple[int, str]] = []  # (client, status or failure)

    def client(index: int) -> None:
        deadline = time.monotonic() + WAIT_S * (count + 1)
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                r = httpx.post(f"{group.url}/v1/classify", files={"image": image}, timeout=30)
                events.append((index, str(r.status_code)))
            except httpx.HTTPError as e:
                events.append((index, type(e).__name__))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    results = []
    try:
        for k in range(count):
            workers = group.wait_whole()
            until(lambda n=len(events): len(events) >= n + 5, WAIT_S, "requests answered before the kill")
            start = len(events)
            os.kill(workers[k % 2], signal.SIGKILL)
            if stall_s:
                new = until(lambda: [p for p in children(group.process.pid) if p not in workers], WAIT_S,
                            "the replacement forked", poll_s=0.001)
                for pid in new:
                    os.kill(pid, signal.SIGSTOP)
                time.sleep(stall_s)
                for pid in new:
                    os.kill(pid, signal.SIGCONT)
            group.wait_whole(without=workers[k % 2])
            until(lambda n=len(events): len(events) >= n + 5, WAIT_S, "requests answered after the kill")
            failed = [c for c, what in events[start:] if what != "200"]
            results.append((len(failed), len(failed) != len(set(failed))))
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    return results


def _inode(server_port: int, client_port: int) -> int | None:
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)) == (server_port, client_port):
            return int(fields[9]) or None
    return None


def worker_of(connection: socket.socket, pids: list[int]) -> int:
    """The worker whose descriptors hold the server side of `connection` (once it has accepted it)."""
    target = None

    def accepted():
        nonlocal target
        target = target or _inode(connection.getpeername()[1], connection.getsockname()[1])
        for pid in pids:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if target and os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{target}]":
                        return pid
                except OSError:
                    pass
        return None
    return until(accepted, 30, "the connection accepted", poll_s=0.005)


def spread(group: Group, connections: int, tries: int, together: bool) -> list[int]:
    """How many of `connections` the busier worker accepted, at each try."""
    pids = group.wait_whole()
    busier = []
    for _ in range(tries):
        opened: list[socket.socket] = [None] * connections  # type: ignore[list-item]

        def connect(i: int) -> None:
            opened[i] = socket.create_connection(("127.0.0.1", group.port), timeout=10)
        if together:
            threads = [threading.Thread(target=connect, args=(i,)) for i in range(connections)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        else:
            for i in range(connections):
                connect(i)
        owners = [worker_of(c, pids) for c in opened]
        busier.append(max(owners.count(p) for p in pids))
        for c in opened:
            c.close()
        time.sleep(0.3)  # the connections closed on the workers' side too
    return busier


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", action="append", type=Path, default=None, help="checkout(s), one after another")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--stall", type=float, default=0.0, help="seconds each replacement is stopped once forked")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--tries", type=int, default=12)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside (a loaded machine)")
    args = parser.parse_args(argv)
    encoded = io.BytesIO()
    Image.new("RGB", (64, 64), (120, 80, 40)).save(encoded, "JPEG")
    image_bytes = encoded.getvalue()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        print(f"{os.cpu_count()} CPUs, {args.busy} busy loops beside; net.ipv4.tcp_migrate_req="
              f"{Path('/proc/sys/net/ipv4/tcp_migrate_req').read_text().strip()}")
        print("| checkout | failed at each kill | a client failed twice | busier worker of N one after another "
              "| of N at once |")
        print("|---|---|---|---|---|")
        for checkout in args.checkout or [repo_root()]:
            group = Group(checkout.resolve())
            try:
                at_kills = kills(group, args.clients, args.kills, args.stall, image_bytes)
                sequential = spread(group, args.connections, args.tries, together=False)
                together = spread(group, args.connections, args.tries, together=True)
            finally:
                group.stop()
            print(f"| {checkout} | {[n for n, _ in at_kills]} ({args.clients} clients) | "
                  f"{sum(twice for _, twice in at_kills)} of {len(at_kills)} kills | {sequential} of "
                  f"{args.connections} | {together} of {args.connections} |", flush=True)
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
