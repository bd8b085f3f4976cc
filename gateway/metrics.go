package gateway

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/gatehouse-dev/gatehouse/kernel"
)

type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	streams  *prometheus.GaugeVec
}

func newMetrics(reg *prometheus.Registry, k *kernel.Kernel) *metrics {
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
	}
	gauge := func(name, help string, f func(kernel.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(k.Stats()) })
	}
	counter := func(name, help string, f func(kernel.Stats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return f(k.Stats()) })
	}
	reg.MustRegister(m.requests, m.latency, m.streams,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		gauge("gatehouse_executions_live", "Executions not yet terminal.", func(s kernel.Stats) float64 { return float64(s.Live) }),
		gauge("gatehouse_jobs_queued", "Remote jobs waiting for a runner.", func(s kernel.Stats) float64 { return float64(s.QueuedJobs) }),
		gauge("gatehouse_agents_online", "Agent consumers with a live connection.", func(s kernel.Stats) float64 { return float64(s.AgentsOnline) }),
		gauge("gatehouse_runners_online", "Runner consumers with a live connection.", func(s kernel.Stats) float64 { return float64(s.RunnersOnline) }),
		gauge("gatehouse_runners_busy", "Runner consumers holding a job.", func(s kernel.Stats) float64 { return float64(s.RunnersBusy) }),
		counter("gatehouse_executions_created_total", "Executions created.", func(s kernel.Stats) float64 { return float64(s.Created) }),
		counter("gatehouse_executions_completed_total", "Executions completed.", func(s kernel.Stats) float64 { return float64(s.Completed) }),
		counter("gatehouse_executions_failed_total", "Executions failed.", func(s kernel.Stats) float64 { return float64(s.Failed) }),
		counter("gatehouse_executions_cancelled_total", "Executions cancelled.", func(s kernel.Stats) float64 { return float64(s.Cancelled) }),
		counter("gatehouse_intents_total", "Intents handled.", func(s kernel.Stats) float64 { return float64(s.Intents) }),
		counter("gatehouse_intents_denied_total", "Tool intents denied by policy.", func(s kernel.Stats) float64 { return float64(s.Denied) }),
		counter("gatehouse_steps_total", "Steps created.", func(s kernel.Stats) float64 { return float64(s.Steps) }),
		counter("gatehouse_jobs_dispatched_total", "Remote jobs sent to runners.", func(s kernel.Stats) float64 { return float64(s.Jobs) }),
		counter("gatehouse_job_retries_total", "Remote job attempts retried.", func(s kernel.Stats) float64 { return float64(s.Retries) }),
		counter("gatehouse_events_total", "Events written.", func(s kernel.Stats) float64 { return float64(s.Events) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gatehouse_store_commits_total", Help: "Group commits (batches) written to the store."},
			func() float64 { return float64(k.StoreStats().Commits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gatehouse_store_writes_total", Help: "Writes committed; writes/commits is the group-commit batch size."},
			func() float64 { return float64(k.StoreStats().Writes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gatehouse_store_syncs_total", Help: "fsyncs of the store (one per batch under --sync always)."},
			func() float64 { return float64(k.StoreStats().Syncs) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gatehouse_store_last_commit_seconds", Help: "Duration of the last group commit, its fsync included."},
			func() float64 { return k.StoreStats().LastCommit.Seconds() }),
	)
	return m
}

func (m *metrics) observe(route, method string, code int, d time.Duration) {
	m.requests.WithLabelValues(route, method, strconv.Itoa(code)).Inc()
	m.latency.WithLabelValues(route).Observe(d.Seconds())
}

func (s *Server) serveMetrics(c *call) {
	if !s.admin(c) {
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
