"""Every worker's answer made into the one answer of the service: readiness, and the devices.

A model is `ready` where every worker serves it ready; `degraded` where some worker does not serve it
(loading after a restart, failed, not answering) while others do, with each such worker's reason; and
where no worker serves it, the first worker's state. The service is ready when every model is served
somewhere (ready or degraded), as with one process: the kernel gives connections only to workers that
accept, and a worker accepts once its models are loaded.

A device plug-in's report (GET /v1/devices) lists the devices it finds under `devices`, each with its
`path` and the `interpreters` this process runs on it: every worker lists every TPU, and uses its own.
Merged, each TPU appears once, with the interpreters of the worker that uses it and that worker's slot
(`worker`); the rest of a report (library, runtime) is the same in every worker and taken from one.
"""

from __future__ import annotations

from typing import Any

from app.registry.status import SERVING

NOT_ANSWERING = "did not answer (gone, or starting)"


def readiness(answers: dict[int, dict | None]) -> tuple[bool, dict[str, dict], list[dict]]:
    """(ready, model name -> {state, error, since}, each worker's own view) from every worker's status."""
    names = list(dict.fromkeys(name for a in answers.values() if a for name in a["models"]))
    models = {}
    for name in names:
        by_worker = {i: (a["models"].get(name) if a else None) for i, a in answers.items()}
        serving = [m for m in by_worker.values() if m and m["state"] in SERVING]
        notes = [f"worker {i}: " + (NOT_ANSWERING if m is None else
                                    m["state"] + (f": {m['error']}" if m["error"] else ""))
                 for i, m in by_worker.items() if m is None or m["state"] != "ready"]
        if len(serving) == len(by_worker) and all(m["state"] == "ready" for m in serving):
            state = "ready"
        elif serving:
            state = "degraded"
        else:
            state = next((m["state"] for m in by_worker.values() if m), "loading")
        since = max((m["since"] for m in by_worker.values() if m and m["since"]), default=None)
        models[name] = {"state": state, "error": "; ".join(notes) or None, "since": since}
    ready = bool(models) and all(m["state"] in SERVING for m in models.values())
    workers = [{"slot": i, "pid": a["pid"], "answering": True, "ready": a["ready"],
                "versions": {name: m["version"] for name, m in a["models"].items()}} if a else
               {"slot": i, "pid": None, "answering": False, "ready": False, "versions": {}}
               for i, a in answers.items()]
    return ready, models, workers


def devices(answers: dict[int, dict | None]) -> tuple[dict[str, dict], list[dict]]:
    """(backend key -> merged report, each worker's devices) from every worker's plug-in reports."""
    merged: dict[str, dict] = {}
    used: dict[int, list[str]] = {i: [] for i in answers}
    for i, answer in answers.items():
        for key, report in (answer or {}).get("backends", {}).items():
            if key not in merged:
                merged[key] = {**report, "devices": []} if isinstance(report.get("devices"), list) else report
            if not isinstance(report.get("devices"), list):
                continue
            target = merged[key]["devices"]
            for device in report["devices"]:
                _merge_device(target, device, i)
                if device.get("interpreters"):
                    used[i].append(device.get("path"))
    workers = [{"slot": i, "answering": answers[i] is not None, "devices": paths} for i, paths in used.items()]
    return merged, workers


def _merge_device(target: list[dict[str, Any]], device: dict[str, Any], worker: int) -> None:
    """Add one worker's entry for a device: the first entry of its path stays, the interpreters of
    whichever worker uses it join it, with that worker's slot."""
    entry = next((d for d in target if d.get("path") == device.get("path")), None)
    if entry is None:
        entry = {**device, "interpreters": [], "worker": None}
        target.append(entry)
    interpreters = device.get("interpreters") or []
    if interpreters:
        if not entry["interpreters"]:
            entry.update({k: v for k, v in device.items() if k != "interpreters"})
            entry["worker"] = worker
        entry["interpreters"] = entry["interpreters"] + interpreters
