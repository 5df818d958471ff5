"""The README's "Your own model on a Coral", followed as written, for a Keras and a PyTorch model.

The commands are read from that section's code blocks, not copied here, so the test fails when the
README and the commands drift apart. Each is run with only its paths substituted: the model is a
small one (seeded weights, 32x32 input instead of 224x224), `photos/` is a folder of real photos,
the board's `models/` is a local folder, the service listens on a free loopback port. The Edge TPU
compiler is the TEST DOUBLE of tests/doubles/edgetpu_compiler_double.py, put on PATH under the real
name. The Docker commands cannot run here: the test only checks that they are the ones it expects
(tests/test_docker.py checks the images' recipes).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.service import free_port
from converter.photos import sample_photos
from tests.conftest import ROOT
from tests.waiting import until
from tests.doubles.edgetpu_compiler_double import install as install_compiler_double

pytestmark = pytest.mark.slow

README = ROOT / "README.md"
SECTION = "Your own model on a Coral"
SIZE = 32  # the README's 224, made small
DOCS_SIZE = "224"
LABELS = ("daisy", "rose", "tulip", "sunflower")
CALIBRATION_PHOTOS = 6
READY_TIMEOUT_S = 120
STOP_TIMEOUT_S = 15
COMMAND_TIMEOUT_S = 300
# Commands the section may show that cannot run here (no Docker engine, no board); checked, not run.
NOT_RUN_HERE = (("sudo", "make", "images"), ("docker",), ("curl", "-L", "-o"))

FRAMEWORKS = {
    # framework: (marker of its export block, model file suffix, what builds `model` before the block runs)
    "keras": ("model.save(", ".keras", """
from converter.quantize import import_tensorflow
import_tensorflow()
import keras
from keras import layers
keras.utils.set_random_seed(0)
inputs = {keras_input}
x = layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
x = layers.MaxPooling2D()(x)
x = layers.GlobalAveragePooling2D()(x)
model = keras.Model(inputs, layers.Dense({classes})(x))
"""),
    "pytorch": ("torch.export", ".pt2", """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU6(), nn.Conv2d(8, 16, 3, 1, 1),
                      nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, {classes}))
"""),
}


@dataclass
class Block:
    language: str
    text: str


def section_text() -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(SECTION)}\n(.*?)(?=^## )", text, re.M | re.S)
    assert match, f"README.md has no section '## {SECTION}'"
    return match.group(1)


def code_blocks(text: str) -> list[Block]:
    return [Block(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def commands(block: Block) -> list[list[str]]:
    """A shell block's commands: continuation lines joined, comments dropped, each split as the shell would."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    return [shlex.split(line) for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@dataclass
class Workspace:
    work: Path          # where the user runs steps 1-3 (the repository's root, for them)
    board_models: Path  # the serving machine's models/
    bin: Path           # the compiler double, as edgetpu_compiler
    env: dict[str, str]


@pytest.fixture
def workspace(tmp_path) -> Workspace:
    work = tmp_path / "work"
    photos = work / "photos"
    photos.mkdir(parents=True)
    for photo in sample_photos()[:CALIBRATION_PHOTOS]:
        shutil.copy(photo, photos / photo.name)
    (work / "labels.txt").write_text("\n".join(LABELS) + "\n")
    board_models = tmp_path / "board" / "edgetpu-serve" / "models"
    board_models.mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "edgetpu_compiler").symlink_to(install_compiler_double(tmp_path))  # TEST DOUBLE, real name
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EDGETPU_SERVE_")},
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return Workspace(work, board_models, bin_dir, env)


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def substitute_size(argv: list[str]) -> list[str]:
    return [str(SIZE) if arg == DOCS_SIZE else arg for arg in argv]


def export(block: Block, framework: str, ws: Workspace) -> str:
    """Run the README's export block in a fresh Python with a small `model` built first; the file it saved."""
    _, suffix, builder = FRAMEWORKS[framework]
    keras_input = re.search(r"`(keras\.Input\([^`]*\))`", section_text())
    assert keras_input, "the section no longer shows the keras.Input(..., batch_size=1) to build with"
    prelude = builder.format(keras_input=keras_input.group(1).replace(DOCS_SIZE, str(SIZE)), classes=len(LABELS))
    script = ws.work / f"export_{framework}.py"
    script.write_text(prelude + "\n" + block.text.replace(DOCS_SIZE, str(SIZE)))
    run([sys.executable, str(script)], ws.work, ws.env)
    saved = re.findall(rf"\"([^\"]+{re.escape(suffix)})\"", block.text)
    assert len(saved) == 1 and (ws.work / saved[0]).is_file(), f"the {framework} block saved no {suffix} file"
    return saved[0]


def quantize(argv: list[str], ws: Workspace) -> Path:
    argv = substitute_size(argv)
    argv[argv.index("--calibration") + 1] = str(ws.work / "photos")
    done = run([sys.executable, *argv[1:]], ws.work, ws.env)
    model_dir = ws.work / done.stdout.strip().splitlines()[-1]
    assert (model_dir / "model.json").is_file(), done.stdout
    return model_dir


def compile_(argv: list[str], ws: Workspace) -> Path:
    done = run([sys.executable, *argv[1:]], ws.work, ws.env)
    assert "placed" in done.stdout, done.stdout
    model_dir = ws.work / argv[-1]
    compiled = json.loads((model_dir / "model.json").read_text())["files"]["edgetpu"]["path"]
    assert (model_dir / compiled).is_file()
    assert compiled == f"{model_dir.name}_int8_edgetpu.tflite"
    return model_dir


def place(argv: list[str], ws: Workspace) -> None:
    """`scp -r models/NAME HOST:PATH/models/` -> the same copy into the local stand-in of the board's models/."""
    assert argv[:2] == ["scp", "-r"] and ":" in argv[-1] and argv[-1].rstrip("/").endswith("models"), argv
    run(["cp", "-r", *argv[2:-1], str(ws.board_models)], ws.work, ws.env)


class MakeServe:
    """The README's `make serve`, in its own process group; this test's venv, a free port, the board's models."""

    def __init__(self, argv: list[str], ws: Workspace):
        assert argv == ["make", "serve"], argv
        venv = Path(sys.prefix)
        self.port = free_port()
        # -o: never reinstall into the venv the tests run from (make test installed it)
        command = [*argv, f"VENV={venv}", f"PORT={self.port}", "-o", f"{venv}/.serve-installed"]
        env = {**ws.env, "EDGETPU_SERVE_MODEL_DIR": str(ws.board_models)}
        self.log = (ws.work / "serve.log").open("w+b")
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.process.poll() is None, f"make serve exited {self.process.returncode}:\n{self.output()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False

        try:
            until(ready, READY_TIMEOUT_S, "ready", poll_s=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}:\n{self.output()}") from None

    def stop(self) -> None:
        """SIGTERM to the group (make and the service), SIGKILL after a bound; returns once the group is gone."""
        group = self.process.pid

        def group_gone() -> bool:
            self.process.poll()  # reaps make once it has exited: a zombie would still be in the group
            try:
                os.killpg(group, 0)
                return False
            except ProcessLookupError:
                return True

        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            try:
                until(group_gone, STOP_TIMEOUT_S, f"the group gone after {sig.name}", poll_s=0.1)
                break
            except AssertionError:  # still there: the next signal
                continue
        self.process.wait(STOP_TIMEOUT_S)


def classify(argv: list[str], port: int, photo: Path, ws: Workspace) -> dict:
    """The README's curl, aimed at the test's port and a real photo; asserts a 200."""
    assert argv[0] == "curl", argv
    argv = [re.sub(r"^image=@.*$", f"image=@{photo}", a) for a in argv]
    argv = [a.replace("localhost:8000", f"127.0.0.1:{port}") for a in argv]
    done = run([*argv, "--silent", "--show-error", "--write-out", "\n%{http_code}"], ws.work, ws.env)
    body, status = done.stdout.rsplit("\n", 1)
    assert status == "200", f"{status}: {body}"
    return json.loads(body)


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_the_readme_takes_a_model_to_a_served_classifier(framework, workspace):
    ws = workspace
    marker, suffix, _ = FRAMEWORKS[framework]
    blocks = code_blocks(section_text())
    exports = [b for b in blocks if b.language == "python" and marker in b.text]
    assert len(exports) == 1, f"expected one {framework} export block in the README section"
    assert all(b.language in ("python", "sh") for b in blocks), [b.language for b in blocks]
    saved = export(exports[0], framework, ws)

    photo = next(p for p in sample_photos() if p.name == "chelsea.png")
    served, model_dir, ran, checked = None, None, [], []
    try:
        for block in (b for b in blocks if b.language == "sh"):
            for argv in commands(block):
                if argv[:3] == ["python", "-m", "converter"]:
                    if argv[3] == "quantize":
                        if argv[4].endswith(suffix):
                            assert argv[4] == saved, f"step 1 saves {saved}, step 2 quantizes {argv[4]}"
                            model_dir = quantize(argv, ws)
                            ran.append("quantize")
                        continue
                    if argv[3] == "import":  # the road for a file one already has: tests/test_import_readme.py
                        continue
                    if argv[3] == "compile":
                        assert model_dir is not None, "the section compiles before it quantizes"
                        assert argv[-1] == f"models/{model_dir.name}", argv
                        compile_(argv, ws)
                        ran.append("compile")
                        continue
                    raise AssertionError(f"a converter command this test does not know: {shlex.join(argv)}")
                if any(tuple(argv[:len(prefix)]) == prefix for prefix in NOT_RUN_HERE):
                    checked.append(argv)
                elif argv[0] == "scp":
                    place(argv, ws)
                    ran.append("place")
                elif argv[:2] == ["make", "serve"]:
                    assert served is None, "the section starts the service twice"
                    served = MakeServe(argv, ws)
                    served.wait_ready()
                    ran.append("make serve")
                elif argv[0] == "curl":
                    assert served is not None, "the section classifies before it starts the service"
                    answer = classify(argv, served.port, photo, ws)
                    assert answer["model"] == model_dir.name and answer["backend"] == "cpu"
                    top_k = int(re.search(r"top_k=(\d+)", shlex.join(argv)).group(1))
                    assert len(answer["predictions"]) == top_k
                    assert {p["label"] for p in answer["predictions"]} <= set(LABELS)
                    assert answer["timing_ms"]["total"] > 0
                    ran.append("curl")
                else:
                    raise AssertionError(f"a README command this test does not know how to run: {shlex.join(argv)}")
    finally:
        if served is not None:
            served.stop()

    assert ran == ["quantize", "compile", "place", "make serve", "curl"]
    docker_runs = [a for a in checked if a[:2] == ["docker", "run"]]
    assert docker_runs and all("/models:ro" in " ".join(a) and f"EDGETPU_SERVE_MODELS={model_dir.name}" in a
                               for a in docker_runs), "the docker run must mount models/ and name the model"
    assert {a[-1] for a in docker_runs} <= {"edgetpu-serve:latest", "edgetpu-serve:devboard"}
    # the USB bus bind-mounted with USB's major allowed: the Accelerator re-enumerates on a new node
    assert "/dev/bus/usb:/dev/bus/usb" in docker_runs[0] and "--device-cgroup-rule=c 189:* rmw" in docker_runs[0]
    assert ["sudo", "make", "images", "IMAGES=latest"] in checked  # a USB user builds the x86-64 image only
    downloads = [a for a in checked if a[0] == "curl"]
    assert [a[-1].rsplit("/", 1)[-1] for a in downloads] == ["libedgetpu1-max_16.0tf2.17.1-1.bookworm_amd64.deb"]
    assert all(a[3] == "docker/runtime/" + a[-1].rsplit("/", 1)[-1] for a in downloads)  # saved where the build looks
    downloads = [a[-1].rsplit("/", 1)[-1] for a in downloads]
    pinned = {f["name"] for f in tomllib.loads((ROOT / "app/edgetpu/versions.toml").read_text())["runtime_file"]}
    assert set(downloads) <= pinned, "the README downloads the runtime files the build checks by sha256"
