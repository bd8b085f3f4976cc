package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// window is one slice of the measured phase (-window): the executions that
// completed in it, and the server's peak RSS while it lasted.
type window struct {
	StartS   float64 `json:"start_s"`
	OK       int     `json:"ok"`
	ExecPerS float64 `json:"exec_per_s"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	Max      float64 `json:"max_ms"`
	// RSSMB is the server's highest VmRSS sampled in the window (with
	// -server-pid), in MB.
	RSSMB float64 `json:"rss_mb,omitempty"`
}

// windows splits the successful executions by the moment they completed
// into whole windows of length w from t0 (a last, partial one is left
// out), with rss[i] the server's peak RSS in window i.
func windows(results []execResult, t0 time.Time, wall, w time.Duration, rss []float64) []window {
	if w <= 0 {
		return nil
	}
	n := int(wall / w)
	lats := make([][]time.Duration, n)
	for _, r := range results {
		if r.outcome != outOK {
			continue
		}
		if i := int(r.started.Add(r.lat).Sub(t0) / w); i >= 0 && i < n {
			lats[i] = append(lats[i], r.lat)
		}
	}
	out := make([]window, n)
	for i := range out {
		ms := durationsMs(lats[i])
		out[i] = window{StartS: round3((time.Duration(i) * w).Seconds()), OK: len(ms), ExecPerS: round3(float64(len(ms)) / w.Seconds())}
		if len(ms) > 0 {
			out[i].P50, out[i].P99, out[i].Max = round3(percentile(ms, 50)), round3(percentile(ms, 99)), round3(ms[len(ms)-1])
		}
		if i < len(rss) {
			out[i].RSSMB = round3(rss[i])
		}
	}
	return out
}

// rssSampler reads a process's VmRSS a few times per window and keeps each
// window's peak.
type rssSampler struct {
	done chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	peak []float64
}

// startRSSSampler samples pid's RSS every window/5 until stop; it does
// nothing without a pid or a window.
func startRSSSampler(pid int, w time.Duration) *rssSampler {
	s := &rssSampler{done: make(chan struct{})}
	if pid <= 0 || w <= 0 {
		return s
	}
	t0 := time.Now()
	s.wg.Go(func() {
		t := time.NewTicker(w / 5)
		defer t.Stop()
		for {
			select {
			case <-s.done:
				return
			case now := <-t.C:
				mb, err := vmRSSMB(pid)
				if err != nil {
					return
				}
				i := int(now.Sub(t0) / w)
				s.mu.Lock()
				for len(s.peak) <= i {
					s.peak = append(s.peak, 0)
				}
				s.peak[i] = max(s.peak[i], mb)
				s.mu.Unlock()
			}
		}
	})
	return s
}

// stop ends the sampling and returns each window's peak, in MB.
func (s *rssSampler) stop() []float64 {
	close(s.done)
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// vmRSSMB reads a process's VmRSS from /proc, in MB.
func vmRSSMB(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
