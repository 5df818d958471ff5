#!/usr/bin/env bash
# Let this x86-64 host run arm64 programs (debootstrap's second stage, the Dev Board image's
# build and container) through qemu-user-static: mount binfmt_misc if it is not, enable
# qemu-aarch64 (Debian registers it with the F flag, so it works inside chroots and containers).
# Needs root, qemu-user-static and binfmt-support; does nothing when already enabled.
set -euo pipefail
[ -e /proc/sys/fs/binfmt_misc/status ] || mount binfmt_misc -t binfmt_misc /proc/sys/fs/binfmt_misc
grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2> /dev/null || update-binfmts --enable qemu-aarch64
