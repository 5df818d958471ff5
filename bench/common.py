"""What the benchmarks share: the repo, a real photo, and the service in a subprocess."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from bench.service import ROOT, ServiceProcess


def repo_root() -> Path:
    return ROOT


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages ("-" where /proc/loadavg is missing): printed
    beside figures, since a shared machine's load moves them more than most changes do."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "-"


def default_photo() -> Path:
    """scikit-learn's china.jpg (640x427 JPEG), found without importing scikit-learn."""
    return Path(metadata.distribution("scikit-learn").locate_file("sklearn/datasets/images/china.jpg"))


def bench_service(workers: int, backends: str = "cpu", cpu_threads: int = 1,
                  extra: dict[str, str] | None = None) -> ServiceProcess:
    """The service configured only by these arguments and `extra` settings (the caller's
    EDGETPU_SERVE_* are ignored); use it as a context manager: ready on entry, stopped on exit."""
    return ServiceProcess({"EDGETPU_SERVE_WORKERS": str(workers), "EDGETPU_SERVE_CPU_THREADS": str(cpu_threads),
                           "EDGETPU_SERVE_BACKENDS": backends, "EDGETPU_SERVE_LOG_LEVEL": "warning", **(extra or {})},
                          inherit_settings=False)
