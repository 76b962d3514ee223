#!/usr/bin/env bash
# Starts (or stops) a local Docker engine for the tests and the image scripts: the one place that
# knows how. Used by .ci/run, by scripts/ that build images, and by developers.
#   scripts/dockerd.sh start   install nothing; start dockerd if no engine answers; wait for it
#   scripts/dockerd.sh stop    stop the engine this script started (no-op otherwise)
#   scripts/dockerd.sh status  exit 0 when an engine answers on the socket
# The engine never pulls in our tests: images come from `docker import` of root filesystems.
set -euo pipefail
sock=${DOCKER_SOCKET:-/var/run/docker.sock}
state=${KEYGATE_DOCKERD_STATE:-/tmp/keygate-dockerd}
mkdir -p "$state"

answers() { curl -fsS --max-time 2 --unix-socket "$sock" http://localhost/_ping >/dev/null 2>&1; }

case "${1:-}" in
  status) answers ;;
  start)
    if answers; then echo "dockerd: an engine already answers on $sock"; exit 0; fi
    command -v dockerd >/dev/null 2>&1 || { echo "dockerd: not installed (apt-get install docker.io)" >&2; exit 1; }
    [ "$(id -u)" = 0 ] || { echo "dockerd: must start as root" >&2; exit 1; }
    nohup dockerd --host "unix://$sock" >"$state/dockerd.log" 2>&1 &
    echo $! >"$state/dockerd.pid"
    for _ in $(seq 1 60); do
      if answers; then echo "dockerd: started (pid $(cat "$state/dockerd.pid"))"; exit 0; fi
      kill -0 "$(cat "$state/dockerd.pid")" 2>/dev/null || break
      sleep 0.5
    done
    echo "dockerd: did not come up; its log:" >&2
    tail -n 30 "$state/dockerd.log" >&2 || true
    exit 1
    ;;
  stop)
    [ -f "$state/dockerd.pid" ] || exit 0
    pid=$(cat "$state/dockerd.pid"); rm -f "$state/dockerd.pid"
    kill "$pid" 2>/dev/null || exit 0
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || { echo "dockerd: stopped"; exit 0; }; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
    ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
