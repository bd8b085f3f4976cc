#!/usr/bin/env bash
# CPU profiles of three Gatehouse nodes clustered on loopback under kbench's
# load (as bench/cluster.sh loads them: stock clients spread over the nodes,
# --sync always), taken on the three at once, and where their CPU goes.
#
#   bench/cluster-pprof.sh                   # 8,000 executions at C=32
#   OUT=/tmp/prof EXECUTIONS=12000 bench/cluster-pprof.sh
#
# Each node serves Go's profiles on a loopback --pprof-addr; DELAY seconds
# into the run, 10 s of /debug/pprof/profile is taken from each. It prints
# kbench's line, each node's CPU over the run (from /proc) with the store's
# group and write counters, and the profiles' samples by class
# (bench/pprof-classes.py). The profiles stay in OUT (n1.prof, n2.prof,
# n3.prof) for `go tool pprof`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d)}
OUT=${OUT:-$WORK/profiles}
EXECUTIONS=${EXECUTIONS:-8000}
DELAY=${DELAY:-5}
BASE=${BASE:-28380}
CLUSTER_FLAGS=${CLUSTER_FLAGS:-}

mkdir -p "$OUT"
(cd "$ROOT" && go build -o "$WORK/gatehouse" ./cmd/gatehouse && go build -o "$WORK/kbench" ./bench/kbench)

# shellcheck source=bench/procs.sh
. "$ROOT/bench/procs.sh"

ticks() { # PID: the process's CPU so far, in clock ticks
  local f
  read -r -a f <"/proc/$1/stat"
  echo $((f[13] + f[14]))
}

peers="127.0.0.1:$((BASE + 11)),127.0.0.1:$((BASE + 12)),127.0.0.1:$((BASE + 13))"
urls=""
for i in 1 2 3; do
  rm -rf "$WORK/n$i"
  # shellcheck disable=SC2086
  "$WORK/gatehouse" serve --addr "127.0.0.1:$((BASE + i))" --data "$WORK/n$i" --cluster-name bench --node-name "n$i" \
    --cluster-listen "127.0.0.1:$((BASE + 10 + i))" --cluster-peers "$peers" \
    --pprof-addr "127.0.0.1:$((BASE + 20 + i))" $CLUSTER_FLAGS >"$OUT/n$i.log" 2>&1 &
  PIDS+=($!)
  urls="$urls${urls:+,}http://127.0.0.1:$((BASE + i))"
done
for i in 1 2 3; do
  wait_ready "http://127.0.0.1:$((BASE + i))/v0/ready"
done

before=()
for p in "${PIDS[@]}"; do before+=("$(ticks "$p")"); done
"$WORK/kbench" -url "$urls" -agents 4 -runners 4 -executions "$EXECUTIONS" -concurrency 32 -remote -tools 1 \
  -warmup 100 -timeout 300s >"$OUT/kbench.json" 2>"$OUT/kbench.log" &
kb=$!
sleep "$DELAY"
curls=()
for i in 1 2 3; do
  curl -s -o "$OUT/n$i.prof" "http://127.0.0.1:$((BASE + 20 + i))/debug/pprof/profile?seconds=10" &
  curls+=($!)
done
wait "${curls[@]}"
wait "$kb"

cat "$OUT/kbench.json"
hz=$(getconf CLK_TCK)
for i in 1 2 3; do
  used=$(($(ticks "${PIDS[$((i - 1))]}") - before[i - 1]))
  # /metrics is the leader's on every node: a follower relays it.
  echo "n$i: $(echo "scale=2; $used / $hz" | bc) CPU s over the run; leader's store:" \
    "$(curl -s "http://127.0.0.1:$((BASE + i))/metrics" | grep -E '^gatehouse_store_(commits|writes|syncs)_total' | tr '\n' ' ')"
done
python3 "$ROOT/bench/pprof-classes.py" "$OUT/n1.prof" "$OUT/n2.prof" "$OUT/n3.prof"
echo "profiles and logs: $OUT" >&2
