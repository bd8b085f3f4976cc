#!/usr/bin/env bash
# Gatehouse against the reference kernel, as stock seed 004 clients load
# them: kbench (bench/kbench) out of process, SSE agents and runners that
# never ack, a stream per execution. Each repetition starts a fresh server
# (Gatehouse on a fresh data folder, on its durable default --sync always),
# and the two servers alternate, so that both see the same machine.
#
#   REBUNO=/path/to/rebuno bench/compare.sh            # default cases, 3 pairs each
#   REPS=5 CASES="remote_k1_c32" bench/compare.sh
#   CASES=remote_k1_c1_steady bench/compare.sh         # C=1 past the first seconds
#   REBUNO= bench/compare.sh                           # Gatehouse alone
#   CASES=replay bench/compare.sh                      # catch-up rate (bench/replay)
#
# Build the reference as bench/kbench/REFERENCE.md says. Every
# server listens on 127.0.0.1 only; every run is bounded by kbench's
# -timeout. Raw JSON lines go to $OUT/<server>_<case>.jsonl; the table of
# medians and ratios is printed at the end (bench/ratios.py).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d)}
OUT=${OUT:-$WORK/results}
REPS=${REPS:-3}
REBUNO=${REBUNO-}
GH_PORT=${GH_PORT:-28180}
REF_PORT=${REF_PORT:-28181}
GH_FLAGS=${GH_FLAGS:-}

# name | kbench arguments (common ones are added below)
CASE_LIST=(
  "remote_k1_c32|-agents 4 -runners 4 -executions 3000 -concurrency 32 -remote -tools 1"
  "local_k3_c32|-agents 4 -runners 4 -executions 2000 -concurrency 32 -tools 3"
  "remote_k1_c1|-agents 4 -runners 4 -executions 500 -concurrency 1 -remote -tools 1"
  # one at a time for longer, after a second and a half of warm-up: the
  # steady state of a single agent, which serve reaches once its processor
  # governor has seen a second of calm (the case above ends about then)
  "remote_k1_c1_steady|-agents 4 -runners 4 -executions 3000 -warmup 1000 -concurrency 1 -remote -tools 1"
  # not kbench: bench/replay, a resuming client's catch-up from sequence 0
  "replay|-executions 20 -readers 1 -rounds 5"
)
CASES=${CASES:-remote_k1_c32 remote_k1_c1}

mkdir -p "$OUT"
(cd "$ROOT" && go build -o "$WORK/gatehouse" ./cmd/gatehouse && go build -o "$WORK/kbench" ./bench/kbench && go build -o "$WORK/replay" ./bench/replay)

PID=""
stop() {
  [ -n "$PID" ] || return 0
  kill -TERM "$PID" 2>/dev/null || true
  for _ in $(seq 1 120); do kill -0 "$PID" 2>/dev/null || { PID=""; return 0; }; sleep 0.25; done
  kill -KILL "$PID" 2>/dev/null || true
  PID=""
}
trap stop EXIT

wait_ready() { # url
  for _ in $(seq 1 100); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done
  echo "not ready: $1" >&2
  return 1
}

start() { # server
  case $1 in
  gatehouse)
    rm -rf "$WORK/data"
    # shellcheck disable=SC2086
    "$WORK/gatehouse" serve --addr "127.0.0.1:$GH_PORT" --data "$WORK/data" $GH_FLAGS >"$WORK/gatehouse.log" 2>&1 &
    PID=$!
    URL=http://127.0.0.1:$GH_PORT
    wait_ready "$URL/v0/ready"
    ;;
  reference)
    "$REBUNO" dev --port "$REF_PORT" --bind 127.0.0.1 >"$WORK/reference.log" 2>&1 &
    PID=$!
    URL=http://127.0.0.1:$REF_PORT
    wait_ready "$URL/v0/health"
    ;;
  esac
}

servers=(gatehouse)
[ -n "$REBUNO" ] && servers=(gatehouse reference)

for name in $CASES; do
  args=""
  for c in "${CASE_LIST[@]}"; do [ "${c%%|*}" = "$name" ] && args=${c#*|}; done
  [ -n "$args" ] || { echo "unknown case $name" >&2; exit 2; }
  for rep in $(seq 1 "$REPS"); do
    # Alternate which server goes first, so that neither always meets a
    # warmer (or more tired) machine.
    order=("${servers[@]}")
    if [ $((rep % 2)) = 0 ] && [ ${#servers[@]} = 2 ]; then order=(reference gatehouse); fi
    for s in "${order[@]}"; do
      start "$s"
      tool=("$WORK/kbench" -warmup 100)
      [ "$name" = replay ] && tool=("$WORK/replay")
      # shellcheck disable=SC2086
      "${tool[@]}" -url "$URL" $args -timeout 300s -server-pid "$PID" \
        >>"$OUT/${s}_${name}.jsonl" 2>>"$WORK/kbench.log" || echo "$s $name rep $rep: ${tool[0]##*/} failed (see $WORK/kbench.log)" >&2
      stop
    done
  done
done
python3 "$ROOT/bench/ratios.py" "$OUT"
echo "raw results: $OUT" >&2
