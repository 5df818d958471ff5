"""The floors of the code, read from its imports: the picture and the table of docs/architecture.md.

A room is a top-level module of app/ or one of its packages (a package's subpackages are part of it), and the
converter as a whole. An arrow is an import from one room's code into another's (module level or inside a
function: both make the one depend on the other). A room's floor is one above the highest room it imports, so
every arrow points down; a circle of imports has no floors, and is reported instead of drawn.

    python docs/floors.py          # rewrites docs/img/architecture.json and docs/img/architecture.png
    python docs/floors.py --check  # exit 1 (naming what moved) when the code's floors differ from the JSON

tests/test_architecture_map.py runs the check, so the map cannot drift from the code. Each room has a short
caption here (CAPTIONS): a new room needs one, which is the moment to say in the docs what it is for.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JSON = ROOT / "docs" / "img" / "architecture.json"
PNG = ROOT / "docs" / "img" / "architecture.png"

# One line per room: what it is for (docs/architecture.md says more).
CAPTIONS = {
    "app/__main__.py": "python -m app",
    "app/gunicorn_conf.py": "gunicorn -c python:app.gunicorn_conf",
    "app/gunicorn_app.py": "several processes: gunicorn's master",
    "app/gunicorn_worker.py": "gunicorn worker with our HTTP limits",
    "app/main.py": "the HTTP door: its app assembled",
    "app/service.py": "the Service: built, started, stopped",
    "app/launch.py": "other servers' launches",
    "app/api/": "HTTP front doors: /v1, /v2, DeepStack",
    "app/frontdoors/": "non-HTTP doors: Frigate's ZMQ protocol",
    "app/core/": "the request path as a library",
    "app/processes/": "several workers on one port",
    "app/registry/": "models, versions, leases",
    "app/tasks/": "outputs -> an answer",
    "app/pool/": "line, lanes, members (pipelines too), watchdog",
    "app/engines/": "backend plug-ins: cpu, emulated, edgetpu",
    "app/emulator/": "numpy int8, bit-exact",
    "app/edgetpu/": "libedgetpu, TPUs, versions",
    "app/detection_postprocess.py": "the SSD post-process op",
    "app/imaging/": "bytes -> pixels -> tensor",
    "app/http_server.py": "uvicorn + head, body and connection limits",
    "app/tflite_file.py": ".tflite as plain values",
    "app/model_dir/": "model.json: schema, reading, writing",
    "app/importing/": "what a .tflite file is, or why refused",
    "app/metrics.py": "Prometheus definitions",
    "app/memory.py": "body budget, malloc",
    "app/errors.py": "domain errors with their status",
    "app/faces/": "the face gallery: people, regions, vectors",
    "app/refusal_log.py": "refusals logged, summed per window",
    "app/threads.py": "thread priorities",
    "app/settings.py": "every setting",
    "app/locks.py": "a lock the kernel drops",
    "converter/": "model -> int8 -> Edge TPU (stands alone)",
}


@dataclass(frozen=True)
class Map:
    """Rooms by floor (1 = the ground, nothing of ours below it) and the arrows between them."""

    floors: dict[str, int]
    arrows: list[tuple[str, str]]

    def as_json(self) -> dict:
        return {"floors": dict(sorted(self.floors.items(), key=lambda kv: (-kv[1], kv[0]))),
                "arrows": [list(arrow) for arrow in self.arrows]}


def room_of(path: Path, root: Path) -> str:
    """The room a source file belongs to: converter/, app/<package>/ or app/<module>.py."""
    parts = path.relative_to(root).parts
    if parts[0] == "converter":
        return "converter/"
    return f"app/{parts[1]}/" if len(parts) > 2 else f"app/{parts[1]}"


def room_of_module(dotted: str, root: Path) -> str | None:
    """The room of an imported module (`app.pool.member`, `app.errors`), None when it is not ours."""
    parts = dotted.split(".")
    if parts[0] == "converter":
        return "converter/"
    if parts[0] != "app" or len(parts) < 2:
        return None
    if (root / "app" / parts[1]).is_dir():
        return f"app/{parts[1]}/"
    return f"app/{parts[1]}.py" if (root / "app" / f"{parts[1]}.py").is_file() else None


def imported_modules(path: Path, root: Path) -> set[str]:
    """Every module of ours a file imports (`from app.x import y` may name a module y: both are tried)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def read_map(root: Path = ROOT) -> Map:
    """The rooms and arrows of the tree under root, and each room's floor; ValueError on a circle."""
    edges: dict[str, set[str]] = {}
    for path in sorted([*root.glob("app/**/*.py"), *root.glob("converter/**/*.py")]):
        if path.name == "__init__.py" and path.parent.name == "app":
            continue
        room = room_of(path, root)
        edges.setdefault(room, set())
        for dotted in imported_modules(path, root):
            target = room_of_module(dotted, root)
            if target is not None and target != room:
                edges[room].add(target)
    floors: dict[str, int] = {}

    def floor(room: str, path: tuple[str, ...]) -> int:
        if room in path:
            raise ValueError("a circle of imports: " + " -> ".join([*path[path.index(room):], room]))
        if room not in floors:
            floors[room] = 1 + max((floor(target, (*path, room)) for target in edges[room]), default=0)
        return floors[room]

    for room in edges:
        floor(room, ())
    arrows = sorted((source, target) for source, targets in edges.items() for target in targets)
    return Map(floors, arrows)


def direct_arrows(map_: Map) -> list[tuple[str, str]]:
    """The arrows no longer way implies (a transitive reduction): what the picture draws, to stay readable."""
    reach: dict[str, set[str]] = {}
    targets: dict[str, set[str]] = {}
    for source, target in map_.arrows:
        targets.setdefault(source, set()).add(target)

    def reachable(room: str) -> set[str]:
        if room not in reach:
            reach[room] = set()
            for target in targets.get(room, ()):
                reach[room] |= {target} | reachable(target)
        return reach[room]

    return [(source, target) for source, target in map_.arrows
            if not any(target in reachable(other) for other in targets[source] if other != target)]


def draw(map_: Map, png: Path) -> None:
    """The floors as rows of boxes, top floor first, with the direct arrows between them (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    by_floor: dict[int, list[str]] = {}
    for room, level in sorted(map_.floors.items()):
        by_floor.setdefault(level, []).append(room)
    top = max(by_floor)
    width, box_w, box_h, row_h = 12.0, 2.7, 0.62, 1.0
    figure, axes = plt.subplots(figsize=(width, top * row_h + 0.8), dpi=100)
    centres = {}
    for level, rooms in by_floor.items():
        y = level * row_h
        gap = width / len(rooms)
        for i, room in enumerate(rooms):
            x = gap * (i + 0.5)
            centres[room] = (x, y)
            colour = "#f3d9e3" if room == "converter/" else "#dce8f5"
            axes.add_patch(FancyBboxPatch((x - box_w / 2, y - box_h / 2), box_w, box_h, boxstyle="round,pad=0.02",
                                          facecolor=colour, edgecolor="#4a5a70", linewidth=0.8, zorder=2))
            axes.text(x, y + 0.1, room, ha="center", va="center", fontsize=8.5, weight="bold", zorder=3)
            axes.text(x, y - 0.14, CAPTIONS.get(room, "?"), ha="center", va="center", fontsize=6.8,
                      color="#333333", zorder=3)
        axes.text(-0.1, y, f"floor {level}", ha="right", va="center", fontsize=7.5, color="#666666")
    for source, target in direct_arrows(map_):
        (x1, y1), (x2, y2) = centres[source], centres[target]
        axes.add_patch(FancyArrowPatch((x1, y1 - box_h / 2), (x2, y2 + box_h / 2), arrowstyle="-|>",
                                       mutation_scale=7, color="#8a96a8", linewidth=0.6, zorder=1,
                                       connectionstyle="arc3,rad=0.04"))
    axes.set_xlim(-0.9, width)
    axes.set_ylim(row_h * 0.4, top * row_h + row_h * 0.6)
    axes.axis("off")
    axes.set_title("edgetpu-serve: every arrow points down (an import; arrows a longer way implies are left out)",
                   fontsize=9, loc="left")
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png)
    plt.close(figure)


def differences(now: Map, recorded: dict) -> list[str]:
    """What moved between the recorded map and the code's: rooms, floors and arrows, one line each."""
    lines = []
    then = recorded.get("floors", {})
    for room in sorted(set(then) | set(now.floors)):
        if then.get(room) != now.floors.get(room):
            lines.append(f"{room}: floor {then.get(room, '-')} in the map, {now.floors.get(room, '-')} in the code")
    then_arrows = {tuple(arrow) for arrow in recorded.get("arrows", [])}
    lines += [f"arrow {a} -> {b}: in the code, not in the map" for a, b in sorted(set(now.arrows) - then_arrows)]
    lines += [f"arrow {a} -> {b}: in the map, not in the code" for a, b in sorted(then_arrows - set(now.arrows))]
    lines += [f"{room}: no caption in docs/floors.py CAPTIONS" for room in sorted(set(now.floors) - set(CAPTIONS))]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare the code with the committed map; write nothing")
    args = parser.parse_args(argv)
    try:
        now = read_map()
    except ValueError as error:
        print(error, file=sys.stderr)
        return 1
    if args.check:
        moved = differences(now, json.loads(JSON.read_text(encoding="utf-8")))
        for line in moved:
            print(line, file=sys.stderr)
        if moved:
            print("the map is out of date: run `python docs/floors.py` and update docs/architecture.md", file=sys.stderr)
        return 1 if moved else 0
    JSON.write_text(json.dumps(now.as_json(), indent=1) + "\n", encoding="utf-8")
    draw(now, PNG)
    print(f"{len(now.floors)} rooms on {max(now.floors.values())} floors, {len(now.arrows)} arrows: {JSON}, {PNG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
