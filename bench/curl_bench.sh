#!/usr/bin/env bash
# CPU vs Edge TPU vs emulator, as a client sees it: curl against a running service.
#
# For each backend: reload the model (so the next request is cold), send one cold request and N
# warm ones with a real photo, then print one table from the service's own timing fields.
#
# Example usage:
#   bench/curl_bench.sh --start --backends cpu,emulated --markdown   # starts a local service itself
#   EDGETPU_SERVE_BACKENDS=cpu,emulated make serve &                 # or against one already running
#   bench/curl_bench.sh --backends cpu,emulated -n 50
#   bench/curl_bench.sh --url http://coral.local:8000 --backends cpu,edgetpu --markdown
set -euo pipefail

url="http://127.0.0.1:8000"
model="efficientnet_lite0"
backends="cpu"
requests=50
photo=""
start=""
format_args=()

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; echo "options: --url URL | --start, --model NAME --backends a,b -n N --photo FILE --markdown"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --url) url="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --backends) backends="$2"; shift 2 ;;
    -n|--requests) requests="$2"; shift 2 ;;
    --photo) photo="$2"; shift 2 ;;
    --markdown) format_args+=(--markdown); shift ;;
    --start) start=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
[ -x "$here/../.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && python="$here/../.venv/bin/python"
if [ -z "$photo" ]; then
  # scikit-learn's china.jpg (640x427), found without importing scikit-learn
  photo="$("$python" -c 'from importlib import metadata; print(metadata.distribution("scikit-learn").locate_file("sklearn/datasets/images/china.jpg"))' 2>/dev/null || true)"
fi
if [ ! -f "$photo" ]; then
  echo "no photo: pass --photo FILE (a JPEG or PNG)" >&2; exit 2
fi
case "$photo" in *.png|*.PNG) content_type="image/png" ;; *) content_type="image/jpeg" ;; esac

results="$(mktemp)"
service_log="$(mktemp)"
service_pid=""
stop_service() {  # SIGTERM, then SIGKILL after STOP_TIMEOUT_S: the service drains, but not forever
  [ -n "$service_pid" ] || return 0
  kill "$service_pid" 2> /dev/null || true
  for _ in $(seq $((STOP_TIMEOUT_S * 10))); do kill -0 "$service_pid" 2> /dev/null || break; sleep 0.1; done
  kill -9 "$service_pid" 2> /dev/null || true
  wait "$service_pid" 2> /dev/null || true
  service_pid=""
}
STOP_TIMEOUT_S=15
described="$(mktemp)"  # the model's /v1/models answer: its edgetpu_estimate becomes an estimated row
cleanup() { stop_service; rm -f "$results" "$service_log" "$described"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -n "$start" ]; then
  # this checkout's service on a free local port, loaded on exactly the backends measured
  port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  url="http://127.0.0.1:$port"
  # `exec`: the subshell becomes the service, so $! is the service's own PID (the one to stop)
  (cd "$here/.." && exec env $(env | grep -o '^EDGETPU_SERVE_[A-Z_]*' | sed 's/^/-u /') \
    EDGETPU_SERVE_HOST=127.0.0.1 EDGETPU_SERVE_PORT="$port" EDGETPU_SERVE_BACKENDS="$backends" \
    EDGETPU_SERVE_LOG_LEVEL=warning "$python" -m app > "$service_log" 2>&1 < /dev/null) &
  service_pid=$!
  echo "starting the service on $url with backends $backends..." >&2
  for _ in $(seq 1200); do
    curl -sf "$url/readyz" > /dev/null && break
    if ! kill -0 "$service_pid" 2> /dev/null; then echo "the service exited:" >&2; cat "$service_log" >&2; exit 1; fi
    sleep 0.1
  done
  curl -sf "$url/readyz" > /dev/null || { echo "the service did not become ready:" >&2; cat "$service_log" >&2; exit 1; }
fi

if ! curl -sf "$url/healthz" > /dev/null; then
  echo "no service answering at $url (start one: make serve, or pass --url)" >&2; exit 1
fi

classify() {  # backend -> one line: backend <TAB> client seconds <TAB> response JSON
  local out
  out="$(curl -s --data-binary "@$photo" -H "Content-Type: $content_type" \
    -w '\t%{time_total}\t%{http_code}' "$url/v1/models/$model/classify?top_k=1&backend=$1")"
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
  "${format_args[@]}" < "$results"
stop_service
