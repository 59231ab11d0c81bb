package main

import (
	"time"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/reconcile"
)

// metricsPort is the core's Metrics port over the Prometheus metrics: a
// reported Status sets every gauge (each setter is idempotent, and the zero
// Status is what the metrics show at start), with the core's GPU values
// (the GPUs as read) converted to the metrics' own.
type metricsPort struct{ m *metrics.Metrics }

var _ reconcile.Metrics = metricsPort{}

// Report implements reconcile.Metrics.
func (p metricsPort) Report(s reconcile.Status) {
	p.m.SetState(s.State)
	p.m.SetDesiredConfig(s.Desired)
	p.m.SetAppliedConfig(s.AppliedConfig, s.AppliedHash)
	p.m.SetGPUs(metricGPUs(s.GPUs))
	p.m.SetUnusableGPUs(metricUnusable(s.GPUs))
	p.m.SetNVMLUp(s.NVMLUp)
	p.m.SetDrift(s.Drift)
	p.m.SetRebootGuardTripped(s.RebootGuardTripped)
	p.m.SetResourcesConverged(!s.ResourcesNotConverged)
	p.m.SetLastSuccess(s.LastSuccess)
	p.m.SetLastFailure(s.LastFailure)
}

// metricGPUs is what the metrics show of n's GPUs (none when n is nil).
func metricGPUs(n *gpus.Inventory) []metrics.GPU {
	if n == nil {
		return nil
	}
	out := make([]metrics.GPU, 0, len(n.Devices))
	for i, dev := range n.Devices {
		g := metrics.GPU{Index: dev.Index, UUID: dev.UUID, Model: dev.Name, PCIBusID: dev.PCIBusID,
			MigEnabled: dev.MigMode.Current, ModePending: dev.MigMode.Current != dev.MigMode.Pending, Instances: map[string]int{}}
		for _, gi := range n.Instances[i] {
			g.Instances[gi.Profile]++
		}
		out = append(out, g)
	}
	return out
}

// metricUnusable is what the metrics show of the GPUs n cannot open.
func metricUnusable(n *gpus.Inventory) []metrics.UnusableGPU {
	if n == nil {
		return nil
	}
	out := make([]metrics.UnusableGPU, 0, len(n.Unusable))
	for _, u := range n.Unusable {
		out = append(out, metrics.UnusableGPU{Index: u.Index, Error: u.Return})
	}
	return out
}

// Reconfigured implements reconcile.Metrics.
func (p metricsPort) Reconfigured(result string, took time.Duration) {
	p.m.ObserveReconfiguration(result, took)
}

// Evicted implements reconcile.Metrics.
func (p metricsPort) Evicted(n int) { p.m.AddEvictedPods(n) }

// Rebooted implements reconcile.Metrics.
func (p metricsPort) Rebooted() { p.m.IncReboots() }

// Collected implements reconcile.Metrics.
func (p metricsPort) Collected(collector string, failed bool) {
	p.m.SetCollectorError(collector, failed)
}
