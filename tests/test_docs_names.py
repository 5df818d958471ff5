"""What the README and docs/ name in the code exists: every `app/...` and `converter/...` path, every dotted name
(`app.engines.Backend`, `app.main:app`), every name a `from app... import` line takes, every `Class.method` of a
class of ours, and every name set in backticks beside its module (`app/tasks/base.py` `Task`, and the
configuration page's table of fixed limits). A rename in the code that leaves a page behind fails here, naming the
page and what it names; the last test shows it on a copy of the tree with a path and a method renamed.

The code is read, not imported (nothing runs: `app.main:app` would build the app, and the converter's modules
import TensorFlow), with Python's own parser: a module's names are what it defines, imports or hands out through
a module `__getattr__`; a class's are its body's, its instances' (`self.x = ...`) and its bases'.
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("app", "converter")
EXTENSIONS = ("md", "py", "json", "txt", "tflite", "png", "toml", "yaml", "yml", "sh", "log", "jpg", "lock", "js")

PATH = re.compile(r"(?<![\w/.<-])((?:app|converter)/[\w./-]*[\w/])")
DOTTED = re.compile(r"(?<![\w./-])((?:app|converter)(?:\.[A-Za-z_]\w*)+)(?::([A-Za-z_]\w*))?")
IMPORT = re.compile(r"\bfrom\s+((?:app|converter)(?:\.\w+)*)\s+import\s+([\w\s,]+)")
METHOD = re.compile(r"(?<![\w./-])([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)\.([a-z_]\w*)(?![\w-]*\.(?:%s)\b)" % "|".join(EXTENSIONS))
BESIDE = re.compile(r"`((?:app|converter)/[\w/]+\.py)`,?\s+((?:`[A-Za-z_][\w.]*(?:\(\))?`(?:,\s*|\s+and\s+)?)+)")
TABLE_ROW = re.compile(r"^\|\s*`((?:app|converter)/[\w/.]*)`\s*\|\s*([^|]+)\|")
NAME_WITH_FILE = re.compile(r"`([A-Za-z_]\w*)`(?:\s*\(([\w/]+\.py)\))?")


@dataclass
class Module:
    """What one module defines: top-level names (with their nodes), and the names its __getattr__ hands out."""

    path: Path
    names: dict[str, ast.AST] = field(default_factory=dict)
    lazy: set[str] = field(default_factory=set)


class Code:
    """The packages' modules, read with ast, under `root`."""

    def __init__(self, root: Path):
        self.root = root
        self._modules: dict[Path, Module] = {}
        self._classes: dict[str, list[tuple[Module, ast.ClassDef]]] | None = None

    def module_file(self, dotted: str) -> Path | None:
        base = self.root.joinpath(*dotted.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def module(self, path: Path) -> Module:
        if path not in self._modules:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            module = Module(path)
            _collect(tree.body, module.names)
            if "__getattr__" in module.names:  # names it hands out are string constants of the module
                module.lazy = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            self._modules[path] = module
        return self._modules[path]

    def classes(self) -> dict[str, list[tuple[Module, ast.ClassDef]]]:
        if self._classes is None:
            self._classes = {}
            for package in PACKAGES:
                for path in sorted((self.root / package).rglob("*.py")):
                    module = self.module(path)
                    for node in module.names.values():
                        if isinstance(node, ast.ClassDef) and module.names.get(node.name) is node:
                            self._classes.setdefault(node.name, []).append((module, node))
        return self._classes

    def has_name(self, dotted_module: str, name: str) -> bool:
        """The module (a file or a package) defines `name`, hands it out, or has a submodule of that name."""
        path = self.module_file(dotted_module)
        if path is None:
            return False
        module = self.module(path)
        return name in module.names or name in module.lazy or self.module_file(f"{dotted_module}.{name}") is not None

    def has_attribute(self, cls: ast.ClassDef, attribute: str, seen: frozenset[str] = frozenset()) -> bool:
        """In the class body, set on its instances, or in a base: a base that is not ours may hold it (True)."""
        if attribute in _class_names(cls):
            return True
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            if name is None or name in seen:
                continue
            ours = self.classes().get(name)
            if not ours:
                return True  # pydantic's BaseModel, Exception, ...: not ours to check
            if any(self.has_attribute(node, attribute, seen | {cls.name}) for _, node in ours):
                return True
        return False

    def resolve_dotted(self, dotted: str) -> str | None:
        """None when `dotted` (a module, then a top-level name, then an attribute of it) exists; else what is missing."""
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            if self.module_file(".".join(parts[:cut])) is not None:
                break
        else:
            return f"no module {parts[0]}"
        module_name, rest = ".".join(parts[:cut]), parts[cut:]
        if not rest:
            return None
        if not self.has_name(module_name, rest[0]):
            return f"{module_name} has no {rest[0]}"
        node = self.definition(module_name, rest[0])
        if len(rest) > 1 and isinstance(node, ast.ClassDef) and not self.has_attribute(node, rest[1]):
            return f"{module_name}.{rest[0]} has no {rest[1]}"
        return None

    def definition(self, dotted_module: str, name: str, hops: int = 5) -> ast.AST | None:
        """The node that defines `name` in the module, through the imports that hand it on (app/engines/__init__.py
        hands on app/engines/base.py's Backend)."""
        path = self.module_file(dotted_module)
        node = self.module(path).names.get(name) if path is not None else None
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and hops:
            source = next((alias.name for alias in node.names if (alias.asname or alias.name) == name), None)
            if source is not None and node.module.split(".")[0] in PACKAGES:
                return self.definition(node.module, source, hops - 1)
        return node


def _collect(body: list[ast.stmt], names: dict[str, ast.AST]) -> None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names[leaf.id] = node
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):
            _collect(node.body, names)
            for handler in getattr(node, "handlers", []):
                _collect(handler.body, names)
            _collect(getattr(node, "orelse", []), names)
            _collect(getattr(node, "finalbody", []), names)


def _class_names(cls: ast.ClassDef) -> set[str]:
    names: dict[str, ast.AST] = {}
    _collect(cls.body, names)
    for node in ast.walk(cls):  # set on instances: self.x = ..., self.x: T = ...
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names[target.attr] = node
    return set(names)


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def references(root: Path) -> list[tuple[str, str, str]]:
    """(page, kind, what) for every name in the code that the pages name: kind path, dotted, import, method or
    beside (a name beside its module, in backticks or in a table row)."""
    found = set()
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(root).as_posix()
        for m in PATH.finditer(text):
            found.add((name, "path", m.group(1).rstrip(".")))
        for m in DOTTED.finditer(text):
            dotted = m.group(1)
            if dotted.rsplit(".", 1)[-1] in EXTENSIONS:
                continue  # a file name: docs/converter.md
            found.add((name, "dotted", dotted + (f".{m.group(2)}" if m.group(2) else "")))
        for m in IMPORT.finditer(text):
            for imported in re.split(r"[\s,]+", m.group(2).split("\n")[0].strip()):
                if imported and imported != "as":
                    found.add((name, "import", f"{m.group(1)}.{imported}"))
        for m in METHOD.finditer(text):
            found.add((name, "method", f"{m.group(1)}.{m.group(2)}"))
        for m in BESIDE.finditer(text):
            for attr in re.findall(r"`([A-Za-z_][\w.]*?)(?:\(\))?`", m.group(2)):
                found.add((name, "beside", f"{m.group(1)} {attr}"))
        for line in text.splitlines():
            row = TABLE_ROW.match(line)
            if row:
                for attr, file in NAME_WITH_FILE.findall(row.group(2)):
                    where = f"{row.group(1).rstrip('/')}/{file}" if file else row.group(1)
                    found.add((name, "beside", f"{where} {attr}"))
    return sorted(found)


def problem(code: Code, kind: str, what: str) -> str | None:
    """Why `what` does not exist in the code under code.root, or None when it does."""
    if kind == "path":
        return None if (code.root / what).exists() else "no such file or folder"
    if kind in ("dotted", "import"):
        return code.resolve_dotted(what)
    if kind == "method":
        cls, attribute = what.split(".")
        ours = code.classes().get(cls)
        if not ours:
            return f"no class {cls} in {' or '.join(PACKAGES)}/"
        if not any(code.has_attribute(node, attribute) for _, node in ours):
            return f"class {cls} has no {attribute}"
        return None
    where, attr = what.split(" ")
    target = code.root / where
    if target.is_dir():  # a package named whole: one of its modules
        if any(attr in code.module(path).names for path in target.rglob("*.py")):
            return None
        return f"no module of {where} defines {attr}"
    if not target.is_file():
        return f"{where}: no such file"
    head, _, tail = attr.partition(".")
    module = code.module(target)
    if head not in module.names and head not in module.lazy:
        return f"{where} defines no {head}"
    node = module.names.get(head)
    if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
        node = code.definition(node.module, head)
    if tail and isinstance(node, ast.ClassDef) and not code.has_attribute(node, tail):
        return f"{where}: {head} has no {tail}"
    return None


def stale(root: Path) -> list[str]:
    """Every name the pages under `root` give that the code under `root` lacks: 'page: kind what: why'."""
    code = Code(root)
    return [f"{page}: {kind} {what}: {why}" for page, kind, what in references(root)
            if (why := problem(code, kind, what)) is not None]


def test_the_pages_name_code_in_every_way_checked():
    kinds = {kind for _, kind, _ in references(ROOT)}
    assert kinds == {"path", "dotted", "import", "method", "beside"}, kinds  # each pattern still finds something


def test_every_path_and_name_the_docs_give_exists():
    assert stale(ROOT) == []


def _copy_tree(target: Path) -> Path:
    for name in (*PACKAGES, "docs"):
        shutil.copytree(ROOT / name, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.png", "*.js"))
    shutil.copy(ROOT / "README.md", target / "README.md")
    return target


def test_a_rename_in_the_code_fails_the_check(tmp_path):
    """In a copy of the tree: a file the docs name moves, a method the docs name is renamed, a module attribute the
    docs name is renamed; each is reported, with the page that names it."""
    root = _copy_tree(tmp_path)
    assert stale(root) == []
    found, code = references(root), Code(root)
    method = next(what for _, kind, what in found if kind == "method")
    cls, attribute = method.split(".")
    holders = {module.path for module, _ in code.classes()[cls]}
    dotted = next(what for _, kind, what in found if kind == "dotted" and ":" not in what and what.count(".") == 2
                  and code.module_file(what) is None and code.module_file(what.rsplit(".", 1)[0]) not in holders)
    taken = holders | {code.module_file(dotted.rsplit(".", 1)[0])}
    path = next(what for _, kind, what in found if kind == "path" and what.endswith(".py") and root / what not in taken)
    (root / path).rename((root / path).with_name("renamed_" + Path(path).name))
    renamed = 0
    for module, node in Code(root).classes()[cls]:
        text = module.path.read_text(encoding="utf-8")
        new = re.sub(rf"\b(def\s+|self\.){attribute}\b", rf"\1{attribute}_renamed", text)
        new = re.sub(rf"^(\s+){attribute}(\s*[:=])", rf"\1{attribute}_renamed\2", new, flags=re.M)
        renamed += new != text
        module.path.write_text(new, encoding="utf-8")
    assert renamed
    module_name, attr = dotted.rsplit(".", 1)
    file = Code(root).module_file(module_name)
    file.write_text(re.sub(rf"\b{attr}\b", f"{attr}_renamed", file.read_text(encoding="utf-8")), encoding="utf-8")
    problems = "\n".join(stale(root))
    assert f"path {path}: no such file or folder" in problems
    assert f"method {method}: class {cls} has no {attribute}" in problems
    assert f"dotted {dotted}: {module_name} has no {attr}" in problems


def test_the_checker_reads_the_forms_the_pages_use(tmp_path):
    """A page with one of each form, against this tree: what exists passes, what does not is named."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("See `app/registry/tickets.py` `Ticket`, and `Ticket.admit()`.\n")
    (tmp_path / "docs" / "page.md").write_text(
        "Run `uvicorn --http app.launch:Protocol app.main:app`; `app.engines.Backend.follow`.\n\n"
        "```python\nfrom app.settings import PluginSettings, plugin_config\n```\n\n"
        "| where | constant |\n|---|---|\n| `app/emulator/` | `MEMO_LIMIT` (libm.py), `NO_SUCH` (libm.py) |\n"
        "Gone: app/nowhere.py, `Ticket.nothing`, `app.engines.Nothing`, `app/registry/tickets.py` `Nobody`.\n")
    for name in PACKAGES:
        (tmp_path / name).symlink_to(ROOT / name)
    assert stale(tmp_path) == [
        "docs/page.md: beside app/emulator/libm.py NO_SUCH: app/emulator/libm.py defines no NO_SUCH",
        "docs/page.md: beside app/registry/tickets.py Nobody: app/registry/tickets.py defines no Nobody",
        "docs/page.md: dotted app.engines.Nothing: app.engines has no Nothing",
        "docs/page.md: method Ticket.nothing: class Ticket has no nothing",
        "docs/page.md: path app/nowhere.py: no such file or folder",
    ]
