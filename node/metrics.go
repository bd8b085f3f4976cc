package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatehouse-dev/gatehouse/channel"
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
	c.Counter("gatehouse_store_sync_seconds_total", "Time the journal's durable writes and fsyncs took; over gatehouse_store_syncs_total, the latency of one durable point.", func(s store.Stats) float64 { return s.SyncTime.Seconds() })
	c.Histogram("gatehouse_store_sync_duration_seconds", "How long each durable point took (the journal's synchronous write, or its fsync): what an answer waits for on the disk, its stalls included.", syncHistogram)
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
	c.Counter("gatehouse_store_table_builders_released_total", "Table builders' allocators taken back from Badger's pool under a memory limit, so that their buffers can be collected.", func(s store.Stats) float64 { return float64(s.BuildersReleased) })
	return c
}

// channelCollector exports the channel adapters' figures from one
// snapshot per scrape.
type channelCollector struct {
	r                                        *channel.Registry
	sends, dropped, refused, answers, queued *prometheus.Desc
}

func newChannelCollector(r *channel.Registry) *channelCollector {
	return &channelCollector{
		r: r,
		sends: prometheus.NewDesc("gatehouse_channel_sends_total",
			"Calls of the chat and push channels' platforms, by channel and result: sent (a card shown), edited (a card edited or withdrawn), failed (retried).",
			[]string{"channel", "result"}, nil),
		dropped: prometheus.NewDesc("gatehouse_channel_dropped_total",
			"Cards given up on, by channel and reason: refused (the platform refused for good), attempts (an edit failed every attempt), gone (the destination is gone and was removed), invalid.",
			[]string{"channel", "reason"}, nil),
		refused: prometheus.NewDesc("gatehouse_channel_refused_total",
			"Answers through chat and push channels refused, by channel and reason (signature, stale, replayed, tampered, unmapped_user, not_responder, token_reused, ...).",
			[]string{"channel", "reason"}, nil),
		answers: prometheus.NewDesc("gatehouse_channel_answers_total",
			"Answers through chat and push channels, by channel and result: won (it decided the prompt) or recorded (another answer had; the recorded outcome was returned).",
			[]string{"channel", "result"}, nil),
		queued: prometheus.NewDesc("gatehouse_channel_queued",
			"Deliveries the chat and push channels have not carried yet (their durable outboxes).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *channelCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.sends
	ch <- c.dropped
	ch <- c.refused
	ch <- c.answers
	ch <- c.queued
}

// Collect implements prometheus.Collector.
func (c *channelCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.r.Stats()
	for _, n := range s.Counts {
		v := float64(n.N)
		switch n.Family {
		case channel.StatSent, channel.StatEdited, channel.StatFailed:
			ch <- prometheus.MustNewConstMetric(c.sends, prometheus.CounterValue, v, n.Adapter, n.Family)
		case channel.StatDropped:
			ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, v, n.Adapter, n.Reason)
		case channel.StatRefused:
			ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, v, n.Adapter, n.Reason)
		case channel.StatAnswers:
			ch <- prometheus.MustNewConstMetric(c.answers, prometheus.CounterValue, v, n.Adapter, n.Reason)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(s.Queued))
}

// syncHistogram is the store's sync latencies as a Prometheus histogram.
func syncHistogram(s store.Stats) gateway.Histogram {
	h := gateway.Histogram{Buckets: make(map[float64]uint64, store.SyncBuckets), Sum: s.SyncTime.Seconds()}
	for i, n := range s.SyncLatency {
		h.Count += n
		if i < store.SyncBuckets {
			h.Buckets[store.SyncBucketBound(i).Seconds()] = h.Count
		}
	}
	return h
}
