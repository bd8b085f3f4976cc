package gateway

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
)

type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	streams  *prometheus.GaugeVec
	// refused counts connections turned away before fasthttp saw them.
	refused *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry, k Kernel, hub Hub) *metrics {
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatehouse_http_requests_total", Help: "HTTP requests by route, method and status code.",
		}, []string{"route", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gatehouse_http_request_duration_seconds", Help: "Time to answer HTTP requests (streams: until the handler hands over to the stream).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route"}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gatehouse_streams_open", Help: "Open long-lived streams by kind.",
		}, []string{"kind"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatehouse_connections_refused_total", Help: "Connections closed on accept, by reason (per_ip: MaxConnsPerIP reached).",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.requests, m.latency, m.streams, m.refused,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newKernelCollector(k), newHubCollector(hub))
	return m
}

func (m *metrics) observe(route, method string, code int, d time.Duration) {
	m.requests.WithLabelValues(route, method, strconv.Itoa(code)).Inc()
	m.latency.WithLabelValues(route).Observe(d.Seconds())
}

func (s *Server) serveMetrics(c *call) error {
	if err := c.principal.Authorize(auth.ActRead, auth.Resource{Kind: auth.KindMetrics}); err != nil {
		return err
	}
	families, err := s.metrics.reg.Gather()
	if err != nil {
		s.log.Warn("gather metrics", "err", err)
	}
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	c.ctx.SetContentType(string(format))
	enc := expfmt.NewEncoder(c.ctx, format)
	for _, f := range families {
		if err := enc.Encode(f); err != nil {
			s.log.Warn("encode metrics", "err", err)
			return nil
		}
	}
	return nil
}

// SnapshotCollector exports series read from one snapshot per scrape: a
// snapshot may take locks and walk state (the kernel's takes its lock and
// walks every consumer), which per series would be repeated a score of
// times. The node registers one for the store beside the gateway's.
type SnapshotCollector[S any] struct {
	snapshot func() S
	series   []snapshotSeries[S]
}

type snapshotSeries[S any] struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(S) float64
	// hist, when set, makes the series a histogram instead.
	hist func(S) Histogram
}

// Histogram is a histogram's figures as read from a snapshot.
type Histogram struct {
	// Buckets maps each bucket's upper bound to the observations at most
	// that large, the smaller buckets' included (cumulative).
	Buckets map[float64]uint64
	// Count and Sum are of every observation.
	Count uint64
	Sum   float64
}

// NewSnapshotCollector returns a collector with no series yet, reading
// snapshot once per scrape.
func NewSnapshotCollector[S any](snapshot func() S) *SnapshotCollector[S] {
	return &SnapshotCollector[S]{snapshot: snapshot}
}

// Gauge adds a gauge read from the snapshot.
func (c *SnapshotCollector[S]) Gauge(name, help string, v func(S) float64) {
	c.add(name, help, prometheus.GaugeValue, v)
}

// Counter adds a counter read from the snapshot.
func (c *SnapshotCollector[S]) Counter(name, help string, v func(S) float64) {
	c.add(name, help, prometheus.CounterValue, v)
}

// Histogram adds a histogram read from the snapshot.
func (c *SnapshotCollector[S]) Histogram(name, help string, h func(S) Histogram) {
	c.series = append(c.series, snapshotSeries[S]{desc: prometheus.NewDesc(name, help, nil, nil), hist: h})
}

func (c *SnapshotCollector[S]) add(name, help string, kind prometheus.ValueType, v func(S) float64) {
	c.series = append(c.series, snapshotSeries[S]{desc: prometheus.NewDesc(name, help, nil, nil), kind: kind, value: v})
}

// Describe implements prometheus.Collector.
func (c *SnapshotCollector[S]) Describe(ch chan<- *prometheus.Desc) {
	for _, s := range c.series {
		ch <- s.desc
	}
}

// Collect implements prometheus.Collector.
func (c *SnapshotCollector[S]) Collect(ch chan<- prometheus.Metric) {
	snap := c.snapshot()
	for _, s := range c.series {
		if s.hist != nil {
			h := s.hist(snap)
			ch <- prometheus.MustNewConstHistogram(s.desc, h.Count, h.Sum, h.Buckets)
			continue
		}
		ch <- prometheus.MustNewConstMetric(s.desc, s.kind, s.value(snap))
	}
}

// newKernelCollector exports the kernel's figures.
func newKernelCollector(k Kernel) *SnapshotCollector[kernel.Stats] {
	c := NewSnapshotCollector(k.Stats)
	c.Gauge("gatehouse_executions_live", "Executions not yet terminal.", func(s kernel.Stats) float64 { return float64(s.Live) })
	c.Gauge("gatehouse_jobs_queued", "Remote jobs waiting for a runner.", func(s kernel.Stats) float64 { return float64(s.QueuedJobs) })
	c.Gauge("gatehouse_agents_online", "Agent consumers with a live connection.", func(s kernel.Stats) float64 { return float64(s.AgentsOnline) })
	c.Gauge("gatehouse_runners_online", "Runner consumers with a live connection.", func(s kernel.Stats) float64 { return float64(s.RunnersOnline) })
	c.Gauge("gatehouse_runners_busy", "Runner consumers holding a job.", func(s kernel.Stats) float64 { return float64(s.RunnersBusy) })
	c.Counter("gatehouse_executions_created_total", "Executions created.", func(s kernel.Stats) float64 { return float64(s.Created) })
	c.Counter("gatehouse_executions_completed_total", "Executions completed.", func(s kernel.Stats) float64 { return float64(s.Completed) })
	c.Counter("gatehouse_executions_failed_total", "Executions failed.", func(s kernel.Stats) float64 { return float64(s.Failed) })
	c.Counter("gatehouse_executions_cancelled_total", "Executions cancelled.", func(s kernel.Stats) float64 { return float64(s.Cancelled) })
	c.Counter("gatehouse_intents_total", "Intents handled.", func(s kernel.Stats) float64 { return float64(s.Intents) })
	c.Counter("gatehouse_intents_denied_total", "Tool intents denied by policy.", func(s kernel.Stats) float64 { return float64(s.Denied) })
	c.Counter("gatehouse_steps_total", "Steps created.", func(s kernel.Stats) float64 { return float64(s.Steps) })
	c.Counter("gatehouse_jobs_dispatched_total", "Remote jobs sent to runners.", func(s kernel.Stats) float64 { return float64(s.Jobs) })
	c.Counter("gatehouse_job_retries_total", "Remote job attempts retried.", func(s kernel.Stats) float64 { return float64(s.Retries) })
	c.Counter("gatehouse_events_total", "Events written.", func(s kernel.Stats) float64 { return float64(s.Events) })
	return c
}

// hubCollector exports the peer hub's figures from one snapshot per scrape.
type hubCollector struct {
	h                             Hub
	consumers, dropped, collected *prometheus.Desc
}

func newHubCollector(h Hub) *hubCollector {
	return &hubCollector{
		h: h,
		consumers: prometheus.NewDesc("gatehouse_peer_consumers",
			"Consumers (agent, runner and channel connection identities) the gateway remembers, connected or not.", nil, nil),
		dropped: prometheus.NewDesc("gatehouse_outbox_dropped_total",
			"Deliveries dropped by the outbox bounds (--outbox-limit, --outbox-retention): unacknowledged ones (the consumer is told history_gone), "+
				"or ones already written to a consumer that cannot acknowledge, dropped from its rewind window.", []string{"kind"}, nil),
		collected: prometheus.NewDesc("gatehouse_peer_consumers_collected_total",
			"Consumers forgotten, with their cursors, after --peer-retention without a connection.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *hubCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.consumers
	ch <- c.dropped
	ch <- c.collected
}

// Collect implements prometheus.Collector.
func (c *hubCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.h.Stats()
	ch <- prometheus.MustNewConstMetric(c.consumers, prometheus.GaugeValue, float64(s.Consumers))
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(s.DroppedUnacknowledged), "unacknowledged")
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(s.DroppedRewind), "rewind")
	ch <- prometheus.MustNewConstMetric(c.collected, prometheus.CounterValue, float64(s.Collected))
}
