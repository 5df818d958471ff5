"""Why this process has too few Edge TPUs, said as the start-up check says it, with the fix: none listed, a spec that
names none, no access to them, all of them other processes' (DEVICE_SHARE), fewer than a pipeline's segments.
The Edge TPU plug-in (app/engines/edgetpu.py) raises or records these; nothing here opens a device."""

from __future__ import annotations

from app.edgetpu.access import DeviceTree
from app.edgetpu.claims import Claims
from app.edgetpu.environment import usable_targets
from app.edgetpu.errors import EdgeTpuUnavailable
from app.edgetpu.inventory import Inventory
from app.model_dir.reading import ModelDir


def probe_note(interval_s: float) -> str:
    """What the probe will do about it (nothing said where it is off)."""
    if not interval_s:
        return ""
    return (f" (the TPUs are listed again every {interval_s:g} s, EDGETPU_SERVE_EDGETPU_PROBE_INTERVAL_S: "
            "a TPU plugged in is used without a restart)")


def shared(claims: Claims) -> str:
    """Where several processes share the TPUs: how many fit, and what a process without its TPUs does."""
    count, unit, present = claims.share.count, claims.unit, claims.present
    sets = f", in sets of {unit} for a model in {unit} segments (a pipeline's TPUs are in one process)" \
        if unit > 1 else ""
    most = present // unit
    fix = (f"at most {most} process(es) (EDGETPU_SERVE_PROCESSES, or gunicorn's --workers)" if most
           else "plug in more TPUs, or segment the model into fewer parts")
    return (f"{count} processes share {present} usable TPU(s){sets}; the others hold them, and a TPU is "
            f"opened by one process only. Fix: {fix}; or EDGETPU_SERVE_EDGETPU_ON_FAILURE=fallback: a process "
            "without its TPUs serves on the CPU, and claims them once they are freed or plugged in")


def too_few(model_dir: ModelDir, tpus: int, claims: Claims | None) -> str | None:
    """A model cut into more segments (one per TPU, app/pool/pipeline.py) than TPUs in service: why; else None."""
    segments = model_dir.manifest.segments
    if segments is None or tpus >= segments.count:
        return None
    why = f"model {model_dir.name!r} is cut into {segments.count} segments, one per TPU, and {tpus} TPU(s) "
    if claims is None:
        return why + "are in service. Fix: plug in more TPUs, or segment it into fewer parts"
    return why + f"are this process's (a pipeline's TPUs are in one process). {shared(claims)}"


def no_tpu(inventory: Inventory, devices: list[str], claims: Claims | None, tree: DeviceTree,
           note: str) -> EdgeTpuUnavailable:
    """Why no TPU is in service now: none listed, a spec (EDGETPU_DEVICES) that names none, no access to them,
    every one another process's; `note` said after it (what the probe will do)."""
    if inventory.error:
        return EdgeTpuUnavailable(f"cannot list the Edge TPUs: {inventory.error}{note}")
    try:
        usable_targets(inventory.listed, devices, inventory.library.path, tree)
    except EdgeTpuUnavailable as e:
        return EdgeTpuUnavailable(f"{e}{note}")
    if claims is not None:
        return EdgeTpuUnavailable(f"none of the {len(inventory.listed)} Edge TPU(s) listed is this process's: "
                                  f"{shared(claims)}{note}")
    return EdgeTpuUnavailable(f"none of the {len(inventory.listed)} Edge TPU(s) listed is this process's{note}")
