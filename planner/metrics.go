package planner

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the planner's Prometheus metrics; a nil *Metrics records
// nothing.
type Metrics struct {
	reg        *prometheus.Registry
	decisions  *prometheus.CounterVec
	unservable prometheus.Gauge
	toPlanned  prometheus.Histogram
	leader     prometheus.Gauge
}

// NewMetrics registers the planner's metrics on a registry of their own.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "migagent_planner_decisions_total",
			Help: "Planner decisions: result changed (a node's label set) or unservable (a pod's MigGeometryUnservable Event)."}, []string{"result"}),
		unservable: prometheus.NewGauge(prometheus.GaugeOpts{Name: "migagent_planner_unservable_pods",
			Help: "Pending pods asking for MIG devices that no allowed change of any opted-in node can serve, at the last round."}),
		toPlanned: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "migagent_planner_pending_to_planned_seconds",
			Help:    "Time from a pod being marked unschedulable to the planner's change for it.",
			Buckets: []float64{0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800}}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "migagent_planner_leader",
			Help: "1 while this replica holds the planner's Lease and plans."}),
	}
	m.decisions.WithLabelValues("changed")
	m.decisions.WithLabelValues("unservable")
	m.reg.MustRegister(m.decisions, m.unservable, m.toPlanned, m.leader)
	return m
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

func (m *Metrics) decision(result string) {
	if m != nil {
		m.decisions.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) unservablePods(n int) {
	if m != nil {
		m.unservable.Set(float64(n))
	}
}

func (m *Metrics) planned(d time.Duration) {
	if m != nil {
		m.toPlanned.Observe(d.Seconds())
	}
}

// Leading sets migagent_planner_leader.
func (m *Metrics) Leading(on bool) {
	if m == nil {
		return
	}
	if on {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
}
