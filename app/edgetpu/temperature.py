"""The PCIe Edge TPU's temperature, as its driver (gasket/apex) exposes it in sysfs, and the warning above a threshold.

Per TPU, <apex_dir>/apex_N/ holds (millidegrees Celsius, as the driver prints them):
  temp                      the die temperature now;
  trip_point{0,1,2}_temp    where the driver lowers the TPU's clock, one step each (85, 90, 95 °C by default);
  hw_temp_warn{1,2}         where the chip raises its warning interrupt (100 °C) and its shutdown alarm
                            (110 °C), each acting only when its hw_temp_warn{1,2}_en reads 1 (0 by default).
A USB Accelerator has no sensor the host can read. Frigate and CodeProject.AI warn at 80 °C, below the first
trip point: a TPU that hot is about to slow down.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

APEX_GLOB = "apex_*"
TRIP_POINTS = 3
HW_WARNINGS = (1, 2)


@dataclass(frozen=True)
class HwWarning:
    """One of the chip's own temperature alarms: 1 raises an interrupt, 2 the shutdown alarm."""

    level: int
    celsius: float
    enabled: bool


@dataclass(frozen=True)
class ApexTemperature:
    """One PCIe TPU's thermal state: what the driver exposes; None where it exposes nothing readable."""

    device: str                          # apex_N, as in /dev/apex_N
    celsius: float
    trip_points_celsius: tuple[float | None, ...]
    hw_warnings: tuple[HwWarning, ...]

    def as_report(self, warn_celsius: float) -> dict:
        """GET /v1/devices' `temperature` object (app/edgetpu/report.py TemperatureOut)."""
        return dict(celsius=self.celsius, warn_celsius=warn_celsius, hot=self.celsius >= warn_celsius,
                    trip_points_celsius=list(self.trip_points_celsius),
                    hw_warnings=[dict(level=w.level, celsius=w.celsius, enabled=w.enabled) for w in self.hw_warnings])

    def hot_text(self, warn_celsius: float, setting: str) -> str:
        """Why this TPU is a problem, and what to do: the degraded reason and the warning line."""
        trips = [t for t in self.trip_points_celsius if t is not None]
        slows = (f"; the driver lowers its clock from {trips[0]:g} °C (trip points "
                 f"{', '.join(f'{t:g}' for t in trips)} °C)") if trips else ""
        return (f"{self.device} at {self.celsius:g} °C, at or above {setting}={warn_celsius:g}{slows}. Fix: cool it "
                "(airflow, a heatsink; an M.2 card in a closed case runs hot), or lower its clock with "
                "EDGETPU_SERVE_EDGETPU_PERFORMANCE=High or Medium")


def _millidegrees(path: Path) -> float | None:
    try:
        return int(path.read_text().strip()) / 1000
    except (OSError, ValueError):
        return None


def _flag(path: Path) -> bool | None:
    try:
        return int(path.read_text().strip()) != 0
    except (OSError, ValueError):
        return None


def read_apex(entry: Path) -> ApexTemperature | None:
    """One apex_N directory; None when it has no readable `temp` (no sensor, or unreadable now)."""
    celsius = _millidegrees(entry / "temp")
    if celsius is None:
        return None
    trips = tuple(_millidegrees(entry / f"trip_point{i}_temp") for i in range(TRIP_POINTS))
    warnings = []
    for level in HW_WARNINGS:
        at, enabled = _millidegrees(entry / f"hw_temp_warn{level}"), _flag(entry / f"hw_temp_warn{level}_en")
        if at is not None:
            warnings.append(HwWarning(level, at, bool(enabled)))
    return ApexTemperature(entry.name, celsius, trips, tuple(warnings))


def apex_temperatures(apex_dir: Path) -> list[ApexTemperature]:
    """Every PCIe TPU whose driver exposes its temperature, by name."""
    try:
        entries = sorted(apex_dir.glob(APEX_GLOB))
    except OSError:
        return []
    return [found for entry in entries if (found := read_apex(entry)) is not None]


class TemperatureWatch:
    """Reads the TPUs' temperatures and says when one crosses the threshold: a warning line when it gets
    hot, one line when it is back below, nothing in between (the readings come at every /readyz, /metrics
    and /v1/devices, so a line per reading would flood the log)."""

    def __init__(self, apex_dir: Path, warn_celsius: float, setting: str):
        self.apex_dir = apex_dir
        self.warn_celsius = warn_celsius
        self.setting = setting
        self._hot: set[str] = set()
        self._lock = threading.Lock()  # readers on the event loop and in threads: one line per crossing

    def read(self) -> list[ApexTemperature]:
        readings = apex_temperatures(self.apex_dir)
        with self._lock:
            for reading in readings:
                hot = reading.celsius >= self.warn_celsius
                if hot and reading.device not in self._hot:
                    self._hot.add(reading.device)
                    log.warning("Edge TPU %s", reading.hot_text(self.warn_celsius, self.setting))
                elif not hot and reading.device in self._hot:
                    self._hot.discard(reading.device)
                    log.info("Edge TPU %s back at %g °C, below %s=%g", reading.device, reading.celsius,
                             self.setting, self.warn_celsius)
        return readings

    def hot(self) -> dict[str, str]:
        """apex_N -> why it is a problem, for each TPU at or above the threshold now."""
        return {r.device: r.hot_text(self.warn_celsius, self.setting)
                for r in self.read() if r.celsius >= self.warn_celsius}
