#!/usr/bin/env bash
# CPU vs Edge TPU vs emulator, as a client sees it: curl against a running service.
#
# For each backend: reload the model (so the next request is cold), send one cold request and N
# warm ones with a real photo, then print one table from the service's own timing fields. A
# detection model (its task, as GET /v1/models/NAME says) is asked through /v1/models/NAME/detect
# (min_score 0.5), by default with a 640x480 photo of two people (OpenCV's basketball1.png).
#
# Example usage:
#   bench/curl_bench.sh --start --backends cpu,emulated --markdown   # starts a local service itself
#   EDGETPU_SERVE_BACKENDS=cpu,emulated make serve &                 # or against one already running
#   bench/curl_bench.sh --backends cpu,emulated -n 50
#   bench/curl_bench.sh --url http://coral.local:8000 --backends cpu,edgetpu --markdown
#   bench/curl_bench.sh --start --backends cpu,emulated --chart docs/img/curl_bench_stages.png
#   bench/curl_bench.sh --start --backends cpu,emulated --model ssdlite_mobilenet_v2_person --markdown
# Beside the table, a PNG chart of each backend's warm latency by stage (--chart PATH, default
# build/bench/curl_bench.png; --chart '' for none; needs matplotlib, the dev extra).
set -euo pipefail

url="http://127.0.0.1:8000"
model="efficientnet_lite0"
backends="cpu"
requests=50
photo=""
start=""
format_args=()
chart_args=()
original_args=("$@")

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; echo "options: --url URL | --start, --model NAME --backends a,b -n N --photo FILE --markdown --chart PATH"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --url) url="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --backends) backends="$2"; shift 2 ;;
    -n|--requests) requests="$2"; shift 2 ;;
    --photo) photo="$2"; shift 2 ;;
    --markdown) format_args+=(--markdown); shift ;;
    --chart) chart_args=(--chart "$2"); shift 2 ;;
    --start) start=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
[ -x "$here/../.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && python="$here/../.venv/bin/python"

if [ -n "$start" ]; then
  # this checkout's service on a free local port, loaded on exactly the backends measured, through the
  # benchmarks' one launcher (bench/service.py): it runs this script again against {url}, then stops
  # the service, also when it is itself told to stop. `exec`: the launcher takes this PID, so a
  # SIGTERM sent to the script reaches it.
  rerun=()
  skip=""
  for arg in "${original_args[@]}"; do
    if [ -n "$skip" ]; then skip=""; continue; fi
    case "$arg" in --start) ;; --url) skip=1 ;; *) rerun+=("$arg") ;; esac
  done
  exec "$python" "$here/service.py" --only-these --set EDGETPU_SERVE_BACKENDS="$backends" \
    --set EDGETPU_SERVE_LOG_LEVEL=warning -- bash "$here/curl_bench.sh" --url '{url}' "${rerun[@]}"
fi

results="$(mktemp)"
described="$(mktemp)"  # the model's /v1/models answer: its edgetpu_estimate becomes an estimated row
cleanup() { rm -f "$results" "$described"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! curl -sf "$url/healthz" > /dev/null; then
  echo "no service answering at $url (start one: make serve, or pass --url)" >&2; exit 1
fi

# what the model answers: a classifier's top class, or a detector's objects
task="$(curl -sf "$url/v1/models/$model" \
  | "$python" -c 'import json, sys; print(json.load(sys.stdin).get("task", ""))' 2>/dev/null || true)"
if [ "$task" = "detection" ]; then route="detect?min_score=0.5"; else route="classify?top_k=1"; fi
if [ -z "$photo" ] && [ "$task" = "detection" ]; then
  # a camera frame of two people: OpenCV's basketball1.png (640x480), as the detector's recipe finds it
  photo="$("$python" -c 'from converter.photos import people_photos; print(next(p for p in people_photos() if p.name == "basketball1.png"))' 2>/dev/null || true)"
elif [ -z "$photo" ]; then
  # scikit-learn's china.jpg (640x427), found without importing scikit-learn
  photo="$("$python" -c 'from importlib import metadata; print(metadata.distribution("scikit-learn").locate_file("sklearn/datasets/images/china.jpg"))' 2>/dev/null || true)"
fi
if [ ! -f "$photo" ]; then
  echo "no photo: pass --photo FILE (a JPEG or PNG)" >&2; exit 2
fi
case "$photo" in *.png|*.PNG) content_type="image/png" ;; *) content_type="image/jpeg" ;; esac

classify() {  # backend -> one line: backend <TAB> client seconds <TAB> response JSON
  local out
  out="$(curl -s --data-binary "@$photo" -H "Content-Type: $content_type" \
    -w '\t%{time_total}\t%{http_code}' "$url/v1/models/$model/$route&backend=$1")"
  printf '%s\t%s\t%s\t%s\n' "$1" "$(cut -f2 <<< "$out")" "$(cut -f3 <<< "$out")" "$(cut -f1 <<< "$out")" >> "$results"
}

IFS=',' read -r -a backend_list <<< "$backends"
for backend in "${backend_list[@]}"; do
  code="$(curl -s -o /dev/null -w '%{http_code}' -X POST "$url/v1/models/$model/reload")"
  if [ "$code" != "200" ]; then echo "reload of $model failed with HTTP $code" >&2; exit 1; fi
  echo "$backend: 1 cold + $requests warm requests..." >&2
  for _ in $(seq 0 "$requests"); do classify "$backend"; done
done

curl -s "$url/v1/models/$model" > "$described" || true
"$python" "$here/curl_table.py" --photo "$(basename "$photo")" --url "$url" --model-json "$described" \
  "${format_args[@]}" "${chart_args[@]}" < "$results"
