"""docs/architecture.md's picture is the code's: the floors read from the imports equal the committed map, every
import points down, and the page names every room. A change that moves a room, adds an arrow or closes a
circle fails here until the map is redrawn (`python docs/floors.py`) and the page says what changed."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
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
FRONT_DOORS = ("app.api", "app.main", "app.lifespan")
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


# -- no circle of imports inside the request path's packages ---------------------------------------------------

# Each of these is made of modules with one concept each; a module that needs another's name for a type imports it
# like any other, so an import only for type checking counts too: a type cycle is a design cycle.
WITHOUT_CIRCLES = ("app/pool", "app/core", "app/registry")


def package_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules among `modules` that a file imports, every import counted (inside functions and under
    `if TYPE_CHECKING:` too). `from package import module` imports that module (not the package's __init__)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            named = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found.update(named)
            if len(named) < len(node.names):  # a name of the package itself
                found.add(node.module)
    return found & modules


def module_circles(root: Path, folder: str) -> list[str]:
    """The circles of imports among the modules of one package (its __init__ included, as the package's dotted
    name): each as 'a.py -> b.py -> a.py'."""
    package = folder.replace("/", ".")
    files = {(package if path.name == "__init__.py" else f"{package}.{path.stem}"): path
             for path in sorted((root / folder).glob("*.py"))}
    edges = {module: sorted(package_imports(path, set(files)) - {module}) for module, path in files.items()}
    found: set[tuple[str, ...]] = set()

    def walk(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            circle = path[path.index(module):]
            start = circle.index(min(circle))  # each circle once, whatever module it was entered by
            found.add(circle[start:] + circle[:start])
            return
        for target in edges[module]:
            walk(target, (*path, module))

    for module in files:
        walk(module, ())
    name = {module: path.relative_to(root).as_posix() for module, path in files.items()}
    return sorted(" -> ".join(name[m] for m in (*circle, circle[0])) for circle in found)


@pytest.mark.parametrize("folder", WITHOUT_CIRCLES)
def test_no_two_modules_of_the_request_path_import_each_other(folder):
    assert module_circles(ROOT, folder) == []


def test_a_circle_made_by_a_type_only_import_fails_the_check(tmp_path):
    """In a copy of the code: the line's job naming the pool for a type, under TYPE_CHECKING, closes a circle."""
    root = _copy_code(tmp_path)
    job = root / "app" / "pool" / "job.py"
    job.write_text(job.read_text(encoding="utf-8").replace(
        "from typing import Protocol\n",
        "from typing import TYPE_CHECKING, Protocol\n\nif TYPE_CHECKING:\n"
        "    from app.pool.engine_pool import EnginePool\n"), encoding="utf-8")
    assert "app/pool/engine_pool.py -> app/pool/job.py -> app/pool/engine_pool.py" in module_circles(root, "app/pool")
