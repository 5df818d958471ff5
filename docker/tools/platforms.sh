# The pip download flags for one image architecture (sourced): CPython 3.11 (Debian bookworm's) and
# every manylinux tag its glibc 2.36 accepts, binary wheels only.
pip_platform_flags() {
  local machine
  case "$1" in
    amd64) machine=x86_64 ;;
    arm64) machine=aarch64 ;;
    *) echo "platforms.sh: amd64 or arm64, not $1" >&2; return 2 ;;
  esac
  printf -- '--only-binary=:all:\n--implementation\ncp\n--python-version\n3.11\n--abi\ncp311\n--abi\nabi3\n--abi\nnone\n'
  printf -- '--platform\nmanylinux2014_%s\n' "$machine"
  for minor in $(seq 17 36); do printf -- '--platform\nmanylinux_2_%s_%s\n' "$minor" "$machine"; done
}
