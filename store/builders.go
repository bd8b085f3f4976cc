package store

import (
	"reflect"
	"unsafe"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/ristretto/v2/z"
)

// Badger builds each table (a memory table written out, a compaction's
// output) in an allocator it takes from a pool and gives back once the
// table is written: z.AllocatorPool, eight allocators, one per DB. The
// pool keeps every buffer an allocator grew to (it trims only past 400
// MB), and lets one allocator go every two seconds only when no table was
// built in that time: under steady load, never. So the buffers of the most
// tables ever built at once stay allocated for the life of the process,
// and that number grows with the data, as compactions split their ranges into
// more parts built in parallel. Under a 256 MiB limit it was about 10 MB
// of the peak at 50,000 executions stored, and what kept the peak from
// being flat (docs/decisions.md, "Badger's table builders' buffers go
// back under a memory limit").
//
// Badger has no option for it. Under a memory limit the store takes the
// pooled allocators back whenever it looks at its table pages (every
// 50 ms) and at each checkpoint, and releases all but keptBuilders of
// them, so that the garbage collector has the buffers the bursts grew.

// builderPool returns Badger's pool of table builders' allocators, the
// DB's unexported allocPool, or nil if this version of Badger has none by
// that name and type (TestTableBuildersAreTakenBackUnderAMemoryLimit fails then).
func builderPool(db *badger.DB) *z.AllocatorPool {
	f := reflect.ValueOf(db).Elem().FieldByName("allocPool")
	if !f.IsValid() || f.Type() != reflect.TypeFor[*z.AllocatorPool]() {
		return nil
	}
	// Set once by badger.Open and never changed: reading it is not racy.
	return *(**z.AllocatorPool)(unsafe.Pointer(f.UnsafeAddr()))
}

// pooledBuilders bounds the allocators releaseBuilders takes back: Badger's
// pool holds eight.
const pooledBuilders = 8

// keptBuilders is how many allocators releaseBuilders leaves in the pool:
// in steady state Badger builds about two tables at a time (a memory table
// written out, a compaction), and those are reused as Badger means them
// to be. Releasing every one made each table build grow a fresh
// allocator: twice the garbage collector's work under a memory limit, and
// about 15% fewer executions per second (docs/decisions.md).
const keptBuilders = 2

// freshAllocator is the most a new allocator holds (ristretto starts one
// asked for nothing at 512 bytes); a table builder's holds at least twice
// a table's size.
const freshAllocator = 4 << 10

// releaseBuilders takes the allocators p keeps, gives keptBuilders of them
// back and releases the others; it reports how many it released. When the
// pool is empty, Get makes a fresh allocator instead, which is released at
// once and ends the taking.
func releaseBuilders(p *z.AllocatorPool) int {
	if p == nil {
		return 0
	}
	var taken [pooledBuilders]*z.Allocator
	n := 0
	for n < len(taken) {
		a := p.Get(0, "gatehouse")
		if a.Allocated() <= freshAllocator {
			a.Release()
			break
		}
		taken[n] = a
		n++
	}
	for i, a := range taken[:n] {
		if i < keptBuilders {
			p.Return(a)
		} else {
			a.Release()
		}
	}
	return max(0, n-keptBuilders)
}
