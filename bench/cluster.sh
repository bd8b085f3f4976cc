#!/usr/bin/env bash
# Three Gatehouse nodes clustered on loopback against one node, as stock
# seed 004 clients load them: kbench (bench/kbench) out of process, SSE
# agents and runners that never ack, a stream per execution, spread over
# the three nodes' URLs for the cluster. Each repetition starts fresh
# servers on fresh data folders, on the durable default (--sync always),
# and the two set-ups alternate. The cluster's server CPU is the sum over
# its three processes.
#
#   bench/cluster.sh                         # 3 pairs of remote_k1_c32
#   REPS=5 CLUSTER_FLAGS="--cluster-election-timeout 1s" bench/cluster.sh
#   CLIENTS=leader bench/cluster.sh          # kbench on the leader's URL only
#
# CLIENTS=leader takes the relays out of the figure: no connection lands
# on a follower, so what is left is the leader's work and the journal's
# replication (the followers' raft, their stores' apply).
#
# Every server listens on 127.0.0.1 only; every run is bounded by kbench's
# -timeout. The table of medians and ratios is printed at the end
# (bench/ratios.py, cluster against single).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d)}
OUT=${OUT:-$WORK/results}
REPS=${REPS:-3}
CLUSTER_FLAGS=${CLUSTER_FLAGS:-}
ARGS=${ARGS:-"-agents 4 -runners 4 -executions 3000 -concurrency 32 -remote -tools 1"}
CASE=${CASE:-remote_k1_c32}
CLIENTS=${CLIENTS:-all}
BASE=${BASE:-28280}

mkdir -p "$OUT"
(cd "$ROOT" && go build -o "$WORK/gatehouse" ./cmd/gatehouse && go build -o "$WORK/kbench" ./bench/kbench)

# shellcheck source=bench/procs.sh
. "$ROOT/bench/procs.sh"

# cpu_s PID...: the processes' CPU seconds so far.
cpu_s() {
  local hz total=0
  hz=$(getconf CLK_TCK)
  for p in "$@"; do
    read -r -a f <"/proc/$p/stat"
    total=$((total + f[13] + f[14]))
  done
  echo "scale=3; $total / $hz" | bc
}

# leader_index: which of the three nodes (1-3) holds the lease, once one
# does.
leader_index() {
  local l=""
  for _ in $(seq 1 100); do
    l=$(curl -sf "http://127.0.0.1:$((BASE + 1))/v0/cluster" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("leader",""))' || true)
    case $l in n[123]) echo "${l#n}"; return 0 ;; esac
    sleep 0.1
  done
  echo "no leader" >&2
  return 1
}

run_single() {
  rm -rf "$WORK/single"
  "$WORK/gatehouse" serve --addr "127.0.0.1:$BASE" --data "$WORK/single" >"$WORK/single.log" 2>&1 &
  PIDS=($!)
  wait_ready "http://127.0.0.1:$BASE/v0/ready"
  # shellcheck disable=SC2086
  "$WORK/kbench" -url "http://127.0.0.1:$BASE" $ARGS -warmup 100 -timeout 300s -server-pid "${PIDS[0]}" \
    >>"$OUT/single_$CASE.jsonl" 2>>"$WORK/kbench.log" || echo "single rep $1: kbench failed" >&2
  stop
}

run_cluster() {
  local peers urls="" i
  peers="127.0.0.1:$((BASE + 11)),127.0.0.1:$((BASE + 12)),127.0.0.1:$((BASE + 13))"
  for i in 1 2 3; do
    rm -rf "$WORK/n$i"
    # shellcheck disable=SC2086
    "$WORK/gatehouse" serve --addr "127.0.0.1:$((BASE + i))" --data "$WORK/n$i" --cluster-name bench --node-name "n$i" \
      --cluster-listen "127.0.0.1:$((BASE + 10 + i))" --cluster-peers "$peers" $CLUSTER_FLAGS >"$WORK/n$i.log" 2>&1 &
    PIDS+=($!)
    urls="$urls${urls:+,}http://127.0.0.1:$((BASE + i))"
  done
  for i in 1 2 3; do wait_ready "http://127.0.0.1:$((BASE + i))/v0/ready"; done
  local before after line lead
  if [ "$CLIENTS" = leader ]; then
    lead=$(leader_index) || { echo "cluster rep $1: no leader" >&2; stop; return; }
    urls="http://127.0.0.1:$((BASE + lead))"
  fi
  before=$(cpu_s "${PIDS[@]}")
  # shellcheck disable=SC2086
  line=$("$WORK/kbench" -url "$urls" $ARGS -warmup 100 -timeout 300s 2>>"$WORK/kbench.log") || echo "cluster rep $1: kbench failed" >&2
  after=$(cpu_s "${PIDS[@]}")
  # The warm-up's CPU is in the sum too: a few percent of the run.
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["server_cpu_s"]=float(sys.argv[2]); print(json.dumps(r))' \
    "$line" "$(echo "$after - $before" | bc)" >>"$OUT/cluster_$CASE.jsonl"
  stop
}

for rep in $(seq 1 "$REPS"); do
  if [ $((rep % 2)) = 1 ]; then run_cluster "$rep"; run_single "$rep"; else run_single "$rep"; run_cluster "$rep"; fi
done
PAIR=cluster:single python3 "$ROOT/bench/ratios.py" "$OUT"
echo "raw results: $OUT" >&2
