"""The start-up check: libedgetpu present, a pinned pair with the TFLite runtime, TPUs reachable.

Run before any model loads, so a missing library, device or permission stops the
service (or sends it to the CPU fallback) with one message instead of a load error
per model. `check_library()` is its first half (the library and the version pair: what does not
change while the service runs); which TPUs are there is asked again while it runs
(app/edgetpu/inventory.py). `probe()` answers the same questions without raising, for GET /v1/devices.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from app.edgetpu.access import HOST, DeviceTree, access_problem, no_device_message
from app.edgetpu.delegate import Target, resolve_targets
from app.edgetpu.library import Device, EdgeTpuLibrary
from app.edgetpu.versions import (
    LibraryVersion,
    VersionSet,
    check_pairing,
    installed_package_version,
    matching_set,
    mismatch_message,
    parse_runtime_version,
)
from app.edgetpu.errors import EdgeTpuUnavailable, EdgeTpuVersionMismatch

log = logging.getLogger(__name__)

VersionCheck = Literal["strict", "warn"]


@dataclass(frozen=True)
class CheckedLibrary:
    """libedgetpu loaded, and paired with the TFLite runtime (or the pair's check set to warn)."""

    library: EdgeTpuLibrary
    version: LibraryVersion
    pinned_set: VersionSet | None


@dataclass(frozen=True)
class EdgeTpuEnvironment(CheckedLibrary):
    devices: list[Device]
    targets: list[Target]


@dataclass
class Probe:
    """What GET /v1/devices reports: every field filled as far as the checks got."""

    library_path: str
    loaded: bool = False
    version: LibraryVersion | None = None
    pinned_set: VersionSet | None = None
    devices: list[Device] = field(default_factory=list)
    error: str | None = None


def library_version(library: EdgeTpuLibrary) -> LibraryVersion:
    text = library.version()
    return LibraryVersion(text, parse_runtime_version(text), installed_package_version())


def check_library(library_path: str, runtime_name: str, runtime_version: str,
                  version_check: VersionCheck = "strict") -> CheckedLibrary:
    """libedgetpu loads and pairs with the TFLite runtime; EdgeTpuUnavailable (or its
    EdgeTpuVersionMismatch) if not. Neither changes while the service runs."""
    library = EdgeTpuLibrary(library_path)
    version = library_version(library)
    try:
        pinned = check_pairing(version, runtime_name, runtime_version)
    except EdgeTpuVersionMismatch:
        if version_check == "strict":
            raise
        log.warning("EDGETPU_SERVE_EDGETPU_VERSION_CHECK=warn: %s",
                    mismatch_message(version, runtime_name, runtime_version))
        pinned = None
    return CheckedLibrary(library, version, pinned)


def check_environment(library_path: str, requested: list[str], runtime_name: str, runtime_version: str,
                      version_check: VersionCheck = "strict", tree: DeviceTree = HOST) -> EdgeTpuEnvironment:
    """Everything the edgetpu backend needs before a delegate is created; EdgeTpuUnavailable if not."""
    checked = check_library(library_path, runtime_name, runtime_version, version_check)
    devices = checked.library.list_devices()
    targets = usable_targets(devices, requested, library_path, tree)
    return EdgeTpuEnvironment(checked.library, checked.version, checked.pinned_set, devices, targets)


def usable_targets(devices: list[Device], requested: list[str], library_path: str,
                   tree: DeviceTree = HOST) -> list[Target]:
    """Every requested TPU listed and openable: EdgeTpuUnavailable naming the first problem otherwise."""
    if not devices:
        raise EdgeTpuUnavailable(no_device_message(library_path, tree))
    try:
        targets = resolve_targets(requested, devices)
    except ValueError as e:
        raise EdgeTpuUnavailable(f"{e}. Fix: set EDGETPU_SERVE_EDGETPU_DEVICES to specs that exist "
                                 "(empty = every TPU listed)") from None
    problems = [f"{t.requested}: {problem}" for t in targets if (problem := access_problem(t.device, tree))]
    if problems:
        raise EdgeTpuUnavailable("cannot open the Edge TPU " + "; ".join(problems))
    return targets


def probe(library_path: str, runtime_name: str, runtime_version: str, tree: DeviceTree = HOST) -> Probe:
    report = Probe(library_path)
    try:
        library = EdgeTpuLibrary(library_path)
    except EdgeTpuUnavailable as e:
        report.error = str(e)
        return report
    report.loaded = True
    report.version = library_version(library)
    report.pinned_set = matching_set(report.version, runtime_name, runtime_version)
    report.devices = library.list_devices()
    if report.pinned_set is None:
        report.error = mismatch_message(report.version, runtime_name, runtime_version)
    elif not report.devices:
        report.error = no_device_message(library_path, tree)
    return report
