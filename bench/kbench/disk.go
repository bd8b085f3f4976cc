package main

import (
	"bytes"
	"context"
	"net/http"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// disk is what the server's own counters say of its durable points over
// the measured phase: how many it made per execution and how long one
// took. At C=1, where one execution's commits run one after another, their
// product is the disk's floor under an execution's latency (issue 29: p50
// at most that floor plus 0.5 ms). Only Gatehouse exports the counters;
// the reference, which writes nothing, has no floor.
type disk struct {
	SyncsPerExec float64 `json:"syncs_per_exec"`
	SyncMS       float64 `json:"sync_ms"`
	FloorMS      float64 `json:"floor_ms"`
}

// syncCounters are Gatehouse's durable-write counters at one moment.
type syncCounters struct{ syncs, seconds float64 }

// readSyncs reads the durable-write counters from the server's /metrics
// (with several -url, the first's: in a cluster, one node's own journal);
// false when it has none.
func (c *apiClient) readSyncs(ctx context.Context) (syncCounters, bool) {
	status, body, err := c.do(ctx, 0, http.MethodGet, "/metrics", nil, "")
	if err != nil || status != http.StatusOK {
		return syncCounters{}, false
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return syncCounters{}, false
	}
	value := func(name string) (float64, bool) {
		f := fams[name]
		if f == nil || len(f.GetMetric()) != 1 {
			return 0, false
		}
		return f.GetMetric()[0].GetCounter().GetValue(), true
	}
	syncs, ok1 := value("gatehouse_store_syncs_total")
	seconds, ok2 := value("gatehouse_store_sync_seconds_total")
	return syncCounters{syncs: syncs, seconds: seconds}, ok1 && ok2
}

// diskBetween is the disk's share of the executions run between two
// readings; nil when there is nothing to say.
func diskBetween(before, after syncCounters, executions int) *disk {
	n := after.syncs - before.syncs
	if n <= 0 || executions <= 0 {
		return nil
	}
	d := &disk{
		SyncsPerExec: round3(n / float64(executions)),
		SyncMS:       round3((after.seconds - before.seconds) / n * 1000),
	}
	d.FloorMS = round3(d.SyncsPerExec * d.SyncMS)
	return d
}
