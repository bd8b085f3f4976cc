package store

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/dgraph-io/ristretto/v2/z"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// TestReleaseBuildersKeepsTwo: of the grown allocators the pool keeps, up
// to its eight, all but keptBuilders are taken and released, and none of
// the fresh ones Get makes once the pool is empty is left behind in it.
func TestReleaseBuildersKeepsTwo(t *testing.T) {
	for _, tc := range []struct{ pooled, released int }{{0, 0}, {1, 0}, {2, 0}, {3, 1}, {pooledBuilders, pooledBuilders - keptBuilders}} {
		t.Run(strconv.Itoa(tc.pooled), func(t *testing.T) {
			p := z.NewAllocatorPool(pooledBuilders)
			defer p.Release()
			fill(p, tc.pooled)
			if got := releaseBuilders(p); got != tc.released {
				t.Fatalf("released %d allocators, want %d", got, tc.released)
			}
			if got, want := countGrown(p), tc.pooled-tc.released; got != want {
				t.Fatalf("the pool keeps %d grown allocators, want %d", got, want)
			}
			if got := releaseBuilders(p); got != 0 {
				t.Fatalf("released %d more on a second pass", got)
			}
		})
	}
	if got := releaseBuilders(nil); got != 0 {
		t.Fatalf("released %d from no pool", got)
	}
}

// TestTableBuildersAreTakenBackUnderAMemoryLimit: once Badger has written
// a memory table out, its pool keeps the builder's grown allocator. With
// more kept than two (here added to the pool, as a burst of builds leaves
// them), the store's passes under a memory limit release the others;
// without a limit they leave them. The first case also fails if an upgrade
// of Badger stops pooling builders (the release would then be dead code),
// and builderPool finding no pool fails both.
func TestTableBuildersAreTakenBackUnderAMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int64
	}{{"no limit", 0}, {"256 MiB", 256 * mib}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := openWith(t, Options{Dir: t.TempDir(), MemoryLimit: tc.limit, memTableSize: mib, idleAfter: time.Hour})
			defer s.Close()
			pool := builderPool(s.db)
			if pool == nil {
				t.Fatal("Badger's DB has no allocPool of type *z.AllocatorPool: see builders.go")
			}
			for i := range 80 { // 1.25 MiB: Badger writes its 1 MiB memory table out
				write(t, s, func(b *Batch) {
					if err := b.Put("rec", strconv.Itoa(i), bytes.Repeat([]byte{byte(i)}, 16<<10)); err != nil {
						t.Fatal(err)
					}
				})
			}
			eventually.True(t, "a table in level 0", func() bool { return s.Stats().Level0Tables > 0 })
			if tc.limit == 0 {
				if countGrown(pool) == 0 {
					t.Fatal("Badger's pool keeps no table builder after writing a table out")
				}
				fill(pool, pooledBuilders-keptBuilders)
				time.Sleep(2 * checkpointInterval)
				if n := s.Stats().BuildersReleased; n != 0 {
					t.Fatalf("%d builders released without a memory limit", n)
				}
				return
			}
			fill(pool, pooledBuilders-keptBuilders)
			eventually.Check(t, func() error {
				if n := s.Stats().BuildersReleased; n < pooledBuilders-2*keptBuilders {
					return fmt.Errorf("%d builders released", n)
				}
				if n := countGrown(pool); n > keptBuilders {
					return fmt.Errorf("the pool keeps %d grown builders", n)
				}
				return nil
			})
		})
	}
}

// fill gives p n grown allocators, as table builds give theirs back.
func fill(p *z.AllocatorPool, n int) {
	for range n {
		a := z.NewAllocator(64<<10, "test")
		a.Allocate(32 << 10)
		p.Return(a)
	}
}

// countGrown returns how many grown allocators p keeps, leaving them there.
func countGrown(p *z.AllocatorPool) int {
	var grown []*z.Allocator
	for range pooledBuilders {
		a := p.Get(0, "count")
		if a.Allocated() <= freshAllocator {
			a.Release()
			break
		}
		grown = append(grown, a)
	}
	for _, a := range grown {
		p.Return(a)
	}
	return len(grown)
}
