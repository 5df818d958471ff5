"""`make images` on the hosts people have (docker/tools/host.sh), in FAKE environments: a PATH of stubs (id,
dpkg-query, apt-get, docker, dockerd, debootstrap, QEMU) beside the few real tools the scripts use, and a fake
os-release. Without root or on a host with neither apt nor debootstrap it refuses and says what to do; a Docker
engine already here (Docker CE running or installed) is used, never replaced by docker.io."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT

HOST = ROOT / "docker" / "tools" / "host.sh"
INSTALL = ROOT / "tests" / "install-debian-packages.sh"
# The real tools the two scripts call; everything else on PATH is a stub, or absent.
REAL_TOOLS = ("bash", "cat", "dirname", "env", "grep", "head", "mktemp", "rm", "sed", "tr")
DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
FEDORA = 'PRETTY_NAME="Fedora Linux 40 (Workstation Edition)"\nID=fedora\n'


@dataclass
class FakeHost:
    """What the stubs pretend: who runs, which packages are installed, which commands exist, an engine's answer."""

    uid: int = 0
    os_release: str = DEBIAN
    installed: set[str] = field(default_factory=set)
    commands: set[str] = field(default_factory=lambda: {"apt-get", "dpkg-query"})
    engine_running: str | None = None  # the server version `docker version` answers


def stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def fake_bin(tmp_path: Path, host: FakeHost) -> Path:
    """The fake host's PATH: the real tools of REAL_TOOLS and the stubs; apt-get logs to apt-get.log beside it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in REAL_TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    log = tmp_path / "apt-get.log"
    stub(bin_dir / "id", f'[ "$1" = -u ] && echo {host.uid} || echo "uid={host.uid}"\n')
    installed = " ".join(sorted(host.installed))
    if "dpkg-query" in host.commands:
        stub(bin_dir / "dpkg-query", f'for p in {installed}; do [ "$p" = "${{@: -1}}" ] && '
                                     'echo "install ok installed" && exit 0; done; exit 1\n')
    if "apt-get" in host.commands:
        stub(bin_dir / "apt-get", f'echo "$*" >> {log}\n')
    docker = bin_dir / "docker"
    if host.engine_running:
        stub(docker, f'[ "$1" = version ] && echo {host.engine_running} && exit 0; exit 1\n')
    else:
        stub(docker, "echo 'Cannot connect to the Docker daemon' >&2; exit 1\n")
    for command in host.commands - {"apt-get", "dpkg-query"}:
        stub(bin_dir / command, "exit 0\n")
    return bin_dir


def apt_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "apt-get.log"
    return log.read_text().splitlines() if log.exists() else []


def run(tmp_path: Path, host: FakeHost, *targets: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """host.sh in the fake host; returns its result and every apt-get call the stubs logged."""
    bin_dir = fake_bin(tmp_path, host)
    (tmp_path / "os-release").write_text(host.os_release)
    env = {"PATH": str(bin_dir), "OS_RELEASE": str(tmp_path / "os-release"), "PYTHON": sys.executable,
           "DOCKER": str(bin_dir / "docker")}
    done = subprocess.run([shutil.which("bash"), str(HOST), *targets], env=env, capture_output=True, text=True,
                          timeout=60)
    return done, apt_calls(tmp_path)


def test_without_root_it_refuses_and_says_sudo(tmp_path):
    done, calls = run(tmp_path, FakeHost(uid=1000), "latest")
    assert done.returncode == 1 and not calls
    assert "make images needs root: debootstrap builds the images' Debian base in a chroot" in done.stderr
    assert "Run: sudo make images IMAGES=latest" in done.stderr


def test_a_host_without_apt_or_debootstrap_is_refused_with_the_reason(tmp_path):
    done, calls = run(tmp_path, FakeHost(os_release=FEDORA, commands=set()), "latest")
    assert done.returncode == 1 and not calls
    assert "make images builds on Debian or Ubuntu" in done.stderr
    assert "Fedora Linux 40 (Workstation Edition) has no apt, and lacks: debootstrap dockerd" in done.stderr


def test_another_distribution_with_the_tools_goes_on(tmp_path):
    done, _ = run(tmp_path, FakeHost(os_release=FEDORA, commands={"debootstrap", "dockerd"}), "latest")
    assert done.returncode == 0, done.stderr
    assert "is not Debian or Ubuntu; what the build needs is here: going on" in done.stderr


def test_a_running_docker_ce_is_used_as_it_is(tmp_path):
    host = FakeHost(installed={"docker-ce", "docker-ce-cli", "containerd.io"}, engine_running="27.3.1")
    done, calls = run(tmp_path, host, "latest")
    assert done.returncode == 0, done.stderr
    assert calls == ["-q install -y --no-install-recommends debootstrap"]  # what was missing, and no engine
    assert "Docker: using the Docker engine running here (27.3.1" in done.stderr


def test_an_installed_engine_that_is_not_running_is_not_replaced(tmp_path):
    host = FakeHost(installed={"docker-ce", "debootstrap", "qemu-user-static", "binfmt-support"})
    done, calls = run(tmp_path, host, "latest", "devboard")
    assert done.returncode == 0, done.stderr
    assert calls == []
    assert "the installed Docker engine (docker-ce; not running: the build starts it" in done.stderr


def test_docker_io_only_where_no_engine_is(tmp_path):
    done, calls = run(tmp_path, FakeHost(), "latest")
    assert done.returncode == 0, done.stderr
    assert calls == ["-q install -y --no-install-recommends debootstrap docker.io"]


def test_usb_and_pcie_users_are_shown_the_one_image_they_need(tmp_path):
    host = FakeHost(installed={"docker.io", "debootstrap"}, engine_running="20.10.24")
    done, calls = run(tmp_path, host, "latest", "devboard")
    assert calls == ["-q install -y --no-install-recommends qemu-user-static binfmt-support"]  # the Dev Board's only
    assert "A USB Accelerator or a PCIe/M.2 card needs only the x86-64 image: make images IMAGES=latest" in done.stderr
    alone, _ = run(tmp_path / "latest", host, "latest")
    assert "IMAGES=latest" not in alone.stderr  # asked for already


def test_an_unknown_image_is_refused(tmp_path):
    done, _ = run(tmp_path, FakeHost(), "usb")
    assert done.returncode == 1 and "unknown image usb: IMAGES=latest" in done.stderr


@pytest.mark.parametrize(("installed", "installs"), [({"docker-ce"}, []), (set(), ["docker.io"])])
def test_the_tests_list_takes_any_engine(tmp_path, installed, installs):
    """`make test`'s own list (tests/debian-packages.txt) names the engine as alternatives: docker-ce satisfies it."""
    (tmp_path / "list.txt").write_text("docker.io|docker-ce|moby-engine  # the engine\n")
    env = {"PATH": str(fake_bin(tmp_path, FakeHost(installed=installed)))}
    done = subprocess.run([shutil.which("bash"), str(INSTALL), str(tmp_path / "list.txt")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert apt_calls(tmp_path) == ([f"-q install -y --no-install-recommends {' '.join(installs)}"] if installs else [])
    assert "docker.io|docker-ce|moby-engine|docker-engine" in (ROOT / "tests" / "debian-packages.txt").read_text()
