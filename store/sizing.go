package store

import (
	"math/bits"
	"time"
)

const (
	kib = 1 << 10
	mib = 1 << 20
	gib = 1 << 30
)

// sizing is how large the store makes its files and caches, and how much
// free space it keeps: sized sets it from the disk budget and the memory
// limit. A roomy box gets the sizes measured on the bench (see
// docs/decisions.md); a small one, files small enough that their number,
// and what Badger may still write once writes stop, fit its disk.
type sizing struct {
	// budget is the budget it was made for, memory the memory limit;
	// zero for none.
	budget, memory int64
	// segment is the most a journal segment holds (see journal.grow).
	segment int64
	// logSegment is the size of the segment log's segments. The one
	// being written is indexed in memory, and sealing it builds its
	// sidecar in memory too, so under a memory limit it follows the limit.
	logSegment int64
	// Badger: memory tables (each is as much again in its log file),
	// level 0, table and level sizes, value log files and the values
	// that go there, and its caches.
	memTable          int64
	numMemtables      int
	l0Tables, l0Stall int
	baseTable         int64
	baseLevel         int64
	// tableGrowth is how much larger each level's tables are than the
	// level above's; zero for Badger's default.
	tableGrowth    int
	vlogFile       int64
	valueThreshold int64
	blockCache     int64
	indexCache     int64

	// backlog bounds the bytes of acknowledged groups waiting for Badger.
	backlog int64
	// journal is how many bytes of written segments the journal may hold
	// before a checkpoint runs at once rather than on its tick; lazyWait
	// and lazyBytes bound the lazy writes waiting for Badger, which hold
	// the journal's segments back (see lazy.go).
	journal   int64
	lazyWait  time.Duration
	lazyBytes int
	// syncRelease has each checkpoint sync Badger's log of a memory
	// table, which then holds every write Badger's tables do not, so that
	// the journal need not wait for the table to fill (see syncRelease):
	// cheap with the small memory tables of a small disk, where the room
	// the journal takes meanwhile counts.
	syncRelease bool
	// reserve is the room Badger may still need once the store stops
	// taking writes: memory tables written out, level 0 compacted, the
	// backlog applied. Below it, the store takes no write that grows the
	// data (SpaceFull), so that Badger's files, written through memory
	// maps, never meet a full disk.
	reserve int64
	// lowWater is the room below which new work waits (SpaceLow), so
	// that work already running can still finish from the room between
	// it and the reserve.
	lowWater int64
}

// Budgets: from roomy up a box gets the full sizes; from mid up, a level 0
// small enough that the reserve stays near a sixteenth of the budget;
// below mid, small files throughout.
const (
	roomy = 32 * gib
	mid   = 2 * gib
)

// roomyMemory is the memory limit from which level 0 may hold more than
// three tables.
const roomyMemory = 512 * mib

// sized returns the sizing for a data folder that may hold budget bytes
// in a process that may use memory bytes; zero means no bound.
func sized(budget, memory int64) sizing {
	z := sizing{
		segment: defaultSegmentSize, memTable: 16 * mib, numMemtables: 5,
		l0Tables: 10, l0Stall: 30, baseTable: 2 * mib, baseLevel: 10 * mib,
		vlogFile: 64 * mib, blockCache: 32 * mib, indexCache: 16 * mib,
		backlog: 64 * mib, journal: 4 * defaultSegmentSize,
		lazyWait: lazyInterval, lazyBytes: lazyMaxBytes,
	}
	switch {
	case budget <= 0 || budget >= roomy:
	case budget >= mid:
		z.numMemtables, z.backlog = 3, 32*mib
	default:
		// A small disk: 64 MiB gets 1 MiB segments, 2 MiB memory tables,
		// and one table in level 0 before it is compacted, so that what
		// Badger may write on its own stays a small part of the disk.
		z.segment = pow2(budget/64, minSegmentSize, defaultSegmentSize)
		z.memTable = pow2(budget/32, mib, 32*mib)
		z.numMemtables = 2
		z.backlog = max(mib, budget/32)
		z.vlogFile = pow2(budget/16, 4*mib, 64*mib)
		z.journal = 2 * z.segment
		z.lazyWait = lazyInterval / 4
		z.lazyBytes = int(min(lazyMaxBytes, budget/64))
		z.syncRelease = true
	}
	z.logSegment = z.segment
	if memory > 0 {
		// Each memory table costs its arena and as much again in the
		// pages of its log file, and writing it out builds its table in
		// memory, four times over when compressed (Badger's builder keeps
		// every block, and its compressed copy, in buffers that grow by
		// doubling): a 256th of the limit each, 1 MiB under 256 MiB, the
		// records of about 1,300 executions (Badger keeps only records;
		// the logs are in the segment log). The caches take a sixteenth
		// and a thirty-second, and the lazy writes waiting for Badger a
		// memory table's worth.
		z.memTable = min(z.memTable, pow2(memory/256, mib, 32*mib))
		z.lazyBytes = min(z.lazyBytes, int(z.memTable))
		z.numMemtables = min(z.numMemtables, max(2, int(memory/(8*z.memTable))))
		z.blockCache = min(z.blockCache, pow2(memory/16, mib, 32*mib))
		z.indexCache = min(z.indexCache, pow2(memory/32, mib, 16*mib))
		z.backlog = min(z.backlog, max(2*mib, memory/16))
		// A full 32 MiB segment of small events holds about 200,000
		// entries: 8-10 MB of index in memory, and as much again while
		// its sidecar is built. A thirty-second of the limit keeps both a
		// small part of it (8 MiB segments under 256 MiB).
		z.logSegment = min(z.logSegment, pow2(memory/32, minSegmentSize, defaultSegmentSize))
	}
	z.budget, z.memory = budget, memory
	z.derive()
	return z
}

// derive sets what follows from the memory table size and the budget:
// level 0, table and level sizes, the value threshold, the reserve and the
// low-water mark. sized calls it; so does whoever changes memTable after.
func (z *sizing) derive() {
	budget := z.budget
	if budget > 0 && budget < roomy {
		// Level 0 is compacted once it holds a third of its stall, which
		// leaves the reserve about a sixteenth of the budget, and at least
		// what one table's compaction takes.
		room := budget/16 - z.backlog - int64(z.numMemtables)*z.memTable
		z.l0Stall = int(min(30, max(2, room*2/(3*z.memTable)-1)))
		z.l0Tables = min(10, max(1, z.l0Stall/3))
	}
	if z.memTable < 32*mib {
		z.baseTable = max(256*kib, z.memTable/4)
		z.baseLevel = 4 * z.memTable
	}
	if z.memory > 0 {
		// A compaction builds each of its tables whole in memory (twice
		// the table's size, more for the blocks before and after
		// compression, kept for reuse) and may hold 13 at once while it
		// writes them out; at four tables in level 0, Badger may merge
		// them into one. So under a memory limit tables are small at
		// every level, level 0 is compacted at two tables and stalls at
		// three, and the base level is small: each compaction, and the
		// memory it takes at once, stays small as the data grows.
		z.baseTable = 256 * kib
		z.baseLevel = z.memTable
		z.tableGrowth = 1
		l0Tables, l0Stall := 2, 3
		if z.memory >= roomyMemory {
			// With four or more tables in level 0, Badger may merge them
			// into one table built in memory, up to the stall's worth of
			// memory tables: eight of them, a 256th of the limit each,
			// built with its compressed copy, stay well within a quarter
			// of the limit. Writes then wait for level 0 less often: over
			// 150 s at full load under a 512 MiB limit (bench/soak.sh,
			// medians of six runs against four), 1.08 times the
			// throughput and 0.65 times the p99 of two and three tables,
			// for a peak RSS of 212-257 MB against 199-210 MB. Under
			// 256 MiB the merge would fit too, but in a 256 MiB cgroup it
			// took the cgroup's peak to 180 MB against 159-171 MB, for
			// 1.09-1.14 times the throughput: there the margin wins.
			l0Tables, l0Stall = 4, 8
		}
		z.l0Tables = min(z.l0Tables, l0Tables)
		z.l0Stall = min(z.l0Stall, l0Stall)
	}
	// Badger takes a value into the tree only when it fits in one of
	// its write batches (15% of a memory table); larger ones go to the
	// value log.
	z.valueThreshold = min(mib, z.memTable*15/100-4*kib)
	// What Badger may write once writes stop: a memory table written out
	// (its table is written before its log goes), level 0 at its stall,
	// and the table waiting for room there, compacted with half as much
	// again of the level below it, where the records of the executions it
	// touched live (tables of events are keyed by time-ordered ids, so a
	// compaction touches few of them); and the backlog applied.
	z.reserve = z.memTable + int64(z.l0Stall+1)*z.memTable*3/2 + z.backlog
	z.lowWater = z.reserve + max(z.reserve/4, min(budget/32, gib))
}

// pow2 returns the largest power of two at most n, within [lo, hi] (both
// powers of two).
func pow2(n, lo, hi int64) int64 {
	if n < lo {
		return lo
	}
	if n > hi {
		return hi
	}
	return 1 << (63 - bits.LeadingZeros64(uint64(n)))
}
