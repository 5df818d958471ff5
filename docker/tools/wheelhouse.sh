#!/usr/bin/env bash
# Fill docker/wheelhouse/ARCH with the wheels of docker/requirements.lock for that image's platform
# (CPython 3.11, amd64 or arm64), checked against the lock's sha256 as they are downloaded. Runs
# on the host, which reaches PyPI; the image build then installs from this directory with no network.
# pip's own cache makes a second run cheap.
#
# Example usage:
#   docker/tools/wheelhouse.sh arm64
set -euo pipefail

arch="${1:?amd64 or arm64}"
here="$(cd "$(dirname "$0")" && pwd)"
docker_dir="$(dirname "$here")"
python="${PYTHON:-python3}"
. "$here/platforms.sh"
mapfile -t flags < <(pip_platform_flags "$arch")
dest="$docker_dir/wheelhouse/$arch"
mkdir -p "$dest"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes "${flags[@]}" \
  --dest "$dest" -r "$docker_dir/requirements.lock" 2> >(grep -v "^WARNING: Location 'file:" >&2)
# Wheels of an earlier lock would only confuse a reader: keep what the lock names.
wanted="$(sed -n 's/^\([A-Za-z0-9._-]*\)==\([^ ]*\).*/\1 \2/p' "$docker_dir/requirements.lock" \
          | awk '{gsub(/[-_.]+/, "_", $1); print tolower($1) "-" $2 "-"}')"
for wheel in "$dest"/*.whl; do
  stem="$(basename "$wheel" | awk -F- '{n=$1; gsub(/[-_.]+/, "_", n); print tolower(n) "-" $2 "-"}')"
  grep -qxF "$stem" <<< "$wanted" || rm -f "$wheel"
done
echo "wheelhouse.sh: $(ls "$dest" | wc -l) wheels in $dest" >&2
