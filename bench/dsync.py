#!/usr/bin/env python3
"""The latency of a disk's durable 4 KiB writes, as the journal makes them.

usage: bench/dsync.py FILE SECONDS

Writes 4 KiB to FILE (created, then removed) with O_DSYNC, one write a
millisecond for SECONDS, and prints the median, tail and longest latency.
Under --sync always every answer waits for such a write, so the longest
here bounds from below the longest answer the gateway can give on this
disk (docs/performance.md). Run it on the data folder's file system.
"""
import os
import sys
import time

path, seconds = sys.argv[1], float(sys.argv[2])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DSYNC, 0o644)
try:
    block, took, end, i = b"x" * 4096, [], time.monotonic() + seconds, 0
    while time.monotonic() < end:
        start = time.perf_counter()
        os.pwrite(fd, block, (i % 1024) * 4096)
        took.append(time.perf_counter() - start)
        i += 1
        time.sleep(0.001)
finally:
    os.close(fd)
    os.unlink(path)
took.sort()
ms = lambda q: took[min(len(took) - 1, int(len(took) * q))] * 1e3
print(f"{len(took)} writes: p50 {ms(0.5):.2f} ms, p99 {ms(0.99):.2f} ms, "
      f"p99.9 {ms(0.999):.2f} ms, longest {took[-1] * 1e3:.1f} ms, "
      f"over 100 ms: {sum(1 for t in took if t > 0.1)}")
