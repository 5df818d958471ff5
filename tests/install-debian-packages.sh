#!/usr/bin/env bash
# Install the Debian/Ubuntu packages listed in a file (default: tests/debian-packages.txt) that are
# not installed yet: as root directly, otherwise through sudo. Nothing missing: nothing done, no root
# asked for. The package lists are refreshed (apt-get update) only when an install fails without it.
# An entry `a|b|c` is satisfied by any one of them installed, else `a` is installed: a host with
# docker-ce keeps it, and never gets docker.io installed over it.
#
# Example usage:
#   bash tests/install-debian-packages.sh                       # what `make test` runs first
#   bash tests/install-debian-packages.sh my-packages.txt
set -euo pipefail

list="${1:-$(dirname "$0")/debian-packages.txt}"
mapfile -t wanted < <(sed 's/#.*//' "$list" | tr -s ' \t' '\n\n' | grep -v '^$' || true)
[ "${#wanted[@]}" -gt 0 ] || exit 0

fail() {
  echo "install-debian-packages: $1" >&2
  echo "install-debian-packages: these Debian packages are needed ($list): ${missing[*]}" >&2
  echo "install-debian-packages: install them yourself, then run make again:  sudo apt-get install ${missing[*]}" >&2
  exit 1
}

missing=()
if ! command -v dpkg-query > /dev/null; then
  missing=("${wanted[@]%%|*}")
  fail "no dpkg-query: not a Debian/Ubuntu system"
fi
installed() { dpkg-query -W -f='${Status}\n' "$1" 2> /dev/null | grep -q ' installed$'; }
for entry in "${wanted[@]}"; do
  IFS='|' read -ra alternatives <<< "$entry"
  found=""
  for package in "${alternatives[@]}"; do
    if installed "$package"; then found=1; break; fi
  done
  [ -n "$found" ] || missing+=("${alternatives[0]}")
done
[ "${#missing[@]}" -gt 0 ] || exit 0

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo > /dev/null; then
  as_root=(sudo)
else
  fail "not root and no sudo"
fi
apt_get() { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q "$@"; }

echo "install-debian-packages: installing ${missing[*]}${as_root:+ (with sudo)}" >&2
if ! apt_get install -y --no-install-recommends "${missing[@]}"; then
  echo "install-debian-packages: refreshing the package lists and trying again" >&2
  apt_get update || fail "apt-get update failed"
  apt_get install -y --no-install-recommends "${missing[@]}" || fail "apt-get install failed"
fi
