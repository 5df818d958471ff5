"""A FAKE sysfs of the PCIe Edge TPU's driver (gasket/apex): the files it exposes per TPU, written by the tests."""

from __future__ import annotations

from pathlib import Path


def fake_apex(sysfs: Path, name: str, millidegrees: int, *, driver_files: bool = True) -> Path:
    """apex_N as the gasket/apex driver shows it, with its default trip points (85, 90, 95 °C) and hardware
    warnings (100 °C, 110 °C), the second one enabled here."""
    entry = sysfs / name
    entry.mkdir(parents=True, exist_ok=True)
    (entry / "temp").write_text(f"{millidegrees}\n")
    if driver_files:
        for i, at in enumerate((85000, 90000, 95000)):
            (entry / f"trip_point{i}_temp").write_text(f"{at}\n")
        for level, at, enabled in ((1, 100000, 0), (2, 110000, 1)):
            (entry / f"hw_temp_warn{level}").write_text(f"{at}\n")
            (entry / f"hw_temp_warn{level}_en").write_text(f"{enabled}\n")
    return entry
