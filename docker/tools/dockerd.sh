#!/usr/bin/env bash
# Start or stop a private Docker engine, the way it runs on a machine like this one (a VM with
# no bridge networking, no iptables): containers then use --network=host or --network=none.
# Its own data root, socket, exec root and pid file, so it stands beside any other engine.
#
# Example usage:
#   docker/tools/dockerd.sh start /var/cache/edgetpu-serve/dockerd   # prints DOCKER_HOST=unix://...
#   docker/tools/dockerd.sh stop  /var/cache/edgetpu-serve/dockerd
set -euo pipefail

action="${1:?start or stop}"
root="${2:?a directory for the engine data}"
state="$root/run"
socket="$state/docker.sock"
pidfile="$state/dockerd.pid"
start_timeout_s="${DOCKERD_START_TIMEOUT_S:-60}"
# docker.io installs /usr/sbin/dockerd, Docker CE /usr/bin/dockerd.
dockerd="$(command -v dockerd || echo /usr/sbin/dockerd)"
docker="${DOCKER:-/usr/bin/docker}"

case "$action" in
  start)
    mkdir -p "$root/data" "$state/exec"
    if [ -S "$socket" ] && DOCKER_HOST="unix://$socket" "$docker" version > /dev/null 2>&1; then
      echo "DOCKER_HOST=unix://$socket"
      exit 0
    fi
    # setsid: the engine outlives this script; `stop` ends it by its pid file.
    setsid "$dockerd" --iptables=false --ip6tables=false --bridge=none --storage-driver=overlay2 \
      --data-root="$root/data" --exec-root="$state/exec" --pidfile="$pidfile" \
      -H "unix://$socket" > "$root/dockerd.log" 2>&1 < /dev/null &
    for _ in $(seq "$start_timeout_s"); do
      DOCKER_HOST="unix://$socket" "$docker" version > /dev/null 2>&1 && { echo "DOCKER_HOST=unix://$socket"; exit 0; }
      sleep 1
    done
    echo "dockerd.sh: the engine did not answer within ${start_timeout_s} s; its log:" >&2
    tail -20 "$root/dockerd.log" >&2
    exit 1
    ;;
  stop)
    [ -f "$pidfile" ] || exit 0
    pid="$(cat "$pidfile")"
    kill "$pid" 2> /dev/null || true
    for _ in $(seq 30); do
      if ! kill -0 "$pid" 2> /dev/null; then
        # the engine leaves its default network namespace mounted: nothing else holds it now
        umount "$state/exec/netns/default" 2> /dev/null || true
        exit 0
      fi
      sleep 1
    done
    echo "dockerd.sh: dockerd $pid still running after 30 s" >&2
    exit 1
    ;;
  *) echo "dockerd.sh: start or stop, not $action" >&2; exit 2 ;;
esac
