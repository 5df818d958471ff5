"""Every worker's answer made into the one answer of the service: readiness, and the devices.

A model is `ready` where every worker serves it ready; `degraded` where some worker does not serve it
(loading after a restart, failed, not answering) while others do, with each such worker's reason; and
where no worker serves it, the first worker's state. The service is ready when every model is served
somewhere (ready or degraded), as with one process: the kernel gives connections only to workers that
accept, and a worker accepts once its models are loaded.

A device plug-in's report (GET /v1/devices) lists the devices it finds under `devices`, each with its
`path`, whether this process serves on it (`in_service`: it holds its claim) and the `interpreters` it
runs on it: every worker lists every TPU, and serves on its own. Merged, each TPU appears once, as its
owner reports it, with the owner's slot (`worker`: the worker serving on it, else the one with
interpreters on it, else null: nobody's now) and every worker's interpreters on it. A plug-in that follows
its devices (`probe`, the Edge TPU's) reports its own rounds: merged, the counts are summed, the last round
is the latest, it runs where it runs in every worker, and a spec waited for by any worker is listed once.
The rest of a report (library, runtime) is the same in every worker and taken from one.
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
                "versions": {name: m["version"] for name, m in a["models"].items()}, "devices": a["devices"]} if a
               else {"slot": i, "pid": None, "answering": False, "ready": False, "versions": {}, "devices": []}
               for i, a in answers.items()]
    return ready, models, workers


def devices(answers: dict[int, dict | None]) -> tuple[dict[str, dict], list[dict]]:
    """(backend key -> merged report, each worker's devices) from every worker's plug-in reports."""
    merged: dict[str, dict] = {}
    held: dict[int, list[str]] = {i: [] for i in answers}
    probes: dict[str, list[dict]] = {}
    ranks: dict[str, dict[str, int]] = {}  # backend -> path -> how its entry's reporter relates to it
    for i, answer in answers.items():
        for key, report in (answer or {}).get("backends", {}).items():
            if key not in merged:
                merged[key] = {**report, "devices": []} if isinstance(report.get("devices"), list) else report
            if isinstance(report.get("probe"), dict):
                probes.setdefault(key, []).append(report["probe"])
            if not isinstance(report.get("devices"), list):
                continue
            target = merged[key]["devices"]
            for device in report["devices"]:
                _merge_device(target, device, i, ranks.setdefault(key, {}))
                if _owns(device):
                    held[i].append(device.get("path"))
    for key, each in probes.items():
        merged[key]["probe"] = merge_probes(each)
    workers = [{"slot": i, "answering": answers[i] is not None, "devices": paths} for i, paths in held.items()]
    return merged, workers


def _owns(device: dict[str, Any]) -> bool:
    """Whether the worker that reported this entry serves on the device (a plug-in that does not say:
    runs interpreters on it)."""
    return bool(device["in_service"] if "in_service" in device else device.get("interpreters"))


def _merge_device(target: list[dict[str, Any]], device: dict[str, Any], worker: int, ranks: dict[str, int]) -> None:
    """Add one worker's entry for a device: the first entry of its path stays until the worker serving on it
    (else one with interpreters on it) reports it, whose entry it becomes, with its slot; every worker's
    interpreters on it join it."""
    entry = next((d for d in target if d.get("path") == device.get("path")), None)
    if entry is None:
        entry = {**device, "interpreters": [], "worker": None}
        target.append(entry)
    interpreters = device.get("interpreters") or []
    rank = 2 if _owns(device) else 1 if interpreters else 0  # serves on it, runs interpreters on it, neither
    if rank > ranks.get(entry["path"], 0):
        entry.update({k: v for k, v in device.items() if k != "interpreters"}, worker=worker)
        ranks[entry["path"]] = rank
    entry["interpreters"] = entry["interpreters"] + interpreters


def merge_probes(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """Every worker's probe report as one: counts summed, the latest round, running only where all run."""
    first = probes[0]

    def summed(key: str) -> dict[str, int]:
        return {name: sum(p[key].get(name, 0) for p in probes) for name in first[key]}

    return {**first, "running": all(p["running"] for p in probes),
            "last_probe": max((p["last_probe"] for p in probes if p["last_probe"]), default=None),
            "in_service": sum(p["in_service"] for p in probes),
            "waiting_for": list(dict.fromkeys(spec for p in probes for spec in p["waiting_for"])),
            "probes": summed("probes"), "changes": summed("changes"),
            "error": next((p["error"] for p in probes if p["error"]), None)}
