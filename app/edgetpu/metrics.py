"""The Edge TPU plug-in's metrics, every family in one place: the TPUs in service and listed, the probe's rounds
and the TPUs that joined and left, each TPU's health, and the PCIe TPUs' temperatures with the driver's trip points
and alarms and the service's own warning threshold. Read at each scrape (app/engines/edgetpu.py `collect`, through
the core's state collector, app/metrics.py); the core's own metrics are all in app/metrics.py. See docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from app.edgetpu.inventory import CHANGES, PROBE_RESULTS, Inventory
from app.edgetpu.temperature import ApexTemperature, TemperatureWatch


def device_families(prefix: str, inventory: Inventory | None, healthy: dict[str, bool],
                    temperatures: TemperatureWatch) -> Iterator[tuple[GaugeMetricFamily | CounterMetricFamily, str]]:
    """/metrics: each family with how the series of several processes merge (app/metrics.py merged_by): the TPUs
    in service and listed, the probe's rounds and the TPUs that joined and left, each TPU's health (`healthy`:
    device -> every interpreter on it healthy), the PCIe TPUs' temperatures and the warning threshold."""
    count = GaugeMetricFamily(f"{prefix}_devices", "Edge TPUs in service now (the probe follows them)")
    count.add_metric([], len(inventory.in_service) if inventory is not None else 0)
    yield count, "sum"  # several processes: each TPU is one process's, so the counts add up
    listed = GaugeMetricFamily(f"{prefix}_devices_listed", "Edge TPUs libedgetpu listed at the last probe")
    listed.add_metric([], len(inventory.listed) if inventory is not None else 0)
    yield listed, "max"  # every process lists them all
    probes = CounterMetricFamily(f"{prefix}_probes", "Probe rounds (the TPUs listed again), by result: "
                                 "unchanged, changed (a TPU joined or left), failed", labels=("result",))
    changes = CounterMetricFamily(f"{prefix}_device_changes", "TPUs taken into service (joined) and gone "
                                  "from it (left) since start", labels=("change",))
    if inventory is not None:
        for result in PROBE_RESULTS:
            probes.add_metric([result], inventory.counts.probes[result])
        for change in CHANGES:
            changes.add_metric([change], inventory.counts.changes[change])
    # several processes: one series per process (its slot), since a sum of counts read from the processes
    # alive would drop when one is replaced, and Prometheus would take the drop for a reset
    yield probes, "each"
    yield changes, "each"
    health = GaugeMetricFamily(f"{prefix}_device_healthy", "1 when every interpreter on the TPU is healthy",
                               labels=("device",))
    for device, ok in sorted(healthy.items()):
        health.add_metric([device], 1.0 if ok else 0.0)
    # several processes: each TPU is served by one, which says; another may count an interpreter it lost there
    yield health, "max"
    for family in temperature_families(prefix, temperatures.read(), temperatures.warn_celsius, temperatures.setting):
        yield family, "max"  # every process reads the same sysfs files


def temperature_families(prefix: str, readings: list[ApexTemperature], warn_celsius: float, setting: str):
    """/metrics: the PCIe TPUs' thermal gauges, labelled by apex_N as the driver names them, and the threshold."""
    temperature = GaugeMetricFamily(f"{prefix}_temperature_celsius",
                                    "TPU temperature from <apex_dir>/apex_N/temp (PCIe and Dev Board)",
                                    labels=("device",))
    trips = GaugeMetricFamily(f"{prefix}_temperature_trip_point_celsius",
                              "Where the apex driver lowers the TPU's clock, one step per trip point",
                              labels=("device", "trip_point"))
    warnings = GaugeMetricFamily(f"{prefix}_temperature_hw_warning_celsius",
                                 "The chip's own alarms: level 1 an interrupt, level 2 the shutdown alarm",
                                 labels=("device", "level"))
    enabled = GaugeMetricFamily(f"{prefix}_temperature_hw_warning_enabled",
                                "1 when the chip's alarm of that level is enabled (hw_temp_warnN_en)",
                                labels=("device", "level"))
    for reading in readings:
        temperature.add_metric([reading.device], reading.celsius)
        for i, celsius in enumerate(reading.trip_points_celsius):
            if celsius is not None:
                trips.add_metric([reading.device, str(i)], celsius)
        for warning in reading.hw_warnings:
            warnings.add_metric([reading.device, str(warning.level)], warning.celsius)
            enabled.add_metric([reading.device, str(warning.level)], 1.0 if warning.enabled else 0.0)
    threshold = GaugeMetricFamily(f"{prefix}_temperature_warn_celsius",
                                  f"At or above this a PCIe TPU is reported hot ({setting})")
    threshold.add_metric([], warn_celsius)
    yield from (temperature, trips, warnings, enabled, threshold)
