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

func (s *Server) serveMetrics(c *call) {
	if err := c.principal.Authorize(auth.ActRead, auth.Resource{Kind: auth.KindMetrics}); err != nil {
		s.writeError(c.ctx, err)
		return
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
			return
		}
	}
}

// kernelSeries is one series of kernelCollector, read from one snapshot.
type kernelSeries struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(kernel.Stats) float64
}

// kernelCollector exports the kernel's figures. It takes one snapshot per
// scrape: each snapshot takes the kernel lock and walks every consumer,
// which per series would be repeated a score of times.
type kernelCollector struct {
	k      Kernel
	series []kernelSeries
}

func newKernelCollector(k Kernel) *kernelCollector {
	c := &kernelCollector{k: k}
	add := func(name, help string, kind prometheus.ValueType, v func(kernel.Stats) float64) {
		c.series = append(c.series, kernelSeries{prometheus.NewDesc(name, help, nil, nil), kind, v})
	}
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	add("gatehouse_executions_live", "Executions not yet terminal.", gauge, func(s kernel.Stats) float64 { return float64(s.Live) })
	add("gatehouse_jobs_queued", "Remote jobs waiting for a runner.", gauge, func(s kernel.Stats) float64 { return float64(s.QueuedJobs) })
	add("gatehouse_agents_online", "Agent consumers with a live connection.", gauge, func(s kernel.Stats) float64 { return float64(s.AgentsOnline) })
	add("gatehouse_runners_online", "Runner consumers with a live connection.", gauge, func(s kernel.Stats) float64 { return float64(s.RunnersOnline) })
	add("gatehouse_runners_busy", "Runner consumers holding a job.", gauge, func(s kernel.Stats) float64 { return float64(s.RunnersBusy) })
	add("gatehouse_executions_created_total", "Executions created.", counter, func(s kernel.Stats) float64 { return float64(s.Created) })
	add("gatehouse_executions_completed_total", "Executions completed.", counter, func(s kernel.Stats) float64 { return float64(s.Completed) })
	add("gatehouse_executions_failed_total", "Executions failed.", counter, func(s kernel.Stats) float64 { return float64(s.Failed) })
	add("gatehouse_executions_cancelled_total", "Executions cancelled.", counter, func(s kernel.Stats) float64 { return float64(s.Cancelled) })
	add("gatehouse_intents_total", "Intents handled.", counter, func(s kernel.Stats) float64 { return float64(s.Intents) })
	add("gatehouse_intents_denied_total", "Tool intents denied by policy.", counter, func(s kernel.Stats) float64 { return float64(s.Denied) })
	add("gatehouse_steps_total", "Steps created.", counter, func(s kernel.Stats) float64 { return float64(s.Steps) })
	add("gatehouse_jobs_dispatched_total", "Remote jobs sent to runners.", counter, func(s kernel.Stats) float64 { return float64(s.Jobs) })
	add("gatehouse_job_retries_total", "Remote job attempts retried.", counter, func(s kernel.Stats) float64 { return float64(s.Retries) })
	add("gatehouse_events_total", "Events written.", counter, func(s kernel.Stats) float64 { return float64(s.Events) })
	return c
}

// Describe implements prometheus.Collector.
func (c *kernelCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, s := range c.series {
		ch <- s.desc
	}
}

// Collect implements prometheus.Collector.
func (c *kernelCollector) Collect(ch chan<- prometheus.Metric) {
	ks := c.k.Stats()
	for _, s := range c.series {
		ch <- prometheus.MustNewConstMetric(s.desc, s.kind, s.value(ks))
	}
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
