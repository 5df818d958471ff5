#!/bin/bash
# Lays out build/devrun/ (git-ignored): what run.sh needs to run the capacity bench on an offline x86-64 host
# that has Python 3.12 with numpy, Pillow, click, h11 and flatbuffers (see README.md beside this file).
# Fetched here, where PyPI and Debian's archive are reachable; about 45 MB.
#
#   bash bench/offline/pack.sh                 # then carry build/devrun/ there and: OUT=DIR bash build/devrun/run.sh
#
# Knobs (environment): PY (whose pip downloads, and whose installed versions are the ones fetched; default the
# project's venv), DEST (default build/devrun), TARGET_PYTHON (3.12).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/bench/offline"
DEST="${DEST:-$ROOT/build/devrun}"
TARGET_PYTHON="${TARGET_PYTHON:-3.12}"
if [ -z "${PY:-}" ]; then
  for c in "$ROOT/.venv/bin/python" /work/main/.venv/bin/python python3; do
    if "$c" -c 'import fastapi, uvicorn, gunicorn, uvicorn_worker' >/dev/null 2>&1; then PY="$c"; break; fi
  done
fi
# The service's runtime packages, at the versions installed beside the project (numpy and Pillow are the host's).
PACKAGES="ai-edge-litert fastapi starlette annotated-doc anyio idna sniffio typing-extensions typing-inspection
opentelemetry-api backports.strenum uvicorn httptools uvloop pydantic pydantic-core pydantic-settings python-dotenv
annotated-types python-multipart orjson simplejpeg prometheus-client gunicorn uvicorn-worker"

rm -rf "$DEST"
mkdir -p "$DEST"/{proj,whl,wrk,bin,data}
git -C "$ROOT" archive HEAD app bench models pyproject.toml | tar -x -C "$DEST/proj"
echo "project: $(git -C "$ROOT" rev-parse --short HEAD) (committed files only)"

specs=$("$PY" -m pip list --format=freeze 2>/dev/null | "$PY" -c '
import re, sys
wanted = {re.sub(r"[-_.]+", "-", n).lower() for n in sys.argv[1].split()}
for line in sys.stdin:
    name, _, version = line.strip().partition("==")
    if re.sub(r"[-_.]+", "-", name).lower() in wanted:
        print(f"{name}=={version}")
' "$PACKAGES")
for spec in $specs; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET_PYTHON" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 \
    -d "$DEST/whl" "$spec"
done
echo "wheels: $(ls "$DEST/whl" | wc -l) ($(echo $specs | wc -w) packages)"

(cd "$DEST/wrk" && apt-get download -q wrk libluajit-5.1-2 libssl3 >/dev/null 2>&1 \
  && for deb in *.deb; do dpkg-deb -x "$deb" .; done && rm -f ./*.deb)
cp "$HERE/wrk-wrapper.sh" "$DEST/bin/wrk" && chmod +x "$DEST/bin/wrk"
"$PY" - "$DEST/data" <<'EOF'
import shutil, sys
from importlib import metadata
for dist, rel in (("scikit-learn", "sklearn/datasets/images/china.jpg"), ("scikit-image", "skimage/data/chelsea.png")):
    shutil.copy(metadata.distribution(dist).locate_file(rel), sys.argv[1])
EOF
cp "$HERE/run.sh" "$HERE/replicas.py" "$HERE/summary.py" "$DEST/"
chmod +x "$DEST/run.sh"
echo "ready: $DEST ($(du -sh "$DEST" | cut -f1))"
