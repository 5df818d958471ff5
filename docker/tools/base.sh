#!/usr/bin/env bash
# The images' base: Debian SUITE for ARCH made by debootstrap (no registry is needed), imported
# into the Docker engine as edgetpu-serve-base:SUITE-ARCH-KEY with its architecture set right.
#
# The root filesystem is cached as a tarball outside the checkout, keyed by suite, architecture
# and package list, so a second build (CI on the same machine) reuses it: 44 s for amd64 and
# ~160 s for arm64 (debootstrap's second stage runs under QEMU) only the first time.
#
# Example usage:
#   docker/tools/base.sh bookworm arm64          # prints the image name on stdout
#   EDGETPU_SERVE_CACHE=/tmp/cache docker/tools/base.sh bookworm amd64
set -euo pipefail

suite="${1:?suite, e.g. bookworm}"
arch="${2:?Debian architecture: amd64 or arm64}"
here="$(cd "$(dirname "$0")" && pwd)"
cache="${EDGETPU_SERVE_CACHE:-/var/cache/edgetpu-serve}"
docker="${DOCKER:-/usr/bin/docker}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Debian's Python 3.11 (bookworm) with venv for the wheels, libusb for libedgetpu (its one
# dependency), so that the runtime .deb installs with dpkg alone, offline.
packages="${BASE_PACKAGES:-python3,python3-venv,libusb-1.0-0}"

key="$(printf '%s\n' "$suite" "$arch" "$packages" "$mirror" | sha256sum | cut -c1-12)"
tarball="$cache/base/$suite-$arch-$key.tar"
image="edgetpu-serve-base:$suite-$arch-$key"
log() { echo "base.sh: $*" >&2; }

# Also tagged edgetpu-serve-base:SUITE-ARCH: the Dockerfiles' default BASE_IMAGE.
if "$docker" image inspect "$image" > /dev/null 2>&1; then
  "$docker" tag "$image" "edgetpu-serve-base:$suite-$arch"
  echo "$image"
  exit 0
fi

if [ ! -f "$tarball" ]; then
  [ "$(id -u)" -eq 0 ] || { log "debootstrap needs root (or put $tarball in place)"; exit 1; }
  [ "$arch" = "$(dpkg --print-architecture)" ] || bash "$here/binfmt.sh"
  mkdir -p "$cache/base"
  root="$(mktemp -d "$cache/base/rootfs.XXXXXX")"
  trap 'rm -rf "$root" "$root.log"' EXIT
  log "debootstrap $suite $arch ($packages) from $mirror: about a minute for the host's architecture, three under QEMU"
  debootstrap --variant=minbase --arch="$arch" --include="$packages" "$suite" "$root" "$mirror" > "$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; exit 1; }
  rm -rf "$root.log"
  # What a container does not need: package lists and caches (apt works from the image's own files).
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
         "$root"/usr/share/man/* "$root"/usr/share/locale/*
  tar --numeric-owner -C "$root" -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
  rm -rf "$root"
  trap - EXIT
fi

# FROM scratch + ADD under --platform: the image's config says arm64 where it is (docker import
# would label every tarball with the engine's own architecture).
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
ln "$tarball" "$context/rootfs.tar" 2> /dev/null || cp "$tarball" "$context/rootfs.tar"
printf 'FROM scratch\nADD rootfs.tar /\nCMD ["bash"]\n' > "$context/Dockerfile"
log "importing $tarball as $image"
DOCKER_BUILDKIT=1 "$docker" build --quiet --network=none --platform "linux/$arch" -t "$image" \
  -t "edgetpu-serve-base:$suite-$arch" "$context" > /dev/null
echo "$image"
