"""The README's "I already have a `.tflite`", run as written on the three kinds of file it names.

The import commands are read from that block, not copied here; only their file names stand for the
test's files: an int8 file with its labels packed inside (written by TFLite's own metadata writer,
tests/data/metadata/), a TF1-style uint8 file with a labels file in Coral's `id label` form, and that
file's `_edgetpu.tflite` made by the TEST DOUBLE of edgetpu_compiler. Each directory is then served over
a socket, the compiled one on `edgetpu` through the libedgetpu TEST DOUBLE.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from tests.classifier_models import tiny_classifier
from tests.conftest import ROOT, Service
from tests.doubles.edgetpu_compiler_double import install as install_compiler_double
from tests.doubles.libedgetpu import DEVICES, INVOKE_LOG, libedgetpu_double  # noqa: F401
from tests.test_your_own_model import code_blocks, commands, section_text

FIXTURES = Path(__file__).parent / "data" / "metadata"
SUBSECTION = "### I already have a `.tflite`"
COMMAND_TIMEOUT_S = 120


def import_commands() -> list[list[str]]:
    text = section_text()
    start = text.index(SUBSECTION)
    block = code_blocks(text[start:text.index("\n### ", start + 1)])
    assert len(block) == 1 and block[0].language == "sh", "the subsection has one shell block"
    argvs = commands(block[0])
    assert argvs and all(argv[:4] == ["python", "-m", "converter", "import"] for argv in argvs), argvs
    return argvs


def make_files(work: Path, argv: list[str]) -> str:
    """Put the file(s) this command names into `work`, as the kind of file it stands for; returns the kind."""
    files = [a for a in argv[4:] if a.endswith(".tflite")]
    labels = argv[argv.index("--labels") + 1] if "--labels" in argv else None
    if labels:
        (work / labels).write_text("0  red\n1  green\n2  blue\n3  magenta\n")  # Coral's `id label` form
    if any(f.endswith("_edgetpu.tflite") for f in files):
        (compiled,) = files
        plain = work / compiled.replace("_edgetpu.tflite", ".tflite")
        plain.write_bytes(tiny_classifier(style="tf1"))
        compiler = install_compiler_double(work)
        subprocess.run([str(compiler), "-s", "-m", "14", "-o", str(work), str(plain)], check=True,
                       capture_output=True, timeout=COMMAND_TIMEOUT_S)
        plain.unlink()  # the owner has only the compiled file
        assert (work / compiled).is_file()
        return "compiled"
    (plain,) = files
    if labels:
        (work / plain).write_bytes(tiny_classifier(style="tf1"))  # TF1-style: uint8 everywhere
        return "uint8 with an id-label file"
    shutil.copy(FIXTURES / "classifier_int8.tflite", work / plain)  # int8, labels packed inside
    return "int8 with packed labels"


def colour_png(path: Path, channel: int) -> bytes:
    pixels = np.zeros((48, 64, 3), np.uint8)
    pixels[..., channel] = 240
    Image.fromarray(pixels).save(path)
    return path.read_bytes()


def test_the_readme_imports_each_kind_of_file_and_each_is_served(tmp_path, libedgetpu_double):
    work = tmp_path / "work"
    work.mkdir()
    names, kinds = {}, []
    for argv in import_commands():
        kinds.append(make_files(work, argv))
        done = subprocess.run([sys.executable, *argv[1:]], cwd=work, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, f"{shlex.join(argv)}:\n{done.stderr}"
        names[kinds[-1]] = argv[argv.index("--name") + 1]
        assert (work / "models" / names[kinds[-1]] / "model.json").is_file()
    assert sorted(kinds) == ["compiled", "int8 with packed labels", "uint8 with an id-label file"]

    node = tmp_path / "apex_0"
    node.write_bytes(b"")
    env = {"EDGETPU_SERVE_MODEL_DIR": str(work / "models"), "EDGETPU_SERVE_BACKENDS": "edgetpu,cpu",
           "EDGETPU_SERVE_EDGETPU_ON_FAILURE": "fallback", "EDGETPU_SERVE_DEFAULT_MODEL": names["compiled"],
           "EDGETPU_SERVE_WORKERS": "1", "EDGETPU_SERVE_EDGETPU_LIBRARY": str(libedgetpu_double),
           "EDGETPU_SERVE_EDGETPU_VERSION_CHECK": "warn", DEVICES: f"pci:{node}",
           INVOKE_LOG: str(tmp_path / "invoked.log")}
    red = colour_png(tmp_path / "red.png", 0)
    with Service(env, inherit_settings=False) as service, httpx.Client(base_url=service.url, timeout=30) as client:
        states = client.get("/readyz").json()["models"]
        for kind in ("int8 with packed labels", "uint8 with an id-label file"):  # no compiled file: on the CPU
            assert states[names[kind]]["state"] == "degraded", states
            answer = client.post(f"/v1/models/{names[kind]}/classify?backend=cpu", files={"image": red})
            assert answer.status_code == 200, answer.text
            assert answer.json()["predictions"][0]["label"] == "red", (kind, answer.json())
        compiled = names["compiled"]
        assert "no CPU form" in states[compiled]["error"]
        answer = client.post(f"/v1/models/{compiled}/classify?backend=edgetpu", files={"image": red})
        assert answer.status_code == 200 and answer.json()["backend"] == "edgetpu", answer.text
        assert {p["label"] for p in answer.json()["predictions"]} == {"red", "green", "blue", "magenta"}
        refused = client.post(f"/v1/models/{compiled}/classify?backend=cpu", files={"image": red})
        assert refused.status_code == 422 and "python -m converter import" in refused.json()["error"]
