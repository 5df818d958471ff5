#!/bin/bash
# Device capacity on a many-core machine: how busy ONE edgetpu-serve process keeps 1..8 simulated Edge TPUs
# (D = 2.6 ms, GIL released), 224x224 JPEG and the raw tensor over /v2; then P worker processes on ONE port
# (EDGETPU_SERVE_PROCESSES, gunicorn) sharing N devices; then, for comparison, P replicas on their own ports.
# Run from the checkout that holds build/devrun/: bash build/devrun/run.sh (see bench/offline/README.md)
# Knobs (environment): PY, PROJ, DEVICE_MS, DEVICES, LEVELS, DURATION, PROCESSES ('' = none; PxN: P processes,
# N devices in all), PROCESS_LEVELS, REPLICAS ('' = none), REPLICA_LEVELS, SKIP_INSTALL=1 (use PY's own
# packages: the local test), RUN_BUDGET_S.
set -u -o pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/devout}"
mkdir -p "$OUT"
if [ -z "${PY:-}" ]; then  # the python that has the machine's numpy, Pillow, click, h11, flatbuffers
  for c in python3 /opt/torch/.venv/bin/python3 python3.12 python; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import numpy, PIL, click, h11, flatbuffers' >/dev/null 2>&1; then
      PY="$c"; break
    fi
  done
  PY="${PY:-python3}"
fi
PROJ="${PROJ:-/tmp/devrun_proj}"
DEVICE_MS="${DEVICE_MS:-2.6}"
DEVICES="${DEVICES:-1,2,4,8}"
LEVELS="${LEVELS:-4,16,32,64}"
DURATION="${DURATION:-3}"
PROCESSES="${PROCESSES-4x8,8x8,4x12}"
PROCESS_LEVELS="${PROCESS_LEVELS:-16,32,64}"
REPLICAS="${REPLICAS-4x2}"
REPLICA_LEVELS="${REPLICA_LEVELS:-32,64}"
RUN_BUDGET_S="${RUN_BUDGET_S:-420}"   # the whole script, install included: steps that would not fit are skipped

main() {
  local t0=$SECONDS
  echo "== $(date -u +%FT%TZ) nproc $(nproc); $("$PY" -V 2>&1) at $(command -v "$PY"); load $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -m1 'model name' /proc/cpuinfo || true
  echo "$(ldd --version 2>&1 | head -1); kernel $(uname -r); $(free -g | awk '/Mem:/ {print $2 " GiB"}')"
  "$PY" -c 'import numpy, PIL; print("machine numpy", numpy.__version__, "pillow", PIL.__version__)' || true
  chmod +x "$HERE/bin/wrk" "$HERE/wrk/usr/bin/wrk"
  export PATH="$HERE/bin:$PATH" PYTHONUNBUFFERED=1 PROJ
  local wrk_says
  wrk_says="$(wrk --version 2>&1)"  # prints its version and usage, exits 1
  echo "${wrk_says%%$'\n'*}"
  case "$wrk_says" in wrk\ *) ;; *) echo "FATAL: wrk does not run: $wrk_says"; return 3 ;; esac

  # The project, with the missing packages installed beside it: the bench starts each service with
  # PYTHONPATH=<checkout> alone, so the packages must live in the checkout's folder, not in another one.
  rm -rf "$PROJ" && cp -a "$HERE/proj" "$PROJ" || return 3
  if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$PROJ" "$HERE"/whl/*.whl \
      || { echo "FATAL: pip install failed"; return 3; }
  fi
  export PYTHONPATH="$PROJ"
  echo "== install done at +$((SECONDS - t0)) s"

  # The bench finds its photos through the installed distributions (scikit-learn's china.jpg, scikit-image's
  # chelsea.png); where one is missing, a stand-in distribution in $PROJ points at the carried copies.
  "$PY" - "$HERE/data" <<'EOF' || return 3
import sys, shutil
from importlib import metadata
from pathlib import Path
proj, data = Path(__import__("os").environ["PROJ"]), Path(sys.argv[1])
for dist, rel, name in (("scikit-learn", "sklearn/datasets/images/china.jpg", "china.jpg"),
                        ("scikit-image", "skimage/data/chelsea.png", "chelsea.png")):
    try:
        found = Path(metadata.distribution(dist).locate_file(rel))
        ok = found.is_file()
    except metadata.PackageNotFoundError:
        found, ok = None, False
    if not ok:
        info = proj / f"{dist.replace('-', '_')}-0.0.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0\n")
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(data / name, proj / rel)
        print(f"photo {name}: {found} missing, stand-in {proj / rel}")
    else:
        print(f"photo {name}: {found}")
import importlib
for m in ("fastapi", "starlette", "uvicorn", "httptools", "uvloop", "pydantic", "pydantic_core", "pydantic_settings",
          "simplejpeg", "orjson", "multipart", "ai_edge_litert", "numpy", "PIL", "prometheus_client", "typing_extensions",
          "gunicorn", "uvicorn_worker"):
    mod = importlib.import_module(m)
    print(f"  {m} {getattr(mod, '__version__', '')} {Path(mod.__file__).parent}")
import app.main  # noqa: F401  the whole app imports
print("app:", Path(app.main.__file__).parent)
EOF

  # One bench invocation per device count (one process), then per group (P processes on one port, N devices
  # in all), each with its own JSON (merged into $OUT/cap.json at the end), so a slow machine loses the last
  # ones, not the whole run: each starts only if its estimate fits the time left before RUN_BUDGET_S, the
  # groups' and the replicas' share kept aside.
  local parts=/tmp/devrun_parts nlev ngl ngroups nrep nconf est gest greserve reserve left n p
  rm -rf "$parts" && mkdir -p "$parts"
  nlev=$(echo "$LEVELS" | tr ',' '\n' | grep -c .)
  ngl=$(echo "$PROCESS_LEVELS" | tr ',' '\n' | grep -c .)
  ngroups=$(echo "$PROCESSES" | tr ',' '\n' | grep -c .)
  nrep=$(echo "$REPLICA_LEVELS" | tr ',' '\n' | grep -c .)
  nconf=$(echo "$REPLICAS" | tr ',' '\n' | grep -c .)
  est=$(awk -v d="$DURATION" -v l="$nlev" 'BEGIN { printf "%d", (d + 1) + 2 * (1 + l * (d + 0.2)) + 5 }')
  gest=$(awk -v d="$DURATION" -v l="$ngl" 'BEGIN { printf "%d", (d + 1) + 2 * (1 + l * (d + 0.2)) + 10 }')
  greserve=$((ngroups * gest))
  reserve=$(awk -v d="$DURATION" -v l="$nrep" -v c="$nconf" 'BEGIN { printf "%d", c * (4 + 2 * (1 + l * (d + 0.2))) + 5 }')
  echo "== estimates: ${est} s per device count, ${gest} s per group, ${reserve} s for the replicas; budget ${RUN_BUDGET_S} s"
  for n in ${DEVICES//,/ }; do
    left=$((RUN_BUDGET_S - (SECONDS - t0) - greserve - reserve))
    if [ "$left" -lt "$est" ]; then echo "== SKIPPED $n devices: ${left} s left, ~${est} s needed"; continue; fi
    echo "== device_capacity, $n device(s), one process, at +$((SECONDS - t0)) s"
    (cd "$PROJ" && timeout -k 5 "$left" "$PY" bench/device_capacity.py --device-ms "$DEVICE_MS" \
        --devices "$n" --inputs 224 --concurrency "$LEVELS" --duration "$DURATION" --no-stages \
        --json "$parts/cap_1x$n.json" --chart '')
    echo "== device_capacity $n device(s): exit $? at +$((SECONDS - t0)) s"
  done
  for group in ${PROCESSES//,/ }; do
    p="${group%x*}" n="${group#*x}"
    left=$((RUN_BUDGET_S - (SECONDS - t0) - reserve))
    if [ "$left" -lt "$gest" ]; then echo "== SKIPPED $p processes x $n devices: ${left} s left, ~${gest} s needed"; continue; fi
    echo "== device_capacity --processes $p --devices $n (one port), at +$((SECONDS - t0)) s"
    (cd "$PROJ" && timeout -k 5 "$left" "$PY" bench/device_capacity.py --device-ms "$DEVICE_MS" \
        --processes "$p" --devices "$n" --inputs 224 --concurrency "$PROCESS_LEVELS" --duration "$DURATION" \
        --no-stages --json "$parts/cap_${p}x$n.json" --chart '')
    echo "== device_capacity --processes $p --devices $n: exit $? at +$((SECONDS - t0)) s"
  done
  "$PY" "$HERE/summary.py" --merge "$OUT/cap.json" "$parts"/cap_*.json || cp "$parts"/cap_*.json "$OUT"/

  if [ -n "$REPLICAS" ]; then
    left=$((RUN_BUDGET_S - (SECONDS - t0)))
    if [ "$left" -lt $((reserve / 2)) ]; then
      echo "== SKIPPED replicas: ${left} s left"
    else
      echo "== replicas at +$((SECONDS - t0)) s"
      (cd "$PROJ" && timeout -k 5 "$left" "$PY" "$HERE/replicas.py" --device-ms "$DEVICE_MS" \
          --configs "$REPLICAS" --concurrency "$REPLICA_LEVELS" --duration "$DURATION" --json "$OUT/replicas.json")
      echo "== replicas exit $? at +$((SECONDS - t0)) s"
    fi
  fi
  "$PY" "$HERE/summary.py" "$OUT/cap.json" "$OUT/replicas.json"
  echo "== done in $((SECONDS - t0)) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
}

main 2>&1 | tee "$OUT/log.txt"
