"""The pinned version sets (versions.toml) and the start-up check that a pair matches one.

The library answers only "RuntimeVersion(14)", which Coral's 16.0 and the community
16.0tf2.17.1 builds share although they pair with different TFLite runtimes, so the
Debian package version (from dpkg's database, where there is one) tells them apart.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from app.edgetpu.errors import EdgeTpuVersionMismatch

VERSIONS_FILE = Path(__file__).with_name("versions.toml")
DPKG_STATUS = Path("/var/lib/dpkg/status")
# Debian packages that provide libedgetpu.so.1 (Coral's and the community builds).
LIBEDGETPU_PACKAGES = ("libedgetpu1-std", "libedgetpu1-max", "libedgetpu1-legacy-std", "libedgetpu1-legacy-max")

_RUNTIME_VERSION = re.compile(r"RuntimeVersion\((\d+)\)")


@dataclass(frozen=True)
class VersionSet:
    name: str
    description: str
    libedgetpu: str
    runtime_version: int
    tflite_runtime: str  # the TFLite runtime's version
    python: str
    runtime: str = "tflite-runtime"  # the TFLite runtime's distribution


@dataclass(frozen=True)
class ImagePins:
    """What the Docker images install ([image] of versions.toml)."""

    set: str
    base_image: str
    libedgetpu_release: str
    libedgetpu_deb_version: str
    libedgetpu_flavor: str
    tflite_runtime_version: str
    tflite_runtime_wheels: dict[str, str]  # arch (amd64, arm64) -> wheel URL

    def build_args(self, arch: str) -> dict[str, str]:
        """The Dockerfile ARG defaults these pins stand for (key upper-cased)."""
        return {
            "BASE_IMAGE": self.base_image,
            "LIBEDGETPU_RELEASE": self.libedgetpu_release,
            "LIBEDGETPU_DEB_VERSION": self.libedgetpu_deb_version,
            "LIBEDGETPU_FLAVOR": self.libedgetpu_flavor,
            "TFLITE_RUNTIME_VERSION": self.tflite_runtime_version,
            "TFLITE_RUNTIME_WHEEL": self.tflite_runtime_wheels[arch],
        }


@dataclass(frozen=True)
class Pins:
    image: ImagePins
    sets: tuple[VersionSet, ...]

    def set_named(self, name: str) -> VersionSet:
        for version_set in self.sets:
            if version_set.name == name:
                return version_set
        raise KeyError(name)


@dataclass(frozen=True)
class LibraryVersion:
    """What is known about the installed libedgetpu."""

    text: str                    # edgetpu_version()
    runtime_version: int | None  # its RuntimeVersion(N)
    package: str | None = None   # Debian package version, when dpkg knows it

    @property
    def upstream(self) -> str | None:
        return self.package.split("-", 1)[0] if self.package else None

    def describe(self) -> str:
        package = f"package {self.package}, " if self.package else ""
        return f"libedgetpu ({package}Edge TPU runtime {self.runtime_version}; {self.text!r})"


def read_pins(path: Path = VERSIONS_FILE) -> Pins:
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    image = raw["image"]
    arches = {key: value for key, value in image.items() if isinstance(value, dict)}
    pins = ImagePins(
        set=image["set"], base_image=image["base_image"], libedgetpu_release=image["libedgetpu_release"],
        libedgetpu_deb_version=image["libedgetpu_deb_version"], libedgetpu_flavor=image["libedgetpu_flavor"],
        tflite_runtime_version=image["tflite_runtime_version"],
        tflite_runtime_wheels={arch: table["tflite_runtime_wheel"] for arch, table in arches.items()
                               if "tflite_runtime_wheel" in table},
    )
    sets = tuple(VersionSet(**entry) for entry in raw["set"])
    result = Pins(pins, sets)
    result.set_named(pins.set)  # the images install a set that is listed
    return result


@cache
def pins() -> Pins:
    return read_pins()


@dataclass(frozen=True)
class CompilerPin:
    """The edgetpu_compiler the converter expects ([compiler] of versions.toml)."""

    version: str
    package: str
    apt_source: str
    apt_key: str
    min_runtime_version: int  # the runtime of the set the images install: compile with -m this


def read_compiler_pin(path: Path = VERSIONS_FILE) -> CompilerPin:
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    image_set = read_pins(path).set_named(raw["image"]["set"])
    return CompilerPin(min_runtime_version=image_set.runtime_version, **raw["compiler"])


@cache
def compiler_pin() -> CompilerPin:
    return read_compiler_pin()


def image_pins() -> ImagePins:
    return pins().image


def parse_runtime_version(text: str) -> int | None:
    """The N of '... RuntimeVersion(N)' in edgetpu_version()'s answer."""
    found = _RUNTIME_VERSION.search(text or "")
    return int(found.group(1)) if found else None


def installed_package_version(status_file: Path = DPKG_STATUS) -> str | None:
    """Version of the installed libedgetpu Debian package, from dpkg's status file."""
    try:
        text = status_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for stanza in text.split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line.startswith((" ", "\t")):
                fields[key.strip()] = value.strip()
        if fields.get("Package") in LIBEDGETPU_PACKAGES and fields.get("Status", "").endswith(" installed"):
            return fields.get("Version")
    return None


def matching_set(library: LibraryVersion, runtime_name: str, runtime_version: str,
                 sets: tuple[VersionSet, ...] | None = None) -> VersionSet | None:
    """The first known-good set this libedgetpu + TFLite runtime pair belongs to, if any."""
    for version_set in sets if sets is not None else pins().sets:
        if (runtime_name == version_set.runtime
                and runtime_version == version_set.tflite_runtime
                and library.runtime_version == version_set.runtime_version
                and library.upstream in (None, version_set.libedgetpu)):
            return version_set
    return None


def mismatch_message(library: LibraryVersion, runtime_name: str, runtime_version: str) -> str:
    image = image_pins()
    return (
        f"{library.describe()} with the TFLite runtime {runtime_name} {runtime_version} is not a known-good "
        f"pair ({VERSIONS_FILE.name}: {', '.join(s.name for s in pins().sets)}): libedgetpu's delegate and the "
        "runtime must come from the same TensorFlow build, or the model fails to prepare or crashes. "
        f"Fix: install the pinned set {image.set!r}, libedgetpu1-{image.libedgetpu_flavor} "
        f"{image.libedgetpu_deb_version} with {pins().set_named(image.set).runtime} {image.tflite_runtime_version} "
        "(the images do: `make images`, docs/images.md); to run this pair anyway set "
        "EDGETPU_SERVE_EDGETPU_VERSION_CHECK=warn"
    )


def check_pairing(library: LibraryVersion, runtime_name: str, runtime_version: str) -> VersionSet:
    found = matching_set(library, runtime_name, runtime_version)
    if found is None:
        raise EdgeTpuVersionMismatch(mismatch_message(library, runtime_name, runtime_version))
    return found


def check_model_runtime(model: str, path: Path, required: int | None, compiler: str | None,
                        library: LibraryVersion) -> None:
    """A model compiled for a newer Edge TPU runtime than the library's cannot run: say so at start."""
    if required is None or library.runtime_version is None or required <= library.runtime_version:
        return
    compiled_by = f" by edgetpu_compiler {compiler}" if compiler else ""
    raise EdgeTpuVersionMismatch(
        f"model {model!r}: {path.name} was compiled{compiled_by} for Edge TPU runtime {required} or newer, "
        f"and {library.describe()} is runtime {library.runtime_version}. Fix: recompile the int8 model for this "
        f"runtime (`edgetpu_compiler -m {library.runtime_version} {path.name.replace('_edgetpu', '')}`), "
        f"or install a libedgetpu with runtime {required} or newer"
    )


_PACKAGE_TOO_NEW = re.compile(
    r"Package requires runtime version \((\d+)\), which is newer than this runtime version \((\d+)\)")


def package_too_new(error: str) -> tuple[int, int] | None:
    """(required, installed) from libedgetpu's refusal to prepare a newer package, if that is the error."""
    found = _PACKAGE_TOO_NEW.search(error)
    return (int(found.group(1)), int(found.group(2))) if found else None
