package node

import (
	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/store"
)

// newStoreCollector exports the store's figures (group commits, the room of
// the data folder) beside the gateway's metrics. It lives with the node,
// which chose the store: the gateway knows no store, and another store
// would export other figures.
func newStoreCollector(st *store.Store) *gateway.SnapshotCollector[store.Stats] {
	c := gateway.NewSnapshotCollector(st.Stats)
	c.Counter("gatehouse_store_commits_total", "Group commits (batches) written to the store.", func(s store.Stats) float64 { return float64(s.Commits) })
	c.Counter("gatehouse_store_writes_total", "Writes committed; writes/commits is the group-commit batch size.", func(s store.Stats) float64 { return float64(s.Writes) })
	c.Counter("gatehouse_store_syncs_total", "fsyncs of the store (one per batch under --sync always).", func(s store.Stats) float64 { return float64(s.Syncs) })
	c.Gauge("gatehouse_store_last_commit_seconds", "Duration of the last group commit, its fsync included.", func(s store.Stats) float64 { return s.LastCommit.Seconds() })
	c.Gauge("gatehouse_storage_full", "0: room; 1: below the low-water mark, new work is refused with 507 STORAGE_FULL; 2: below the reserve, every write that grows the data is refused.",
		func(s store.Stats) float64 { return float64(s.Space.State) })
	c.Gauge("gatehouse_storage_free_bytes", "Free space of the data folder's file system.", func(s store.Stats) float64 { return float64(s.Space.Free) })
	c.Gauge("gatehouse_storage_used_bytes", "Bytes the data folder holds on disk.", func(s store.Stats) float64 { return float64(s.Space.Used) })
	c.Gauge("gatehouse_storage_budget_bytes", "The most the data folder may hold (--disk-budget).", func(s store.Stats) float64 { return float64(s.Space.Budget) })
	c.Gauge("gatehouse_storage_low_water_bytes", "Room below which new work is refused.", func(s store.Stats) float64 { return float64(s.Space.LowWater) })
	c.Gauge("gatehouse_storage_reserve_bytes", "Room kept for the store's own writes; below it every write that grows the data is refused.", func(s store.Stats) float64 { return float64(s.Space.Reserve) })
	c.Counter("gatehouse_store_segment_failures_total", "Journal segments that could not be prepared (the log says why).", func(s store.Stats) float64 { return float64(s.SegmentFailures) })
	c.Gauge("gatehouse_store_level0_tables", "Tables in Badger's level 0; at gatehouse_store_level0_stall_tables writes wait for a compaction.", func(s store.Stats) float64 { return float64(s.Level0Tables) })
	c.Gauge("gatehouse_store_level0_stall_tables", "Tables in Badger's level 0 at which writes wait.", func(s store.Stats) float64 { return float64(s.Level0Stall) })
	c.Gauge("gatehouse_store_table_bytes", "Bytes of Badger's tables, every level.", func(s store.Stats) float64 { return float64(s.TableBytes) })
	return c
}
