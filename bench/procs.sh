# Sourced by the bench scripts that start several servers: PIDS holds the
# processes they start, stopped when the script exits, and wait_ready waits
# for one to serve.

PIDS=()

# stop ends every process in PIDS: SIGTERM, up to 30 s for each to exit,
# then SIGKILL.
stop() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 1 120); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$p" 2>/dev/null || true
  done
  PIDS=()
}
trap stop EXIT

# wait_ready URL: waits up to 30 s for URL to answer with success.
wait_ready() {
  for _ in $(seq 1 300); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done
  echo "not ready: $1" >&2
  return 1
}
