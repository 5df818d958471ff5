"""Model directories with an `edgetpu` file, for tests that have no edgetpu_compiler.

`plain_as_compiled`: the committed int8 model listed as the compiled file too, so the
libedgetpu TEST DOUBLE's delegate takes its uint8/int8 QUANTIZE operators, leaves every
other op to the CPU kernels, and the model runs: the engine, pool, registry and delegate
wiring is real, the TPU is not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from app.model_dir.schema import EDGETPU, MANIFEST, edgetpu_filename
from converter.model_dir import file_entry
from tests.conftest import DEFAULT_MODEL, MODELS


def with_edgetpu_file(root: Path, content: bytes | None = None, name: str = DEFAULT_MODEL) -> Path:
    """Copy the default model under root and add an edgetpu file (default: the plain int8 model)."""
    target = root / name
    shutil.copytree(MODELS / DEFAULT_MODEL, target)
    compiled = target / edgetpu_filename(name)
    compiled.write_bytes(content if content is not None else (target / f"{name}_int8.tflite").read_bytes())
    manifest = json.loads((target / MANIFEST).read_text())
    manifest["files"][EDGETPU] = file_entry(compiled, target).model_dump()
    (target / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return root


def plain_as_compiled(root: Path) -> Path:
    return with_edgetpu_file(root)
