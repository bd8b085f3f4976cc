#!/usr/bin/env python3
"""A resuming client's catch-up rate: events per second read from sequence 0.

usage: bench/replay.py WRITE_URL READ_URL [EXECUTIONS]

Fills EXECUTIONS executions (default 20) with 1,000 signals each through
WRITE_URL (32 concurrent writers: the kernel's cap on unconsumed signals
is 1,000), then reads each one's stream from sequence 0 through READ_URL,
one after another, as a client resuming from the start, and prints the
events read per second. Against a cluster, READ_URL is a follower: the
stream comes from the leader through the follower's relay. Loopback only.
"""
import concurrent.futures
import http.client
import json
import sys
import time
import urllib.parse

SIGNALS = 1000


def conn(url):
    u = urllib.parse.urlsplit(url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"{url}: loopback only")
    return http.client.HTTPConnection(u.hostname, u.port, timeout=60)


def post(c, path, body):
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status >= 300:
        raise RuntimeError(f"POST {path}: {r.status} {data[:200]!r}")
    return json.loads(data) if data else None


def fill(write, n):
    c = conn(write)
    ids = [post(c, "/v0/executions", {"agent_id": "replay"})["id"] for _ in range(n)]

    def signals(ex):
        c = conn(write)
        for _ in range(SIGNALS):
            post(c, f"/v0/executions/{ex}/signal",
                 {"signal_type": "tick", "payload": {"note": "a realistic small payload of some tens of bytes"}})

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        list(pool.map(signals, ids))
    return ids


def read(url, ex, want):
    c = conn(url)
    c.request("GET", f"/v0/executions/{ex}/stream?after_sequence=0")
    r = c.getresponse()
    got = 0
    while got < want:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            got += 1
    c.close()
    return got


def main():
    write, readurl = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    ids = fill(write, n)
    want = SIGNALS + 1  # execution.created, then the signals
    start = time.monotonic()
    total = sum(read(readurl, ex, want) for ex in ids)
    took = time.monotonic() - start
    if total != want * n:
        sys.exit(f"read {total} events, want {want * n}")
    print(json.dumps({"events": total, "seconds": round(took, 3), "events_per_s": round(total / took)}))


if __name__ == "__main__":
    main()
