#!/usr/bin/env bash
# Redraws the charts docs/ shows from bench output, on this machine, now: run it on a QUIET machine (the
# charts' titles carry the load average; a busy machine draws a busy machine's figures: the chart of
# docs/device-capacity.md once showed 20-60% busy at load average 8 beside a text that said 93%).
#
#   bench/redraw_charts.sh            # docs/img/device_capacity.{json,png}, docs/img/curl_bench_stages.png
#   bench/redraw_charts.sh --check    # the same commands, briefly, into build/bench/redraw/ (docs/ untouched)
#
# The two benches, as docs/device-capacity.md and docs/benchmarks.md describe them:
#   bench/device_capacity.py --processes 1,2 --rounds 3 --json docs/img/device_capacity.json
#       D = 2.5 and 5 ms; 1 and 2 devices in one process, and 2 devices as 2 processes on one port;
#       224x224 JPEG, 640x427 JPEG and the raw /v2 tensor at c = 1, 2, 4, 8, 16 (the chart beside the JSON)
#   bench/curl_bench.sh --start --backends cpu,emulated -n 100 --markdown --chart docs/img/curl_bench_stages.png
# It says the load average before each, and refuses to start above MAX_LOAD (1.5; MAX_LOAD=99 to force).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
python="${PYTHON:-python3}"
[ -x "$root/.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && python="$root/.venv/bin/python"
max_load="${MAX_LOAD:-1.5}"
out="$root/docs/img"
capacity_args=(--processes 1,2 --rounds 3)
curl_args=(-n 100)
if [ "${1:-}" = "--check" ]; then
  out="$root/build/bench/redraw"
  capacity_args=(--processes 1,2 --rounds 1 --device-ms 2.5 --concurrency 1,8 --duration 1 --no-stages)
  curl_args=(-n 5)
  max_load="${MAX_LOAD:-99}"
elif [ -n "${1:-}" ]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2
fi
mkdir -p "$out"

quiet_enough() {
  local load
  load="$(cut -d' ' -f1 /proc/loadavg)"
  echo "== load average $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores) before $1"
  if awk -v l="$load" -v m="$max_load" 'BEGIN { exit !(l > m) }'; then
    echo "the machine is busy (1-minute load $load > MAX_LOAD $max_load): not drawing $1 now" >&2
    return 1
  fi
}

start=$SECONDS
cd "$root"
quiet_enough "device_capacity" || exit 3
"$python" bench/device_capacity.py "${capacity_args[@]}" --json "$out/device_capacity.json"
quiet_enough "curl_bench" || exit 3
bench/curl_bench.sh --start --backends cpu,emulated "${curl_args[@]}" --markdown --chart "$out/curl_bench_stages.png"
echo "== redrawn in $((SECONDS - start)) s: $out/device_capacity.png (its figures in device_capacity.json), $out/curl_bench_stages.png"
