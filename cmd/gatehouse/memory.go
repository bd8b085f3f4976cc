package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
)

// cgroupRoot is where the process's cgroup hierarchy is mounted.
const cgroupRoot = "/sys/fs/cgroup"

// memoryLimit returns the memory the gateway may use and where that came
// from: the flag's value when set, else the memory limit of the cgroup the
// process runs in (cgroup v2's memory.max, or v1's
// memory/memory.limit_in_bytes, under root), else 0 for none.
func memoryLimit(flagged int64, root string) (int64, string) {
	if flagged > 0 {
		return flagged, "--memory-limit"
	}
	for _, f := range []string{"memory.max", filepath.Join("memory", "memory.limit_in_bytes")} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			continue
		}
		v := string(bytes.TrimSpace(data))
		if v == "max" {
			return 0, ""
		}
		n, err := strconv.ParseInt(v, 10, 64)
		// cgroup v1 says "no limit" with a huge number.
		if err != nil || n <= 0 || n >= 1<<60 {
			return 0, ""
		}
		return n, "cgroup"
	}
	return 0, ""
}

// goMemoryLimit is the soft limit of the Go heap for a process that may
// use limit bytes: three quarters, the rest being Badger's memory-mapped
// files (its memory tables' logs) and memory Go does not count.
func goMemoryLimit(limit int64) int64 { return limit / 4 * 3 }

// gcPercent is the Go heap's growth between collections (GOGC): half of
// Go's default, and a quarter under a memory limit. What the heap holds
// between Badger's compactions is small; a compaction's tables, built in
// memory, come and go in bursts of tens of megabytes, and with the default
// 100 the heap would grow to twice each burst before collecting, memory
// the process then keeps for minutes. Those buffers hold no pointers, so
// collecting more often costs little: at 50, full load peaks 60-90 MB
// lower for no loss of throughput, and a catch-up, whose reads allocate
// nothing per event, runs as fast (docs/decisions.md).
const (
	gcPercent        = 50
	gcPercentLimited = 25
)

// applyMemoryLimit sets the Go heap's soft limit for limit, unless
// GOMEMLIMIT sets it already, and its growth between collections, unless
// GOGC does; it returns the limit in force.
func applyMemoryLimit(limit int64) int64 {
	if os.Getenv("GOGC") == "" {
		if limit > 0 {
			debug.SetGCPercent(gcPercentLimited)
		} else {
			debug.SetGCPercent(gcPercent)
		}
	}
	if limit <= 0 || os.Getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1)
	}
	debug.SetMemoryLimit(goMemoryLimit(limit))
	return goMemoryLimit(limit)
}
