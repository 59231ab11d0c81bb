package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Planner are the planner's metrics (mig-agent planner), on a registry of
// their own: it runs as its own process, apart from any agent.
type Planner struct {
	reg        *prometheus.Registry
	decisions  *prometheus.CounterVec
	unservable prometheus.Gauge
	toPlanned  prometheus.Histogram
	leader     prometheus.Gauge
}

// NewPlanner returns the planner's metrics, registered.
func NewPlanner() *Planner {
	m := &Planner{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "planner_decisions_total",
			Help: "Planner decisions: result changed (a node's label set) or unservable (a pod's MigGeometryUnservable Event)."}, []string{"result"}),
		unservable: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: "planner_unservable_pods",
			Help: "Pending pods asking for MIG devices that no allowed change of any opted-in node can serve, at the last round."}),
		toPlanned: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: "planner_pending_to_planned_seconds",
			Help:    "Time from a pod being marked unschedulable to the planner's change for it.",
			Buckets: []float64{0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800}}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: "planner_leader",
			Help: "1 while this replica holds the planner's Lease and plans."}),
	}
	m.decisions.WithLabelValues("changed")
	m.decisions.WithLabelValues("unservable")
	m.reg.MustRegister(m.decisions, m.unservable, m.toPlanned, m.leader)
	return m
}

// Handler serves the planner's /metrics.
func (m *Planner) Handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// Decision counts one decision: result "changed" or "unservable".
func (m *Planner) Decision(result string) { m.decisions.WithLabelValues(result).Inc() }

// UnservablePods sets the pods no allowed change can serve.
func (m *Planner) UnservablePods(n int) { m.unservable.Set(float64(n)) }

// Planned observes the time from a pod's Unschedulable condition to the
// change for it.
func (m *Planner) Planned(d time.Duration) { m.toPlanned.Observe(d.Seconds()) }

// Leading sets migagent_planner_leader.
func (m *Planner) Leading(on bool) { m.leader.Set(b2f(on)) }
