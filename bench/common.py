"""What the benchmarks share: the repo, a real photo, and the service in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib import metadata
from pathlib import Path

READY_TIMEOUT_S = 120
POLL_S = 0.1


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def default_photo() -> Path:
    """scikit-learn's china.jpg (640x427 JPEG), found without importing scikit-learn."""
    return Path(metadata.distribution("scikit-learn").locate_file("sklearn/datasets/images/china.jpg"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """`python -m app` on a free port, ready when the context is entered, stopped on exit."""

    def __init__(self, workers: int, backends: str = "cpu", cpu_threads: int = 1):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("EDGETPU_SERVE_")}
        self.env = {**inherited, "EDGETPU_SERVE_HOST": "127.0.0.1", "EDGETPU_SERVE_PORT": str(self.port),
                    "EDGETPU_SERVE_WORKERS": str(workers), "EDGETPU_SERVE_CPU_THREADS": str(cpu_threads),
                    "EDGETPU_SERVE_BACKENDS": backends, "EDGETPU_SERVE_LOG_LEVEL": "warning"}
        self.process: subprocess.Popen | None = None
        # a file, not a pipe: nobody reads the service's log while it runs, and a full pipe stalls it
        self.log = tempfile.TemporaryFile(mode="w+")

    def __enter__(self) -> ServiceProcess:
        self.process = subprocess.Popen([sys.executable, "-m", "app"], cwd=repo_root(), env=self.env,
                                        stdout=self.log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"service exited with {self.process.returncode}: {self.log.read()}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(POLL_S)
        self.__exit__(None, None, None)
        raise RuntimeError(f"service not ready within {READY_TIMEOUT_S} s")

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
