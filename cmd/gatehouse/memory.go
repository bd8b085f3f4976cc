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

// gcPercent is the Go heap's growth between collections (GOGC). What the
// heap holds between Badger's flushes and compactions is small (about 50
// MB at full load, most of it the memory tables); a flush's or a
// compaction's tables, built in memory, come and go in bursts of tens of
// megabytes, and with Go's default of 100 the heap grows to twice each
// burst before collecting, memory the process then keeps for minutes:
// the RSS at full load peaked at 320-400 MB. At 50 it peaks near 200 MB
// for about one percent more of the CPU in the collector; under a memory
// limit, 25. Those buffers hold no pointers, so collecting them more
// often costs little.
func gcPercent(limit int64) int {
	if limit > 0 {
		return 25
	}
	return 50
}

// applyMemoryLimit sets the Go heap's soft limit for limit, unless
// GOMEMLIMIT sets it already, and its growth between collections, unless
// GOGC does; it returns the limit in force.
func applyMemoryLimit(limit int64) int64 {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent(limit))
	}
	if limit <= 0 || os.Getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1)
	}
	debug.SetMemoryLimit(goMemoryLimit(limit))
	return goMemoryLimit(limit)
}
