#!/usr/bin/env bash
# Can this host build the images, and what does it lack? Run by `make images` before docker/tools/images.sh.
#
# The build makes the images' Debian base with debootstrap (a chroot: root), enables arm64 emulation for the
# Dev Board image (binfmt_misc: root), and may start a Docker engine: so it refuses, saying why and what to
# do, without root, or on a host with neither apt nor debootstrap. A Docker engine already here (Docker CE,
# docker.io, moby-engine; running or only installed) is used as it is: docker.io is installed only where no
# engine is, never over another one. The rest (debootstrap; QEMU and binfmt-support for the Dev Board image
# only) is installed when missing, through tests/install-debian-packages.sh.
#
# Example usage:
#   docker/tools/host.sh latest devboard        # the targets images.sh will build
#   OS_RELEASE=/tmp/os-release docker/tools/host.sh latest   # the tests' fake environments
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
os_release="${OS_RELEASE:-/etc/os-release}"
python="${PYTHON:-python3}"
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(latest devboard)
ENGINE_PACKAGES=(docker.io docker-ce moby-engine docker-engine)
say() { echo "images: $*" >&2; }
refuse() { say "$*"; exit 1; }

with_board=""
for target in "${targets[@]}"; do
  case "$target" in
    devboard) with_board=1 ;;
    latest | devboard-amd64) ;;
    *) refuse "unknown image $target: IMAGES=latest (x86-64: USB Accelerator, PCIe/M.2 card), devboard (arm64: Coral Dev Board) or devboard-amd64" ;;
  esac
done

distribution="this host"
if [ -r "$os_release" ]; then
  distribution="$(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$os_release" | head -1)"
  distribution="${distribution:-this host}"
fi

if [ "$(id -u)" -ne 0 ]; then
  refuse "make images needs root: debootstrap builds the images' Debian base in a chroot, the Dev Board image needs" \
    "arm64 emulation (binfmt_misc), and without a running Docker engine it starts one. Run: sudo make images" \
    "IMAGES=${targets[*]}"
fi

has() { command -v "$1" > /dev/null 2>&1; }
installed() { has dpkg-query && dpkg-query -W -f='${Status}\n' "$1" 2> /dev/null | grep -q ' installed$'; }

# The client images.sh uses (DOCKER, else the distribution's /usr/bin/docker, else the one on PATH).
docker_cli="${DOCKER:-}"
if [ -z "$docker_cli" ]; then
  if [ -x /usr/bin/docker ]; then docker_cli=/usr/bin/docker; elif has docker; then docker_cli="$(command -v docker)"; fi
fi
engine=""
if [ -n "$docker_cli" ]; then
  server="$("$docker_cli" version --format '{{.Server.Version}}' 2> /dev/null || true)"
  [ -z "$server" ] || engine="the Docker engine running here ($server, $docker_cli)"
fi
if [ -z "$engine" ]; then
  for package in "${ENGINE_PACKAGES[@]}"; do
    if installed "$package"; then
      engine="the installed Docker engine ($package; not running: the build starts it, docker/tools/dockerd.sh)"
      break
    fi
  done
fi
if [ -z "$engine" ] && has dockerd; then
  engine="the Docker engine at $(command -v dockerd) (not running: the build starts it, docker/tools/dockerd.sh)"
fi

# What the targets need, as commands, and the Debian package of each.
needed=(debootstrap:debootstrap)
[ -z "$with_board" ] || needed+=(qemu-aarch64-static:qemu-user-static update-binfmts:binfmt-support)
[ -n "$engine" ] || needed+=(dockerd:docker.io)

if ! has apt-get || ! has dpkg-query; then
  lacking=()
  for pair in "${needed[@]}"; do has "${pair%%:*}" || lacking+=("${pair%%:*}"); done
  if [ "${#lacking[@]}" -gt 0 ]; then
    refuse "make images builds on Debian or Ubuntu (apt installs what it needs: debootstrap makes the images'" \
      "Debian base offline); $distribution has no apt, and lacks: ${lacking[*]}. Build on a Debian or Ubuntu" \
      "machine or VM, or install those yourself and run make images again."
  fi
  say "$distribution is not Debian or Ubuntu; what the build needs is here: going on"
else
  packages="$(mktemp)"
  trap 'rm -f "$packages"' EXIT
  for pair in "${needed[@]}"; do echo "${pair#*:}" >> "$packages"; done
  bash "$root/tests/install-debian-packages.sh" "$packages"
fi

if ! "$python" -c 'import sys, tomllib; import pip' 2> /dev/null; then
  refuse "the build runs $python for the wheelhouse and the build context: it needs Python 3.11 or newer with pip" \
    "(Debian: apt-get install python3-pip). Another interpreter: make images PYTHON=/path/to/python3.11"
fi

say "Docker: using ${engine:-docker.io, just installed}"
if [ -n "$with_board" ]; then
  say "building ${targets[*]}. A USB Accelerator or a PCIe/M.2 card needs only the x86-64 image:" \
    "make images IMAGES=latest (the Dev Board's arm64 image adds 2.5 to 19 minutes under QEMU)"
fi
