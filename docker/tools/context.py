"""Assemble the build context of one image: what the Dockerfiles COPY, and nothing unchecked.

The context holds app/, converter/, models/, the docker/ files the Dockerfiles name, the
wheelhouse (docker/wheelhouse/<arch>, filled by docker/tools/wheelhouse.sh from the hash-pinned
lock) and runtime/: the Edge TPU files only GitHub releases and Coral's apt repository host,
read from the directory the user fills. Each runtime file must match its sha256 in
app/edgetpu/versions.toml ([[runtime_file]]) or in a file of sums the user recorded at a trusted
download (--trust, `sha256sum` format); a file that matches neither stops the build, with its
sum and where to record it. Absent files are fine: the image is then CPU and emulator only.

Example usage:
    python docker/tools/context.py --arch arm64 --runtime docker/runtime --out /tmp/ctx-arm64
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import shutil
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ROOT / "app" / "edgetpu" / "versions.toml"
# runtime/ file name patterns the Dockerfiles look for, per image architecture (the compiler
# runs in the x86-64 build stage of both images).
WANTED = {
    "amd64": ("libedgetpu1-*_amd64.deb", "edgetpu-compiler_*_amd64.deb"),
    "arm64": ("libedgetpu1-*_arm64.deb", "edgetpu-compiler_*_amd64.deb"),
}
SOURCES = ("app", "converter", "models")
DOCKER_FILES = ("docker/requirements.lock", "docker/tools/platforms.sh", "docker/clone3_enosys.py")


class UntrustedFile(Exception):
    pass


@dataclass(frozen=True)
class Pin:
    name: str
    sha256: str
    url: str


def read_pins(versions: Path = VERSIONS) -> dict[str, Pin]:
    with open(versions, "rb") as f:
        raw = tomllib.load(f)
    return {entry["name"]: Pin(entry["name"], entry["sha256"], entry["url"]) for entry in raw.get("runtime_file", [])}


def read_trusted(path: Path | None) -> dict[str, str]:
    """name -> sha256 from `sha256sum` output lines ("<sum>  <name>")."""
    if path is None:
        return {}
    trusted = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            digest, name = line.split(maxsplit=1)
            trusted[Path(name.lstrip("*")).name] = digest.lower()
    return trusted


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_runtime_file(path: Path, pins: dict[str, Pin], trusted: dict[str, str]) -> str:
    """Where the file's sum is pinned ("versions.toml" or "trusted"); raises UntrustedFile otherwise."""
    actual = sha256_file(path)
    pin = pins.get(path.name)
    if pin is not None and pin.sha256:
        if actual != pin.sha256:
            raise UntrustedFile(f"{path}: sha256 {actual}, {VERSIONS.name} pins {pin.sha256}: not the file the "
                                f"project pinned (download it again from {pin.url or 'its source'})")
        return VERSIONS.name
    if path.name in trusted:
        if actual != trusted[path.name]:
            raise UntrustedFile(f"{path}: sha256 {actual}, your trusted sums say {trusted[path.name]}")
        return "trusted"
    raise UntrustedFile(
        f"{path}: no sha256 is pinned for it. If you downloaded it from its source over HTTPS and trust it, "
        f"record its sum once and pass the file: `sha256sum {path.name} >> trusted.sha256` "
        f"(then TRUST_FILE=trusted.sha256 make images); its sum: {actual}")


def runtime_files(runtime: Path | None, arch: str, pins: dict[str, Pin], trusted: dict[str, str]) -> list[Path]:
    """The runtime files this image takes, each checked; at most one of each kind."""
    if runtime is None or not runtime.is_dir():
        return []
    chosen = []
    for pattern in WANTED[arch]:
        found = sorted(p for p in runtime.iterdir() if fnmatch.fnmatch(p.name, pattern))
        if len(found) > 1:
            raise UntrustedFile(f"{runtime}: {len(found)} files match {pattern} ({', '.join(p.name for p in found)}): "
                                "keep one")
        for path in found:
            source = check_runtime_file(path, pins, trusted)
            print(f"context.py: {path.name}: sha256 matches ({source})", file=sys.stderr)
            chosen.append(path)
    return chosen


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def assemble(out: Path, arch: str, runtime: Path | None, trust: Path | None, wheelhouse: Path) -> list[Path]:
    files = runtime_files(runtime, arch, read_pins(), read_trusted(trust))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        shutil.copytree(ROOT / name, out / name, ignore=ignore, copy_function=_link_or_copy)
    for name in DOCKER_FILES:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(str(ROOT / name), str(out / name))
    for wheel_arch in sorted({arch, "amd64"}):  # amd64: the compiler stage's own
        source = wheelhouse / wheel_arch
        if not any(source.glob("*.whl")):
            raise SystemExit(f"context.py: no wheels in {source}: run docker/tools/wheelhouse.sh {wheel_arch}")
        shutil.copytree(source, out / "wheelhouse" / wheel_arch, copy_function=_link_or_copy)
    (out / "runtime").mkdir()
    for path in files:
        _link_or_copy(str(path), str(out / "runtime" / path.name))
    return files


def summary(files: list[Path]) -> str:
    """What the image will be, from the runtime files it takes."""
    names = [p.name for p in files]
    library = any(n.startswith("libedgetpu1-") for n in names)
    compiler = any(n.startswith("edgetpu-compiler_") for n in names)
    return "; ".join([
        "libedgetpu: installed" if library else "no libedgetpu: a CPU and emulator image (/v1/devices says why)",
        "edgetpu_compiler: the models are compiled in the build" if compiler
        else "no edgetpu_compiler: the models stay CPU-only",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=sorted(WANTED), required=True, help="the image's architecture")
    parser.add_argument("--out", type=Path, required=True, help="the context directory to (re)create")
    parser.add_argument("--runtime", type=Path, default=ROOT / "docker" / "runtime",
                        help="the directory you fill with the Edge TPU runtime files (default docker/runtime)")
    parser.add_argument("--trust", type=Path, default=None,
                        help="sha256sum-format file of runtime files you recorded yourself (e.g. the std flavor)")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "docker" / "wheelhouse",
                        help="the directory of per-architecture wheel directories")
    args = parser.parse_args()
    try:
        files = assemble(args.out, args.arch, args.runtime, args.trust, args.wheelhouse)
    except UntrustedFile as e:
        sys.exit(f"context.py: {e}")
    print(f"context.py: {args.arch} context in {args.out}; {summary(files)}", file=sys.stderr)


if __name__ == "__main__":
    main()
