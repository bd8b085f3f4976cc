package memory_test

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/gatehouse-dev/gatehouse/memory"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// BenchmarkMemoryAtQuota fills one principal's space to its byte quota
// (64 MiB: 256 notes of 256 KiB) and reports what the index costs and
// what a start costs then:
//
//	go test -run '^$' -bench MemoryAtQuota -benchtime 1x ./memory/
//
// Two kinds of text: "prose", words drawn from 200,000 with Zipf's law
// (s=1.1), as people write; "unique", words drawn almost uniformly from
// ten million, nearly every word of a note its own term (the worst case
// of an inverted index). Figures:
//   - index_bytes/note_bytes: the posting, meta and usage records (keys
//     and values, before compression) over the notes' bytes;
//   - folder/note_bytes: the data folder on disk after Close (notes,
//     index and the store's own files) over the notes' bytes;
//   - start_ms, start_heap_MiB, start_notes_heap_MiB, start_rss_MiB: a
//     fresh process (this test binary, TestMemoryStart) opening the store
//     and the notes and answering one search, as a gateway's start does
//     before it serves: the time, its Go heap (most of it the store's
//     memory tables, allocated but not all touched), the part of it the
//     notes added, its resident memory;
//   - search_p50_ms, search_p99_ms: two-word searches on the reopened
//     store;
//   - write_MiB/s: the durable writes that filled it.
func BenchmarkMemoryAtQuota(b *testing.B) {
	for _, kind := range []struct {
		name string
		zipf func(r *rand.Rand) *rand.Zipf
	}{
		{"prose", func(r *rand.Rand) *rand.Zipf { return rand.NewZipf(r, 1.1, 1, 200000) }},
		{"unique", func(r *rand.Rand) *rand.Zipf { return rand.NewZipf(r, 1.0000001, 1e6, 1e7) }},
	} {
		b.Run(kind.name, func(b *testing.B) {
			for b.Loop() {
				atQuota(b, kind.zipf)
			}
		})
	}
}

// startDirEnv names the data folder TestMemoryStart opens.
const startDirEnv = "GATEHOUSE_MEMORY_START_DIR"

// TestMemoryStart is BenchmarkMemoryAtQuota's start, in a process of its
// own: it runs only when the benchmark sets startDirEnv, and prints its
// figures.
func TestMemoryStart(t *testing.T) {
	dir := os.Getenv(startDirEnv)
	if dir == "" {
		t.Skip("run by BenchmarkMemoryAtQuota")
	}
	ctx := context.Background()
	start := time.Now()
	st, err := store.Open(store.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	took := time.Since(start)
	storeHeap := heap()
	start = time.Now()
	n, err := memory.Open(ctx, memory.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Search(ctx, me, "a b", "", 10); err != nil {
		t.Fatal(err)
	}
	took += time.Since(start)
	all := heap()
	fmt.Printf("start_ms=%.1f start_heap_MiB=%.1f start_notes_heap_MiB=%.2f start_rss_MiB=%.1f\n",
		float64(took.Microseconds())/1000, all/(1<<20), (all-storeHeap)/(1<<20), residentMiB(t))
	runtime.KeepAlive(n)
}

func atQuota(b *testing.B, zipf func(r *rand.Rand) *rand.Zipf) {
	const size = 256 << 10
	ctx := context.Background()
	d := memory.Defaults()
	notes := int(d.MaxBytes / size)
	dir := b.TempDir()
	st := storetest.Open(b, store.Options{Dir: dir})
	n, err := memory.Open(ctx, memory.Options{Store: st})
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewSource(1))
	z := zipf(r)
	total := 0
	start := time.Now()
	for i := range notes {
		c := text(z, size)
		total += len(c)
		if _, err := n.Write(ctx, me, fmt.Sprintf("/notes/%04d.md", i), c, 0); err != nil {
			b.Fatal(err)
		}
	}
	wrote := time.Since(start)
	index := 0
	for _, kind := range []string{"mpost", "mnote", "mspace"} {
		err := st.Records(kind, func(id string, decode func(any) error) bool {
			var raw msgpack.RawMessage
			_ = decode(&raw)
			index += len("r/"+kind+"\x00"+id) + len(raw)
			return true
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	st.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryStart$", "-test.count=1")
	cmd.Env = append(os.Environ(), startDirEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("start: %v: %s", err, out)
	}
	for _, f := range strings.Fields(string(out)) {
		if name, v, ok := strings.Cut(f, "="); ok && strings.HasPrefix(name, "start_") {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("start: %q", f)
			}
			b.ReportMetric(x, name)
		}
	}
	st = storetest.Open(b, store.Options{Dir: dir})
	if n, err = memory.Open(ctx, memory.Options{Store: st}); err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	for range 200 {
		q := word(z.Uint64()) + " " + word(z.Uint64())
		t0 := time.Now()
		if _, err := n.Search(ctx, me, q, "", 10); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	st.Close()
	slices.Sort(lat)
	b.ReportMetric(float64(total)/(1<<20)/wrote.Seconds(), "write_MiB/s")
	b.ReportMetric(float64(index)/float64(total), "index_bytes/note_bytes")
	b.ReportMetric(float64(folderBytes(b, dir))/float64(total), "folder/note_bytes")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "search_p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "search_p99_ms")
}

// word is the i-th word of an alphabet of 26 letters.
func word(i uint64) string {
	var w []byte
	for {
		w = append(w, byte('a'+i%26))
		if i /= 26; i == 0 {
			return string(w)
		}
	}
}

// text is about size bytes of words drawn from z.
func text(z *rand.Zipf, size int) string {
	var sb strings.Builder
	for sb.Len() < size-16 {
		sb.WriteString(word(z.Uint64()))
		sb.WriteByte(' ')
	}
	return sb.String()
}

func heap() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc)
}

// residentMiB is the process's resident memory (VmRSS), in MiB.
func residentMiB(tb testing.TB) float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Skip("no /proc/self/status")
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kib, _ := strconv.ParseFloat(f[1], 64)
			return kib / 1024
		}
	}
	return 0
}

// folderBytes is the bytes the files under dir take on disk.
func folderBytes(b *testing.B, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}
