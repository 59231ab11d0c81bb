package main

import (
	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/reconcile"
)

// metricsPort is the core's Metrics port over the Prometheus metrics: the
// core's GPU values converted to the metrics' own, every other method as
// metrics.Metrics has it.
type metricsPort struct{ *metrics.Metrics }

var _ reconcile.Metrics = metricsPort{}

// SetGPUs implements reconcile.Metrics.
func (p metricsPort) SetGPUs(gpus []reconcile.GPUMetric) {
	out := make([]metrics.GPU, len(gpus))
	for i, g := range gpus {
		out[i] = metrics.GPU{Index: g.Index, UUID: g.UUID, Model: g.Model, PCIBusID: g.PCIBusID,
			MigEnabled: g.MigEnabled, ModePending: g.ModePending, Instances: g.Instances}
	}
	p.Metrics.SetGPUs(out)
}

// SetUnusableGPUs implements reconcile.Metrics.
func (p metricsPort) SetUnusableGPUs(gpus []reconcile.UnusableGPUMetric) {
	out := make([]metrics.UnusableGPU, len(gpus))
	for i, u := range gpus {
		out[i] = metrics.UnusableGPU{Index: u.Index, Error: u.Error}
	}
	p.Metrics.SetUnusableGPUs(out)
}
