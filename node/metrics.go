package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatehouse-dev/gatehouse/store"
)

// storeSeries is one series of storeCollector, read from one snapshot.
type storeSeries struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(store.Stats) float64
}

// storeCollector exports the store's figures (group commits, the room of
// the data folder) beside the gateway's metrics. It lives with the node,
// which chose the store: the gateway knows no store, and another store
// would export other figures. One snapshot per scrape.
type storeCollector struct {
	st     *store.Store
	series []storeSeries
}

func newStoreCollector(st *store.Store) *storeCollector {
	c := &storeCollector{st: st}
	add := func(name, help string, kind prometheus.ValueType, v func(store.Stats) float64) {
		c.series = append(c.series, storeSeries{prometheus.NewDesc(name, help, nil, nil), kind, v})
	}
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	add("gatehouse_store_commits_total", "Group commits (batches) written to the store.", counter, func(s store.Stats) float64 { return float64(s.Commits) })
	add("gatehouse_store_writes_total", "Writes committed; writes/commits is the group-commit batch size.", counter, func(s store.Stats) float64 { return float64(s.Writes) })
	add("gatehouse_store_syncs_total", "fsyncs of the store (one per batch under --sync always).", counter, func(s store.Stats) float64 { return float64(s.Syncs) })
	add("gatehouse_store_last_commit_seconds", "Duration of the last group commit, its fsync included.", gauge, func(s store.Stats) float64 { return s.LastCommit.Seconds() })
	add("gatehouse_storage_full", "0: room; 1: below the low-water mark, new work is refused with 507 STORAGE_FULL; 2: below the reserve, every write that grows the data is refused.",
		gauge, func(s store.Stats) float64 { return float64(s.Space.State) })
	add("gatehouse_storage_free_bytes", "Free space of the data folder's file system.", gauge, func(s store.Stats) float64 { return float64(s.Space.Free) })
	add("gatehouse_storage_used_bytes", "Bytes the data folder holds on disk.", gauge, func(s store.Stats) float64 { return float64(s.Space.Used) })
	add("gatehouse_storage_budget_bytes", "The most the data folder may hold (--disk-budget).", gauge, func(s store.Stats) float64 { return float64(s.Space.Budget) })
	add("gatehouse_storage_low_water_bytes", "Room below which new work is refused.", gauge, func(s store.Stats) float64 { return float64(s.Space.LowWater) })
	add("gatehouse_storage_reserve_bytes", "Room kept for the store's own writes; below it every write that grows the data is refused.", gauge, func(s store.Stats) float64 { return float64(s.Space.Reserve) })
	add("gatehouse_store_segment_failures_total", "Journal segments that could not be prepared (the log says why).", counter, func(s store.Stats) float64 { return float64(s.SegmentFailures) })
	return c
}

// Describe implements prometheus.Collector.
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, s := range c.series {
		ch <- s.desc
	}
}

// Collect implements prometheus.Collector.
func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	ss := c.st.Stats()
	for _, s := range c.series {
		ch <- prometheus.MustNewConstMetric(s.desc, s.kind, s.value(ss))
	}
}
