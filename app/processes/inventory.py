"""How many devices (TPUs) this host gives the service, and the most segments of a model it serves: what
EDGETPU_SERVE_PROCESSES=auto needs, counted in a child process.

In a child, because the master that counts then forks the workers: a device's library (and libusb under
it) may start threads and keep handles, which a fork does not carry over sanely. The child asks each
configured plug-in that lists devices of its own to count them as it would at start (its settings, its
version check: Backend.count_devices), opens none, prints one JSON line and exits. Devices named in the
settings are counted without a child (Backend.named_devices).

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

# Fixed, not a setting: importing the TFLite runtime on a loaded board; listing takes milliseconds.
COUNT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Inventory:
    tpus: int
    segments: int       # the most segments of a model to serve (1: none is segmented)
    error: str | None   # why no TPU was counted, when none was


def device_plugins(settings: Settings) -> list[type]:
    """The configured backends' plug-ins that list devices of their own (the Edge TPU's)."""
    from app.engines import BACKENDS

    return [BACKENDS[key] for key in settings.backends if key in BACKENDS and BACKENDS[key].lists_devices]


def take(settings: Settings) -> Inventory:
    """The devices and segments, counted here (blocking; the devices are listed, not opened)."""
    from app.errors import ServeError

    segments = most_segments(settings)
    plugins = device_plugins(settings)
    if not plugins:
        return Inventory(0, segments, "no backend of EDGETPU_SERVE_BACKENDS has devices of its own")
    found, problems = 0, []
    for plugin in plugins:
        try:
            found += plugin.count_devices(settings)
        except (ServeError, ValueError) as e:
            problems.append(str(e))
    return Inventory(found, segments, None if found else "; ".join(problems) or None)


def most_segments(settings: Settings) -> int:
    from app.errors import ServeError
    from app.model_dir.reading import discover, read_model_dir

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
    """EDGETPU_SERVE_PROCESSES as a number: as set, or for `auto` one per device listed (fewer for a segmented
    model, or with fewer cores: slots.processes_for), one without a backend that has devices, or a device."""
    if settings.processes != "auto":
        return settings.processes
    plugins = device_plugins(settings)
    if not plugins:
        return 1
    # devices named in the settings (EDGETPU_SERVE_EDGETPU_DEVICES, as the Dev Board image does): one each, no
    # listing needed; a name that matches no device stops the start with the plug-in's own message
    named = [plugin.named_devices(settings) for plugin in plugins]
    found = Inventory(sum(named), most_segments(settings), None) if all(named) else count()
    processes = processes_for(found.tpus, found.segments, os.cpu_count() or 1)
    log.info("EDGETPU_SERVE_PROCESSES=auto: %d process(es) for %d device(s)%s%s", processes, found.tpus,
             f", models in up to {found.segments} segments" if found.segments > 1 else "",
             f" ({found.error})" if found.error else "")
    return processes


def main() -> int:
    found = take(Settings())
    print(json.dumps({"tpus": found.tpus, "segments": found.segments, "error": found.error}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
