#!/usr/bin/env bash
# An edge box loaded by stock seed 004 clients (kbench, out of process: SSE
# agents and runners that never ack, a stream per execution) directly, and
# through its hub (the clients' URL is the hub's /edge/edge/, every
# connection crossing the leaf link in a tunnel), alternated. One hub and
# one edge box on loopback, on the durable default, started once for all
# the runs. Prints one line per run: throughput, p50, p99, and the CPU per
# execution of the edge box and of the hub (from /proc).
#
#   bench/edge-hub.sh          # 3 pairs of 3,000 executions at C=32
#   REPS=5 bench/edge-hub.sh
#
# Everything listens on 127.0.0.1 only; every run is bounded by kbench's
# -timeout, and the servers are stopped at the end.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d)}
REPS=${REPS:-3}
ARGS=${ARGS:-"-agents 4 -runners 4 -executions 3000 -concurrency 32 -remote -tools 1"}
BASE=${BASE:-28380}
EDGE=127.0.0.1:$BASE HUB=127.0.0.1:$((BASE + 1)) LEAF=127.0.0.1:$((BASE + 2))

(cd "$ROOT" && go build -o "$WORK/gatehouse" ./cmd/gatehouse && go build -o "$WORK/kbench" ./bench/kbench)
# shellcheck source=bench/procs.sh
. "$ROOT/bench/procs.sh"
"$WORK/gatehouse" serve --addr "$HUB" --data "$WORK/hub" --token bench --log-level warn \
  --node-name hub --leaf-listen "$LEAF" >"$WORK/hub.log" 2>&1 &
PIDS+=($!)
HP=$!
wait_ready "http://$HUB/v0/ready"
"$WORK/gatehouse" serve --addr "$EDGE" --data "$WORK/edge" --token bench --log-level warn \
  --node-name edge --nats-domain edge --leaf-remote "nats-leaf://$LEAF" >"$WORK/edge.log" 2>&1 &
PIDS+=($!)
EP=$!
wait_ready "http://$EDGE/v0/ready"
wait_ready "http://$HUB/edge/edge/v0/ready"

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # clock ticks
tick=$(getconf CLK_TCK)
for r in $(seq 1 "$REPS"); do
  for how in direct hub; do
    url=http://$EDGE
    [ "$how" = hub ] && url=http://$HUB/edge/edge
    e0=$(cpu "$EP") h0=$(cpu "$HP")
    # shellcheck disable=SC2086
    out=$("$WORK/kbench" -url "$url" -token bench $ARGS -warmup 100 -timeout 250s -server-pid "$EP" 2>>"$WORK/kbench.log" | tail -1)
    e1=$(cpu "$EP") h1=$(cpu "$HP")
    python3 - "$r" "$how" "$out" "$((e1 - e0))" "$((h1 - h0))" "$tick" <<'PY'
import json, sys
r, how, out, e, h, tick = sys.argv[1:]
d = json.loads(out)
n = max(d["ok"], 1)
ms = lambda t: int(t) * 1000 / int(tick) / n
print(f"{r} {how:6} ok={d['ok']} exec/s={d['exec_per_s']:.0f} p50={d['p50_ms']:.1f}ms "
      f"p99={d['p99_ms']:.1f}ms edge_cpu={ms(e):.2f}ms hub_cpu={ms(h):.2f}ms")
PY
  done
done
