"""How many Edge TPUs this host gives the service, and the most segments of a model it serves: what
EDGETPU_SERVE_PROCESSES=auto needs, counted in a child process.

In a child, because the master that counts then forks the workers: libedgetpu (and libusb under it)
may start threads and keep handles, which a fork does not carry over sanely. The child lists the TPUs
as the Edge TPU plug-in does at start (EDGETPU_SERVE_EDGETPU_DEVICES, the version check), opens none,
prints one JSON line and exits.

    python -m app.processes.inventory      # {"tpus": 2, "segments": 1, "error": null}
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from app.processes.slots import processes_for
from app.settings import Settings

log = logging.getLogger(__name__)

COUNT_TIMEOUT_S = 60.0  # importing the TFLite runtime on a loaded board; listing takes milliseconds
EDGETPU = "edgetpu"


@dataclass(frozen=True)
class Inventory:
    tpus: int
    segments: int       # the most segments of a model to serve (1: none is segmented)
    error: str | None   # why no TPU was counted, when none was


def take(settings: Settings) -> Inventory:
    """The TPUs and segments, counted here (blocking; the TPUs are listed, not opened)."""
    segments = most_segments(settings)
    if EDGETPU not in settings.backends:
        return Inventory(0, segments, f"{EDGETPU} is not among EDGETPU_SERVE_BACKENDS")
    from app.edgetpu.errors import EdgeTpuUnavailable
    from app.engines.edgetpu import EdgeTpuSettings, check_tpus
    from app.errors import ServeError

    try:
        config = EdgeTpuSettings(**settings.plugins.get(EDGETPU, {}))
        return Inventory(len(check_tpus(config.library, config.devices, config.version_check).targets), segments, None)
    except (EdgeTpuUnavailable, ServeError, ValueError) as e:
        return Inventory(0, segments, str(e))


def most_segments(settings: Settings) -> int:
    from app.errors import ServeError
    from app.model_dir import discover, read_model_dir

    try:
        found = discover(settings.model_dir)
        names = settings.models or sorted(found)
        counts = [read_model_dir(found[n]).manifest.segments for n in names if n in found]
    except (OSError, ServeError, ValueError):
        return 1  # the start itself will say what is wrong
    return max((s.count for s in counts if s is not None), default=1)


def count(timeout_s: float = COUNT_TIMEOUT_S) -> Inventory:
    """take() in a child process with this process's environment and this checkout first on its path."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run([sys.executable, "-m", __name__], env=env, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
        line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        found = json.loads(line)
        return Inventory(int(found["tpus"]), int(found["segments"]), found["error"])
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, IndexError) as e:
        return Inventory(0, 1, f"the TPUs could not be counted: {e}")


def process_count(settings: Settings) -> int:
    """EDGETPU_SERVE_PROCESSES as a number: as set, or for `auto` one per TPU listed (fewer for a segmented
    model, or with fewer cores: slots.processes_for), one without an Edge TPU backend or TPU."""
    if settings.processes != "auto":
        return settings.processes
    if EDGETPU not in settings.backends:
        return 1
    from app.engines.edgetpu import EdgeTpuSettings

    configured = EdgeTpuSettings(**settings.plugins.get(EDGETPU, {})).devices
    # TPUs named (EDGETPU_SERVE_EDGETPU_DEVICES, as the Dev Board image does): one each, no listing needed;
    # a spec that names no TPU stops the start with the plug-in's own message
    found = Inventory(len(configured), most_segments(settings), None) if configured else count()
    processes = processes_for(found.tpus, found.segments, os.cpu_count() or 1)
    log.info("EDGETPU_SERVE_PROCESSES=auto: %d process(es) for %d TPU(s)%s%s", processes, found.tpus,
             f", models in up to {found.segments} segments" if found.segments > 1 else "",
             f" ({found.error})" if found.error else "")
    return processes


def main() -> int:
    found = take(Settings())
    print(json.dumps({"tpus": found.tpus, "segments": found.segments, "error": found.error}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
