"""`python -m app` in a subprocess: the one launcher the tests and the benchmarks share.

Start it on a free local port with settings from env, wait until /readyz answers 200, stop it
with SIGTERM and then SIGKILL after a bound. The child's output goes to a temporary file, not
a pipe: nobody reads a pipe while the service runs, and a full one would stall a chatty child.
`output()` gives what it wrote so far, for failure messages.

Example usage:
    with ServiceProcess({"EDGETPU_SERVE_BACKENDS": "cpu,emulated"}) as service:
        urllib.request.urlopen(f"{service.url}/v1/models")

From a shell script (bench/curl_bench.sh --start): run a command while the service is up, with
`{url}` in its arguments (and $BENCH_SERVICE_URL) naming it; stopped when the command ends or
this launcher is told to stop (SIGTERM, SIGINT):
    python bench/service.py --only-these --set EDGETPU_SERVE_BACKENDS=cpu -- curl -s '{url}/v1/models'
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 120  # a loaded 2-core machine can take tens of seconds to import and warm up
STOP_TIMEOUT_S = 15    # SIGTERM, then SIGKILL: shutdown drains, but never forever
POLL_S = 0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """The service of this checkout on 127.0.0.1:<free port>, started at construction.

    `env` is added to the environment; with `inherit_settings=False` the caller's own
    EDGETPU_SERVE_* variables are dropped first, so only `env` configures the service.
    """

    def __init__(self, env: dict[str, str] | None = None, inherit_settings: bool = True, *,
                 argv: list[str] | None = None, cwd: Path = ROOT, port: int | None = None,
                 ready_path: str = "/readyz"):
        """`argv` replaces `python -m app` (a benchmark's own launcher, or another server), started in
        `cwd`; `port` is the one it will listen on when the caller must tell it by other means;
        `ready_path` answers 200 once it serves."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready_path = ready_path
        inherited = {k: v for k, v in os.environ.items() if inherit_settings or not k.startswith("EDGETPU_SERVE_")}
        self.env = {**inherited, "EDGETPU_SERVE_HOST": "127.0.0.1", "EDGETPU_SERVE_PORT": str(self.port),
                    **(env or {})}
        self._log = tempfile.TemporaryFile(mode="w+b")
        self.process = subprocess.Popen(argv or [sys.executable, "-m", "app"], cwd=cwd, env=self.env,
                                        stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        """Everything the service has written to stdout and stderr so far."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def memory_mb(self) -> dict[str, float]:
        """The process's resident memory now (VmRSS) and at its peak (VmHWM), MB, from /proc."""
        fields = {}
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
        return fields

    def reset_peak_memory(self) -> None:
        """Start VmHWM again from the resident memory now (Linux: clear_refs 5), so that memory_mb()'s peak is
        the peak since this call: of an attack, not of the start-up."""
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def open_files(self) -> int:
        """File descriptors the process holds (sockets included)."""
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> ServiceProcess:
        """Return once the ready path (/readyz) is 200; raise with the service's output if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited with {self.process.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(f"{self.url}{self.ready_path}", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:  # refused while starting, or 503 until loaded
                pass
            time.sleep(POLL_S)
        self.stop()
        raise RuntimeError(f"service not ready within {timeout_s} s:\n{self.output()}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> str:
        """SIGTERM, SIGKILL if it has not exited within timeout_s; returns its output. Idempotent."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.output()

    def __enter__(self) -> ServiceProcess:
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


COMMAND_STOP_S = 30  # the command is told to stop first; it may finish its current request


def run_with_service(command: list[str], env: dict[str, str], inherit_settings: bool) -> int:
    """Start the service, run `command` ({url} replaced) while it is up, stop both; the command's exit code.
    SIGTERM and SIGINT stop the command and then the service: nothing is left running."""
    def stop_on(signum, _frame):
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop_on)
    service = ServiceProcess(env, inherit_settings)
    child = None
    try:
        print(f"starting the service on {service.url}...", file=sys.stderr, flush=True)
        service.wait_ready()
        child = subprocess.Popen([arg.replace("{url}", service.url) for arg in command],
                                 env={**os.environ, "BENCH_SERVICE_URL": service.url})
        return child.wait()
    finally:
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(COMMAND_STOP_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        service.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the service (EDGETPU_SERVE_...)")
    parser.add_argument("--only-these", action="store_true",
                        help="drop the caller's own EDGETPU_SERVE_* first: only --set configures the service")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS ({url}: the service's URL)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    pairs = [item.partition("=") for item in args.set]
    if not command or any(not sep or not name for name, sep, _ in pairs):
        parser.error("usage: [--set NAME=VALUE ...] -- COMMAND ARGS")
    try:
        return run_with_service(command, {name: value for name, _, value in pairs}, not args.only_these)
    except RuntimeError as e:  # not ready: exited or timed out, with its output
        print(e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
