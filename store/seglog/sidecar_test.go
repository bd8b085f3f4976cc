package seglog

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// sidecarIndex is an index of streams streams with perStream entries
// each, and two drops, the same on every call.
func sidecarIndex(streams, perStream int) *memIndex {
	m := newMemIndex()
	off := uint32(0)
	for i := range streams {
		name := fmt.Sprintf("exec/%08d", i*7919%100003)
		for j := range perStream {
			m.add(name, loc{seq: uint64(j + 1), version: uint64(i*perStream + j + 1), off: off, len: 100 + uint32(j%17)})
			off += 120
		}
	}
	m.drops = []namedDrop{{"exec/00000007", drop{before: 3, version: 9}}, {"outbox/a", drop{before: 1, version: 2}}}
	return m
}

// TestSidecarBytesAreThoseEarlierReleasesWrote: the sidecar of a fixed
// index hashes to what the releases before streaming the sidecar wrote,
// so a data folder's sidecars stay readable both ways; and the file opens
// and finds every stream.
func TestSidecarBytesAreThoseEarlierReleasesWrote(t *testing.T) {
	path := filepath.Join(t.TempDir(), "1.idx")
	m := sidecarIndex(300, 5)
	if err := writeSidecar(path, 1, 1<<20, 4242, m); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	const want = "94b84f5bd8a4f5b2a6b4d81d360ab1d7bbe73f43b0c85472713c7dcbe2c83065"
	if got := hex.EncodeToString(sum[:]); got != want {
		t.Errorf("sidecar of %d bytes hashes to %s, want %s", len(b), got, want)
	}
	sc, err := openSidecar(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.f.Close()
	for name := range m.streams {
		if !sc.has(name) {
			t.Fatalf("sidecar lacks %s", name)
		}
	}
}

// TestSidecarIsWrittenWithoutACopyInMemory: writing the sidecar of an
// index of 200,000 entries (a 4.8 MB file) allocates a small part of the
// file's size, not a copy of it: a seal adds little to the memory peak.
func TestSidecarIsWrittenWithoutACopyInMemory(t *testing.T) {
	dir := t.TempDir()
	m := sidecarIndex(2000, 100)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := writeSidecar(filepath.Join(dir, "1.idx"), 1, 1<<30, 1<<20, m); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	fi, err := os.Stat(filepath.Join(dir, "1.idx"))
	if err != nil {
		t.Fatal(err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(fi.Size())/8 {
		t.Errorf("writing a sidecar of %d bytes allocated %d bytes", fi.Size(), alloc)
	}
}

// BenchmarkWriteSidecar writes the sidecar of 200,000 entries in 2,000
// streams.
func BenchmarkWriteSidecar(b *testing.B) {
	dir := b.TempDir()
	m := sidecarIndex(2000, 100)
	b.ReportAllocs()
	for b.Loop() {
		if err := writeSidecar(filepath.Join(dir, "1.idx"), 1, 1<<30, 1<<20, m); err != nil {
			b.Fatal(err)
		}
	}
}
