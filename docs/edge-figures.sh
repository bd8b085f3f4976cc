#!/usr/bin/env bash
# Measures the edge figures of docs/edge.md on this machine: an idle
# folder's size, executions accepted before 507 on a 64 MiB file system,
# the folder after retention of 50,000 executions, and the memory of a
# gateway with --memory-limit at 10,000 and 50,000 stored executions, inside
# a 256 MiB cgroup where one can be made. Needs root (tmpfs, cgroup v1 or v2)
# for all of it; the rest runs anyway. Takes about five minutes. PARTS
# names the parts to run, all four unless set.
#
#   bash docs/edge-figures.sh
#   PARTS="disk memory" bash docs/edge-figures.sh
#
# PROFILES=dir also has the memory part keep the gateway's heap profile
# every 2 s in dir (10k-N.pb.gz while the first 10,000 run, 50k-N.pb.gz
# after): `go tool pprof -sample_index=inuse_space -top dir/50k-N.pb.gz`.
set -u
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
go build -o "$work/gatehouse" ./cmd/gatehouse || exit 1
gh=$work/gatehouse
port=18177

up() { for _ in $(seq 200); do curl -s -o /dev/null "localhost:$port/v0/health" && return; sleep 0.1; done; echo "no server"; exit 1; }
kib() { du -sk "$1" | cut -f1; }
PARTS=${PARTS:-idle disk retention memory}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

if part idle; then
echo "== idle, empty folder"
"$gh" serve --addr 127.0.0.1:$port --data "$work/idle" --log-level warn & pid=$!
up; sleep 3
echo "data folder: $(kib "$work/idle") KiB"
kill $pid; wait $pid
fi

if part disk; then
echo "== executions with 4 KB inputs accepted before 507 on 64 MiB (tmpfs), five fill / SIGKILL / grow cycles"
GATEHOUSE_EDGE=1 go test -count=1 -run TestEdgeFullDiskKillRestart -v ./cmd/gatehouse/ 2>&1 | grep -E "cycle|ok|FAIL|SKIP"
fi

if part retention; then
echo "== folder after retention empties a gateway of 50,000 executions"
"$gh" serve --addr 127.0.0.1:$port --data "$work/ret" --log-level warn --retention 1s --retention-interval 30s & pid=$!
up
"$gh" bench --url "http://127.0.0.1:$port" --executions 50000 --duration 10m | grep throughput
echo "with 50,000 executions: $(kib "$work/ret") KiB"
sleep 65
echo "after two retention passes: $(kib "$work/ret") KiB"
kill $pid; wait $pid
fi

part memory || exit 0
echo "== memory with --memory-limit 256MiB: 10,000 then 50,000 executions stored"
cg=""
if [ -w /sys/fs/cgroup/memory ] && mkdir -p /sys/fs/cgroup/memory/gatehouse-figures 2>/dev/null; then
	cg=/sys/fs/cgroup/memory/gatehouse-figures
	echo $((256 << 20)) > $cg/memory.limit_in_bytes
elif [ -w /sys/fs/cgroup/cgroup.subtree_control ] && mkdir -p /sys/fs/cgroup/gatehouse-figures 2>/dev/null; then
	cg=/sys/fs/cgroup/gatehouse-figures
	echo $((256 << 20)) > $cg/memory.max
fi
pprof=""
if [ -n "${PROFILES:-}" ]; then mkdir -p "$PROFILES"; pprof="--pprof-addr 127.0.0.1:$((port + 1))"; fi
sh -c "[ -n '$cg' ] && echo \$\$ > $cg/cgroup.procs; exec '$gh' serve --addr 127.0.0.1:$port --data '$work/mem' --log-level warn --memory-limit 256MiB $pprof" & pid=$!
up
[ -n "$cg" ] && echo "in a 256 MiB cgroup ($cg)" || echo "no cgroup could be made: the limit is the flag's alone"
# The peaks of RssAnon (the Go heap) and RssFile (mapped files) since the
# last report, sampled every 0.1 s: VmHWM says only the peak of their sum.
( while kill -0 $pid 2>/dev/null; do awk '/RssAnon/ {a=$2} /RssFile/ {f=$2} END {print a, f}' /proc/$pid/status 2>/dev/null >> "$work/samples"; sleep 0.1; done ) &
report() {
	echo "$1: $(grep -E 'VmHWM|VmRSS|RssAnon|RssFile' /proc/$pid/status | tr -s ' \t' ' ' | tr '\n' ' ')$(awk '$1 > a {a = $1} $2 > f {f = $2} END {print "peak RssAnon", a, "kB, peak RssFile", f, "kB"}' "$work/samples")"
	: > "$work/samples"
}
# profiles NAME keeps a heap profile every 2 s until killed (PROFILES).
profiles() {
	[ -n "${PROFILES:-}" ] || return 0
	i=0
	while kill -0 $pid 2>/dev/null; do
		curl -s -o "$PROFILES/$1-$i.pb.gz" "localhost:$((port + 1))/debug/pprof/heap"
		i=$((i + 1)); sleep 2
	done
}
profiles 10k & prof=$!
"$gh" bench --url "http://127.0.0.1:$port" --executions 10000 | grep -E "throughput|latency"
kill $prof 2>/dev/null
report "10,000 stored"
profiles 50k & prof=$!
"$gh" bench --url "http://127.0.0.1:$port" --executions 40000 --duration 10m | grep -E "throughput|latency"
kill $prof 2>/dev/null
report "50,000 stored"
kill $pid; wait $pid
[ -n "$cg" ] && { echo "cgroup peak: $(cat $cg/memory.max_usage_in_bytes 2>/dev/null || cat $cg/memory.peak 2>/dev/null) bytes, OOM kills: $(grep -E '^oom_kill ' $cg/memory.oom_control 2>/dev/null | cut -d' ' -f2)"; rmdir $cg; }
exit 0
