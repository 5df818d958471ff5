"""Nothing outside a backend's plug-in names it (issue 24): the Edge TPU is named only by its
plug-in (app/engines/edgetpu.py), its helper package (app/edgetpu/) and the file formats that name
compiled models (app/model_dir/, app/tflite_file.py, app/importing/: what a handed-over .tflite is). The same check as `grep -rnP 'edgetpu(?![-_]serve)' app --include=*.py`."""

from __future__ import annotations

import re
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"
NAME = re.compile(r"edgetpu(?![-_]serve)")
# the plug-in, its helpers, and the file formats (a compiled file's name and custom op, its model directory entry)
ALLOWED = ("engines/edgetpu.py", "edgetpu/", "model_dir/", "tflite_file.py", "importing/")


def naming_lines(root: Path) -> list[str]:
    """file:line: text, for every line of root/**/*.py that names the Edge TPU outside ALLOWED."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(ALLOWED):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if NAME.search(line):
                found.append(f"app/{relative}:{number}: {line.strip()}")
    return found


def test_only_the_edgetpu_plugin_and_its_formats_name_it():
    assert naming_lines(APP) == []


def test_the_scan_finds_a_name_and_passes_the_service_name(tmp_path):
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "edgetpu.py").write_text("KEY = 'edgetpu'\n")
    (tmp_path / "core.py").write_text("'edgetpu-serve'\nENV = 'edgetpu_serve_'\nBACKEND = 'EDGETPU'\nkey = 'edgetpu'\n")
    assert naming_lines(tmp_path) == ["app/core.py:4: key = 'edgetpu'"]
