#!/usr/bin/env bash
# Build the images offline, as `make images` does: edgetpu-serve:latest (x86-64, Dockerfile) and
# edgetpu-serve:devboard (arm64, docker/devboard.Dockerfile, through QEMU on an x86-64 host).
#
# Per image: the Debian bookworm base (docker/tools/base.sh: debootstrap, cached), the wheelhouse
# (docker/tools/wheelhouse.sh: pip download of the hash-pinned lock), the build context with the
# runtime files you put in RUNTIME_DIR checked by sha256 (docker/tools/context.py), then
# `docker build --network=none`. Nothing inside a build reaches a network.
#
# Uses the Docker engine DOCKER_HOST names, or the default one; when none answers and this is
# root, it starts a private one (docker/tools/dockerd.sh, data in $CACHE/dockerd) for the build,
# stops it after, and says how to reach the images.
#
# Example usage:
#   docker/tools/images.sh                    # both
#   docker/tools/images.sh devboard           # one: latest | devboard | devboard-amd64
#   RUNTIME_DIR=~/coral TRUST_FILE=~/coral/trusted.sha256 docker/tools/images.sh
# devboard-amd64 is the Dev Board recipe built for x86-64 (edgetpu-serve:devboard-amd64): how its
# base is checked against Mendel's clone3-EPERM seccomp profile on a machine without arm64 CPUs.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# The distribution's client (/usr/bin/docker: docker.io and Docker CE alike) before another on PATH, which
# may be an old client-only binary (/usr/local/bin/docker on some hosts).
if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER="$(command -v docker || echo docker)"; fi
fi
export DOCKER
cache="${EDGETPU_SERVE_CACHE:-/var/cache/edgetpu-serve}"
export EDGETPU_SERVE_CACHE="$cache"
runtime_dir="${RUNTIME_DIR:-$root/docker/runtime}"
trust_file="${TRUST_FILE:-}"
python="${PYTHON:-python3}"
# The repository the images are tagged in (the tests use their own, so that their images, built with
# test doubles, never stand in for yours).
name="${IMAGE_NAME:-edgetpu-serve}"
suite=bookworm
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(latest devboard)
log() { echo "images.sh: $*" >&2; }

started_engine=""
if ! "$DOCKER" version > /dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || { log "no Docker engine answers ($DOCKER version) and this is not root to start one"; exit 1; }
  eval "export $(bash "$here/dockerd.sh" start "$cache/dockerd")"
  started_engine="$cache/dockerd"
  trap 'bash "$here/dockerd.sh" stop "$started_engine"' EXIT
  log "started a Docker engine for the build: $DOCKER_HOST"
fi

build() {  # tag dockerfile arch
  local tag="$1" dockerfile="$2" arch="$3" base build_base started
  [ "$arch" = amd64 ] || bash "$here/binfmt.sh"
  base="$(bash "$here/base.sh" "$suite" "$arch")"
  build_base="$(bash "$here/base.sh" "$suite" amd64)"
  PYTHON="$python" bash "$here/wheelhouse.sh" "$arch"
  [ "$arch" = amd64 ] || PYTHON="$python" bash "$here/wheelhouse.sh" amd64
  local context="$cache/context/$name-$tag"
  "$python" "$here/context.py" --arch "$arch" --out "$context" --runtime "$runtime_dir" \
    ${trust_file:+--trust "$trust_file"}
  started=$SECONDS
  DOCKER_BUILDKIT=1 "$DOCKER" build --network=none --platform "linux/$arch" -f "$root/$dockerfile" \
    --build-arg BASE_IMAGE="$base" --build-arg BUILD_BASE_IMAGE="$build_base" -t "$name:$tag" "$context"
  log "$name:$tag (linux/$arch) built in $((SECONDS - started)) s, $("$DOCKER" image inspect -f '{{.Size}}' "$name:$tag" | awk '{printf "%.0f MB", $1 / 1e6}')"
}

for target in "${targets[@]}"; do
  case "$target" in
    latest) build latest Dockerfile amd64 ;;
    devboard) build devboard docker/devboard.Dockerfile arm64 ;;
    devboard-amd64) build devboard-amd64 docker/devboard.Dockerfile amd64 ;;
    *) log "unknown image $target: latest, devboard or devboard-amd64"; exit 2 ;;
  esac
done
if [ -n "$started_engine" ]; then
  log "the images are in the engine at $started_engine; to use them: eval \"\$(bash docker/tools/dockerd.sh start $started_engine)\"; export DOCKER_HOST"
fi
