package planner

import "time"

// Metrics is what the planner tells its metrics (metrics.Planner in the
// binary); Planner.Metrics nil tells nothing.
type Metrics interface {
	// Decision counts one decision: "changed" or "unservable".
	Decision(result string)
	// UnservablePods is the number of unservable pods at a round's end.
	UnservablePods(n int)
	// Planned observes a pod's time from Unschedulable to its change.
	Planned(d time.Duration)
}

// noMetrics tells nothing.
type noMetrics struct{}

func (noMetrics) Decision(string)       {}
func (noMetrics) UnservablePods(int)    {}
func (noMetrics) Planned(time.Duration) {}

// metrics is p.Metrics, or none.
func (p *Planner) metrics() Metrics {
	if p.Metrics == nil {
		return noMetrics{}
	}
	return p.Metrics
}
