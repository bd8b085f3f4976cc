#!/usr/bin/env python3
"""Where the CPU of a few Gatehouse processes goes, by class of stack.

usage: bench/pprof-classes.py PROFILE...   (CPU profiles, e.g. bench/cluster-pprof.sh's)

Each sample goes to the first class whose pattern matches a frame of its
stack (`go tool pprof -traces`), in the order of CLASSES: a sample of the
raft log's fsync is the fsync's, not raft's. It prints each class's seconds,
its share of the whole, and its seconds in each profile.
"""
import collections
import re
import subprocess
import sys

CLASSES = [  # name, pattern over the stack's frames
    ("NATS: fsync of the raft log", r"syscall\.Fsync"),
    ("relay", r"gatehouse/relay\."),
    ("NATS: raft", r"server\.\(\*raft\)|handleAppendEntry"),
    ("NATS: the stream's apply", r"monitorStream|applyStreamEntries"),
    ("NATS: the followers' ordered consumers",
     r"\(\*consumer\)|nats%2ego|cluster\.\(\*Journal\)\.Reader"),
    ("NATS: routes, acknowledgements, the rest", r"nats-server/v2/server"),
    ("stores (journal, Badger, a follower's apply)",
     r"gatehouse/store|dgraph-io/badger|Member\)\.apply"),
    ("gateway and kernel",
     r"gatehouse/gateway|gatehouse/kernel|gatehouse/stream|fasthttp|gatehouse/peer|gatehouse/node"),
    ("Go scheduler",
     r"runtime\.(findRunnable|schedule|mcall|park_m|mstart|notewakeup|wakep|startm)"),
    ("GC", r"gcBgMarkWorker|gcAssist|bgsweep|bgscavenge"),
]
SEPARATOR = "-----------+-------------------------------------------------------"
SAMPLE = re.compile(r"\s*([0-9.]+)(m?s)\s+(.*)")


def classify(profile):
    """Seconds per class in one profile."""
    out = subprocess.run(["go", "tool", "pprof", "-traces", profile],
                         capture_output=True, text=True, check=True).stdout
    seconds = collections.Counter()
    for block in out.split(SEPARATOR)[1:]:
        lines = [l for l in block.strip().split("\n") if l.strip()]
        while lines and not SAMPLE.match(lines[0]):
            lines = lines[1:]  # labels (a goroutine's pprof labels) come first
        if not lines:
            continue
        m = SAMPLE.match(lines[0])
        value = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
        stack = " ".join([m.group(3)] + lines[1:])
        name = next((n for n, rx in CLASSES if re.search(rx, stack)), "other")
        seconds[name] += value
    return seconds


def main(profiles):
    per = [classify(p) for p in profiles]
    total = collections.Counter()
    for c in per:
        total.update(c)
    whole = sum(total.values()) or 1
    print(f"{whole:.2f} CPU s in {len(profiles)} profiles")
    for name, v in total.most_common():
        cols = "  ".join(f"{c[name]:.2f}" for c in per)
        print(f"{name:46s} {v:6.2f} s {100 * v / whole:3.0f}%   {cols}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
