"""docs/architecture.md's picture is the code's: the floors read from the imports equal the committed map, every
import points down, and the page names every room. A change that moves a room, adds an arrow or closes a
circle fails here until the map is redrawn (`python docs/floors.py`) and the page says what changed."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

# docs/floors.py is a script beside the docs, not a package module: loaded by path (registered first, as its
# dataclass needs its module)
spec = importlib.util.spec_from_file_location("docs_floors", ROOT / "docs" / "floors.py")
floors = sys.modules.setdefault("docs_floors", importlib.util.module_from_spec(spec))
spec.loader.exec_module(floors)


def _copy_code(target: Path) -> Path:
    for name in ("app", "converter"):
        shutil.copytree(ROOT / name, target / name, ignore=shutil.ignore_patterns("__pycache__", "static", "data"))
    return target


def test_the_committed_map_is_the_codes():
    recorded = json.loads(floors.JSON.read_text(encoding="utf-8"))
    assert floors.differences(floors.read_map(), recorded) == []
    assert floors.main(["--check"]) == 0


def test_every_arrow_points_down_and_every_room_has_a_caption():
    map_ = floors.read_map()
    assert all(map_.floors[source] > map_.floors[target] for source, target in map_.arrows)
    assert set(map_.floors) == set(floors.CAPTIONS)
    # the layers the design promises: the front doors above the registry, above the engines, above their runtimes
    order = ["app/api/", "app/registry/", "app/pool/", "app/engines/", "app/edgetpu/", "app/settings.py"]
    assert [map_.floors[room] for room in order] == sorted((map_.floors[room] for room in order), reverse=True)
    assert map_.floors["app/emulator/"] < map_.floors["app/engines/"]
    assert not any(target == "converter/" for _, target in map_.arrows), "app/ imports the converter"


def test_the_page_names_every_room_and_shows_the_picture():
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "](img/architecture.png)" in page
    assert [room for room in floors.read_map().floors if f"`{room}`" not in page] == []


def test_an_import_up_the_floors_or_a_new_room_fails_the_check(tmp_path):
    """In a copy of the code: settings (the ground floor) importing the registry is a circle; a new module
    importing the pool is a room the map lacks, with no caption; each is reported."""
    root = _copy_code(tmp_path)
    assert floors.differences(floors.read_map(root), floors.read_map().as_json()) == []

    (root / "app" / "batching.py").write_text("from app.pool import EnginePool\n", encoding="utf-8")
    moved = floors.differences(floors.read_map(root), floors.read_map().as_json())
    assert "app/batching.py: floor - in the map, 7 in the code" in moved
    assert "arrow app/batching.py -> app/pool/: in the code, not in the map" in moved
    assert "app/batching.py: no caption in docs/floors.py CAPTIONS" in moved

    settings = root / "app" / "settings.py"
    settings.write_text(settings.read_text(encoding="utf-8") + "\n\ndef late():\n    from app.registry import Registry\n",
                        encoding="utf-8")
    with pytest.raises(ValueError, match=r"a circle of imports: .*app/settings.py -> app/registry/"):
        floors.read_map(root)


def test_the_picture_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")  # the dev extra has it; the picture is a doc, not the service
    png = tmp_path / "architecture.png"
    floors.draw(floors.read_map(), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(floors.direct_arrows(floors.read_map())) < len(floors.read_map().arrows)


# -- the core and the tasks stay below every front door --------------------------------------------------------

# The web frameworks, and the front doors (the HTTP ones in app/api/; every door added beside them is named here).
FRAMEWORKS = ("fastapi", "starlette", "uvicorn", "httptools", "h11")
FRONT_DOORS = ("app.api", "app.main", "app.service", "app.frontdoors")
BELOW_THE_DOORS = ("app/core", "app/tasks")


def door_leaks(root: Path) -> list[str]:
    """Where a core or task module imports a web framework or a front door, or names one by string (a route's
    "module:attribute", or a door's dotted name): each as 'file: what'."""
    found = []
    for folder in BELOW_THE_DOORS:
        for path in sorted((root / folder).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            for module in floors.imported_modules(path, root):
                if module.split(".")[0] in FRAMEWORKS or module.startswith(tuple(f"{d}." for d in FRONT_DOORS)) \
                        or module in FRONT_DOORS:
                    found.append(f"{where}: imports {module}")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    text = node.value
                    if any(door in text for door in FRONT_DOORS) and (":" in text or text.startswith(FRONT_DOORS)):
                        found.append(f"{where}: names {text!r}")
    return sorted(set(found))


def test_no_core_or_task_module_imports_a_framework_or_a_front_door_or_names_a_route():
    assert door_leaks(ROOT) == []


def test_a_task_naming_its_router_or_a_core_module_importing_fastapi_fails_the_check(tmp_path):
    root = _copy_code(tmp_path)
    task = root / "app" / "tasks" / "classify.py"
    task.write_text(task.read_text(encoding="utf-8") + '\nROUTES = ("app.api.classify:router",)\n', encoding="utf-8")
    core = root / "app" / "core" / "inputs.py"
    core.write_text(core.read_text(encoding="utf-8") + "\nfrom fastapi import Request\n", encoding="utf-8")
    assert door_leaks(root) == ["app/core/inputs.py: imports fastapi", "app/core/inputs.py: imports fastapi.Request",
                                "app/tasks/classify.py: names 'app.api.classify:router'"]


# -- no circle of imports, module by module, in app/, converter/ and bench/ -------------------------------------

# Each is made of modules with one concept each; a module that needs another's name for a type imports it like any
# other, so an import only for type checking counts too (a type cycle is a design cycle), and so does one inside a
# function. A package's __init__ is a module of its own, under the package's dotted name.
WITHOUT_CIRCLES = ("app", "converter", "bench")


def tree_modules(root: Path, folder: str) -> dict[str, Path]:
    """Every module of a tree by its dotted name (a package's __init__ under the package's)."""
    modules = {}
    for path in sorted((root / folder).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def package_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules among `modules` that a file imports, every import counted (inside functions and under
    `if TYPE_CHECKING:` too). `from package import module` imports that module (not the package's __init__);
    `import a.b.c` and `from a.b import name` import the nearest of them that is a module here."""

    def nearest(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(filter(None, (nearest(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            named = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found.update(named)
            if len(named) < len(node.names) and (module := nearest(node.module)) is not None:  # a name of it
                found.add(module)
    return found


def module_circles(root: Path, folder: str) -> list[str]:
    """The circles of imports among the modules of one tree: each group of modules that reach each other (a strongly
    connected component), said as its shortest circle through its first module, 'a.py -> b.py -> a.py', followed by
    the other modules of the group in brackets."""
    files = tree_modules(root, folder)
    edges = {module: sorted(package_imports(path, set(files)) - {module}) for module, path in files.items()}
    name = {module: path.relative_to(root).as_posix() for module, path in files.items()}
    found = []
    for group in strongly_connected(edges):
        first = min(group)
        circle = shortest_circle(first, edges, group)
        others = sorted(set(group) - set(circle))
        found.append(" -> ".join(name[m] for m in (*circle, first)) + (f" [{', '.join(name[m] for m in others)}]"
                                                                        if others else ""))
    return sorted(found)


def strongly_connected(edges: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, iteratively (no recursion on a long chain of imports)."""
    index, low, on_stack, stack, groups, counter = {}, {}, set(), [], [], 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(edges[target])))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    groups.append(group)
    return groups


def shortest_circle(first: str, edges: dict[str, list[str]], group: list[str]) -> list[str]:
    """The shortest path of imports from `first` back to it, inside its group (breadth first)."""
    inside, came_from, frontier = set(group), {}, [first]
    while frontier:
        following = []
        for module in frontier:
            for target in edges[module]:
                if target == first:
                    path = [module]
                    while path[-1] != first:
                        path.append(came_from[path[-1]])
                    return path[::-1]
                if target in inside and target not in came_from:
                    came_from[target] = module
                    following.append(target)
        frontier = following
    raise AssertionError(f"{first} is in a group of imports but on no circle")


@pytest.mark.parametrize("folder", WITHOUT_CIRCLES)
def test_no_two_modules_import_each_other(folder):
    assert module_circles(ROOT, folder) == []


def test_a_circle_made_by_a_type_only_import_fails_the_check(tmp_path):
    """In a copy of the code: the line's job naming the pool for a type, under TYPE_CHECKING, closes a circle; so
    does the core naming the Service, across packages."""
    root = _copy_code(tmp_path)
    job = root / "app" / "pool" / "job.py"
    job.write_text(job.read_text(encoding="utf-8").replace(
        "from typing import Protocol\n",
        "from typing import TYPE_CHECKING, Protocol\n\nif TYPE_CHECKING:\n"
        "    from app.pool.engine_pool import EnginePool\n"), encoding="utf-8")
    core = root / "app" / "core" / "inputs.py"
    core.write_text(core.read_text(encoding="utf-8") + "\ndef service():\n    from app.service import Service\n",
                    encoding="utf-8")
    circles = module_circles(root, "app")
    assert any("app/pool/engine_pool.py" in circle and "app/pool/job.py" in circle for circle in circles), circles
    assert any("app/core/inputs.py" in circle and "app/service.py" in circle for circle in circles), circles
    (pool,) = module_circles(root, "app/pool")  # one group, said as its shortest circle and its other modules
    assert pool.startswith("app/pool/deadlines.py -> app/pool/job.py -> app/pool/engine_pool.py -> "
                           "app/pool/deadlines.py [")


def test_importing_the_service_loads_no_web_framework():
    """app.service composes everything and starts every door, HTTP one among them: in a fresh interpreter, importing
    it loads no web framework (the HTTP door's app is imported only when a launch asks for it)."""
    loaded = subprocess.run([sys.executable, "-c", "import sys, app.service; print(' '.join(sorted(sys.modules)))"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert [m for m in loaded if m.split(".")[0] in FRAMEWORKS] == []
    assert "app.service" in loaded and "app.frontdoors" in loaded  # it was imported, with the doors' package
