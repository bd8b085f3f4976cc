#!/usr/bin/env python3
"""Side-by-side table of kbench runs: Gatehouse against the reference.

usage: bench/ratios.py DIR   (DIR holds gatehouse_<case>.jsonl and reference_<case>.jsonl)

PAIR=left:right names other file prefixes (bench/cluster.sh: cluster:single).

Runs pair up in order (the n-th Gatehouse run of a case with the n-th
reference run, which bench/compare.sh ran next to it); each figure is the
median over the runs, and each ratio the median of the pairs' ratios.
CPU per execution is the server's CPU seconds over its completed executions;
kbench's own is beside it, with the cores busy on the host, since the load
shares the machine.
"""
import json
import os
import statistics
import sys

FIGURES = [  # key, label, unit
    ("exec_per_s", "throughput", "/s"),
    ("p50_ms", "p50", " ms"),
    ("p99_ms", "p99", " ms"),
    ("max_ms", "max", " ms"),
    ("cpu_ms_per_exec", "server CPU per execution", " ms"),
    # The load's own share of the machine: kbench runs on the same cores,
    # so what it spends bounds what a server can reach there.
    ("client_cpu_ms_per_exec", "kbench's own CPU per execution", " ms"),
    ("host_cores_busy", "cores busy on the host", ""),
    ("replay_events_per_s", "catch-up rate (bench/replay)", " events/s"),
    ("replay_us_per_event", "server CPU per event replayed", " µs"),
    # Gatehouse's own durable points (kbench's "disk", from its /metrics):
    # per execution, one's latency, their product (the disk's floor at C=1)
    # and p50 above that floor; the reference writes nothing and has none.
    ("syncs_per_exec", "durable points per execution", ""),
    ("sync_ms", "one durable point (fsync latency)", " ms"),
    ("floor_ms", "disk floor: durable points x fsync latency", " ms"),
    ("p50_over_floor_ms", "p50 above the disk floor", " ms"),
]


def load(path):
    rows = []
    if not os.path.exists(path):
        return rows
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("server_cpu_s") is not None and r.get("ok"):
            r["cpu_ms_per_exec"] = 1000 * r["server_cpu_s"] / r["ok"]
        if r.get("client_cpu_s") is not None and r.get("ok"):
            r["client_cpu_ms_per_exec"] = 1000 * r["client_cpu_s"] / r["ok"]
        if r.get("host_cpu_util") is not None and r.get("host_cpus"):
            r["host_cores_busy"] = r["host_cpu_util"] * r["host_cpus"]
        if r.get("disk"):
            r.update(r["disk"])
            r["p50_over_floor_ms"] = r["p50_ms"] - r["floor_ms"]
        rows.append(r)
    return rows


def main(d):
    left, right = os.environ.get("PAIR", "gatehouse:reference").split(":")
    cases = sorted({f.split("_", 1)[1].removesuffix(".jsonl")
                    for f in os.listdir(d) if f.endswith(".jsonl") and "_" in f})
    names = {"gatehouse": "Gatehouse"}
    print(f"| case | figure | {names.get(left, left)} | {right} | ratio (median of pairs) |")
    print("|---|---|---|---|---|")
    for case in cases:
        gh = load(os.path.join(d, f"{left}_{case}.jsonl"))
        ref = load(os.path.join(d, f"{right}_{case}.jsonl"))
        for key, label, unit in FIGURES:
            g = [r[key] for r in gh if r.get(key) is not None]
            f = [r[key] for r in ref if r.get(key) is not None]
            if not g:
                continue
            gm = f"{statistics.median(g):.2f}{unit}"
            fm = f"{statistics.median(f):.2f}{unit}" if f else "-"
            pairs = [a / b for a, b in zip(g, f) if b]
            ratio = f"{statistics.median(pairs):.2f}x" if pairs else "-"
            print(f"| {case} ({len(g)}/{len(f)} runs) | {label} | {gm} | {fm} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results")
