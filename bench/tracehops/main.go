// Command tracehops reads a Go execution trace of a server under a
// one-at-a-time load and says where its hops wait: how long goroutines
// stay runnable after they are woken, by who woke them and where they
// slept; for a stream woken by another goroutine, whether it ran on its
// waker's thread (once the waker blocked) or was handed to another; and
// how long a request (a goroutine woken by the network) and a push (a
// stream's goroutine woken by another) take from that wake-up to the
// write that answers it, split by the goroutine's state meanwhile.
//
//	curl -o c1.trace 'http://127.0.0.1:6060/debug/pprof/trace?seconds=3'   # gatehouse serve --pprof-addr
//	cd bench/tracehops && go run . ../../c1.trace
//
// It is a module of its own so that the trace reader
// (golang.org/x/exp/trace) is no dependency of Gatehouse's.
package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"

	"golang.org/x/exp/trace"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: tracehops TRACE")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	a, err := analyse(f)
	if err != nil {
		log.Fatal(err)
	}
	a.print(os.Stdout)
}

// durations collects microseconds.
type durations []float64

func (d durations) String() string {
	if len(d) == 0 {
		return "-"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	return fmt.Sprintf("n=%d total=%.1fms mean=%.1fµs p50=%.1fµs p90=%.1fµs",
		len(s), sum/1e3, sum/float64(len(s)), s[len(s)/2], s[len(s)*9/10])
}

// hop is a request or push under way on one goroutine.
type hop struct {
	kind   string
	start  trace.Time
	states map[string]float64 // µs in each state since start
}

type analysis struct {
	first, last trace.Time           // the trace's span
	wakes       map[string]durations // runnable → running, by waker and sleeping site
	hops        map[string]durations // wake-up → the answering write
	hopStates   map[string]map[string]float64
	hopsByKind  map[string]int
	// pushRuns: a woken stream's wait, by whether it ran on its waker's
	// thread and what the waker was doing by then.
	pushRuns map[string]durations
}

func analyse(r io.Reader) (*analysis, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return nil, err
	}
	a := &analysis{wakes: map[string]durations{}, hops: map[string]durations{},
		hopStates: map[string]map[string]float64{}, pushRuns: map[string]durations{}}
	var (
		readyAt = map[trace.GoID]trace.Time{}
		readyBy = map[trace.GoID]string{}
		sleptAt = map[trace.GoID]string{}
		since   = map[trace.GoID]trace.Time{}
		state   = map[trace.GoID]trace.GoState{}
		open    = map[trace.GoID]*hop{}
		wakerM  = map[trace.GoID]trace.ThreadID{}
		wakerG  = map[trace.GoID]trace.GoID{}
	)
	for {
		ev, err := tr.ReadEvent()
		if errors.Is(err, io.EOF) {
			return a, nil
		}
		if err != nil {
			return nil, err
		}
		if a.first == 0 {
			a.first = ev.Time()
		}
		a.last = ev.Time()
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		id := st.Resource.Goroutine()
		from, to := st.Goroutine()
		now := ev.Time()
		if h := open[id]; h != nil {
			h.states[state[id].String()] += float64(now-since[id]) / 1e3
		}
		since[id], state[id] = now, to
		switch {
		case from == trace.GoRunning && to == trace.GoWaiting:
			sleptAt[id] = site(ev.Stack())
		case from == trace.GoWaiting && to == trace.GoRunnable:
			by := "by a goroutine: " + site(ev.Stack())
			if ev.Goroutine() == trace.NoGoroutine {
				by = "by the network poller"
			}
			readyAt[id], readyBy[id] = now, by+" -> "+sleptAt[id]
			wakerM[id], wakerG[id] = ev.Thread(), ev.Goroutine()
			switch slept := sleptAt[id]; {
			case strings.Contains(slept, "netFD).Read"):
				open[id] = &hop{kind: "request", start: now, states: map[string]float64{}}
			case strings.Contains(slept, "Stream).Run") && open[id] == nil:
				open[id] = &hop{kind: "push woken " + site(ev.Stack()), start: now, states: map[string]float64{}}
			}
		case from == trace.GoRunnable && to == trace.GoRunning:
			if t, ok := readyAt[id]; ok {
				a.wakes[readyBy[id]] = append(a.wakes[readyBy[id]], float64(now-t)/1e3)
				if w := wakerG[id]; w != trace.NoGoroutine && strings.Contains(sleptAt[id], "Stream).Run") {
					where := "another thread"
					if ev.Thread() == wakerM[id] {
						where = "the waker's thread"
					}
					k := "on " + where + ", the waker by then " + state[w].String()
					a.pushRuns[k] = append(a.pushRuns[k], float64(now-t)/1e3)
				}
				delete(readyAt, id)
			}
		case from == trace.GoRunning && to == trace.GoSyscall:
			if h := open[id]; h != nil && writes(ev.Stack()) {
				a.hops[h.kind] = append(a.hops[h.kind], float64(now-h.start)/1e3)
				if a.hopStates[h.kind] == nil {
					a.hopStates[h.kind] = map[string]float64{}
				}
				for s, us := range h.states {
					a.hopStates[h.kind][s] += us
				}
				delete(open, id)
			}
		}
	}
}

// site names a stack by its first two frames outside the runtime.
func site(st trace.Stack) string {
	var fs []string
	for f := range st.Frames() {
		if strings.HasPrefix(f.Func, "runtime.") || strings.HasPrefix(f.Func, "internal/") || strings.HasPrefix(f.Func, "sync.") {
			continue
		}
		fs = append(fs, f.Func[strings.LastIndex(f.Func, "/")+1:])
		if len(fs) == 2 {
			break
		}
	}
	return strings.Join(fs, " < ")
}

// writes reports whether a system call is a socket's write.
func writes(st trace.Stack) bool {
	for f := range st.Frames() {
		if strings.Contains(f.Func, "netFD).Write") || strings.Contains(f.Func, "Writev") {
			return true
		}
	}
	return false
}

func (a *analysis) print(w io.Writer) {
	fmt.Fprintf(w, "the trace spans %.3f s\n", float64(a.last-a.first)/1e9)
	fmt.Fprintln(w, "wake-ups (runnable until running), by waker -> where the goroutine slept:")
	for _, k := range byCount(a.wakes, 20) {
		fmt.Fprintf(w, "  %s\n      %s\n", k, a.wakes[k])
	}
	fmt.Fprintln(w, "streams woken by a goroutine (runnable until running), by the thread that ran them:")
	for _, k := range byCount(a.pushRuns, 10) {
		fmt.Fprintf(w, "  %s\n      %s\n", k, a.pushRuns[k])
	}
	fmt.Fprintln(w, "hops (woken until the write that answers):")
	for _, k := range byCount(a.hops, 10) {
		fmt.Fprintf(w, "  %s\n      %s\n      mean per state:", k, a.hops[k])
		states := a.hopStates[k]
		for _, s := range []string{"Running", "Runnable", "Syscall", "Waiting"} {
			fmt.Fprintf(w, " %s %.1fµs", s, states[s]/float64(len(a.hops[k])))
		}
		fmt.Fprintln(w)
	}
}

// byCount returns the keys of m with the most entries first, at most n.
func byCount(m map[string]durations, n int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y string) int { return len(m[y]) - len(m[x]) })
	return keys[:min(n, len(keys))]
}
