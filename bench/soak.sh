#!/usr/bin/env bash
# Sustained load on Gatehouse's durable default: kbench (bench/kbench) as
# stock seed 004 clients, 32 executions in flight for DURATION after a
# warm-up, reported in windows: throughput, p50, p99, max and the server's
# RSS for each, then the last window against the first.
#
#   bench/soak.sh                       # 60 s in 10 s windows, after 20,000 warm-up executions
#   DURATION=120s WINDOW=20s bench/soak.sh
#
# The warm-up lets Badger's memory tables fill once, so that the windows
# compare a server in its steady state. The server listens on 127.0.0.1
# only and is stopped at the end; kbench's -timeout bounds the run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d)}
DURATION=${DURATION:-60s}
WINDOW=${WINDOW:-10s}
WARMUP=${WARMUP:-20000}
PORT=${PORT:-28180}
GH_FLAGS=${GH_FLAGS:-}

(cd "$ROOT" && go build -o "$WORK/gatehouse" ./cmd/gatehouse && go build -o "$WORK/kbench" ./bench/kbench)
# shellcheck disable=SC2086
"$WORK/gatehouse" serve --addr "127.0.0.1:$PORT" --data "$WORK/data" $GH_FLAGS >"$WORK/gatehouse.log" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PORT/v0/ready" >/dev/null && break; sleep 0.1; done

"$WORK/kbench" -url "http://127.0.0.1:$PORT" -agents 4 -runners 4 -concurrency 32 -remote -tools 1 \
  -warmup "$WARMUP" -duration "$DURATION" -window "$WINDOW" -timeout 600s -server-pid "$PID" \
  >"$WORK/soak.json" 2>"$WORK/kbench.log"

python3 - "$WORK/soak.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
ws = r["windows"]
print(f"{r['ok']} of {r['executions']} executions in {r['wall_s']} s: {r['exec_per_s']:.0f}/s, "
      f"p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms (max/p99 {r['max_ms'] / r['p99_ms']:.2f})")
print("| window from | executions/s | p50 ms | p99 ms | max ms | server RSS MB |")
print("|---|---|---|---|---|---|")
for w in ws:
    print(f"| {w['start_s']:.0f} s | {w['exec_per_s']:.0f} | {w['p50_ms']:.1f} | {w['p99_ms']:.1f} | {w['max_ms']:.1f} | {w.get('rss_mb', 0):.1f} |")
first, last = ws[0], ws[-1]
for key, label in (("exec_per_s", "throughput"), ("p99_ms", "p99"), ("rss_mb", "RSS")):
    if first.get(key):
        print(f"last window / first window, {label}: {last[key] / first[key]:.2f}")
EOF
echo "raw: $WORK/soak.json" >&2
