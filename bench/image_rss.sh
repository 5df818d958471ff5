#!/usr/bin/env bash
# Resident memory of the service in an image's container after warm-up with the default models and
# 30 classify requests per model (china.jpg): VmRSS of the service (pid 1) and the container's
# memory as Docker counts it (cgroup: what --memory limits). The container runs on a loopback port
# with --network=host and is removed after. Extra arguments go to `docker run`.
#
# Example usage:
#   bash bench/image_rss.sh edgetpu-serve:latest
#   bash bench/image_rss.sh edgetpu-serve:latest -e EDGETPU_SERVE_WORKERS=1
#   bash bench/image_rss.sh edgetpu-serve:devboard -e QEMU_CPU=cortex-a53 \
#       -v $PWD/docker/tools/qemu-cortex-a53/cpuinfo:/proc/cpuinfo:ro \
#       -v $PWD/docker/tools/qemu-cortex-a53/sys/devices/system/cpu:/sys/devices/system/cpu:ro
set -euo pipefail

image="${1:?an image, e.g. edgetpu-serve:latest}"
shift
docker="${DOCKER:-/usr/bin/docker}"
root="$(cd "$(dirname "$0")/.." && pwd)"
photo="${PHOTO:-$(PYTHONPATH="$root" "${PYTHON:-python3}" -c 'from converter.photos import photo; print(photo("scikit-learn", "sklearn/datasets/images/china.jpg"))')}"
port="$("${PYTHON:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
ready_timeout_s="${READY_TIMEOUT_S:-600}"
name="edgetpu-serve-rss-$port"

"$docker" run -d --name "$name" --network=host "$@" -e EDGETPU_SERVE_HOST=127.0.0.1 \
  -e EDGETPU_SERVE_PORT="$port" "$image" > /dev/null
trap '"$docker" rm -f "$name" > /dev/null' EXIT
for waited in $(seq "$ready_timeout_s"); do
  curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$port/readyz" | grep -q 200 && break
  sleep 1
done
for model in efficientnet_lite0 mobilenet_v2 fashion_mnist; do
  for _ in $(seq 30); do
    curl -s -o /dev/null -F "image=@$photo" "127.0.0.1:$port/v1/classify?model=$model"
  done
done
echo "$image: ready in ~${waited} s; $("$docker" exec "$name" grep VmRSS /proc/1/status | tr -s ' \t' ' '); container $("$docker" stats --no-stream --format '{{.MemUsage}}' "$name" | cut -d/ -f1)"
