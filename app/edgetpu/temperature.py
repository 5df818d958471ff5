"""The PCIe Edge TPU driver (gasket/apex) exposes each TPU's temperature as <apex_dir>/apex_N/temp."""

from __future__ import annotations

from pathlib import Path


def apex_temperatures(apex_dir: Path) -> list[tuple[str, float]]:
    """(apex_N, degrees C) for each TPU whose driver exposes `temp` (millidegrees Celsius)."""
    out = []
    try:
        entries = sorted(apex_dir.glob("apex_*"))
    except OSError:
        return out
    for entry in entries:
        try:
            out.append((entry.name, int((entry / "temp").read_text().strip()) / 1000))
        except (OSError, ValueError):
            continue  # no sensor, or unreadable now: no sample rather than a wrong one
    return out
