package reconcile

import (
	"github.com/migagent/mig-agent/gpus"
)

// stopClientsForStrays stops the host GPU clients (--host-gpu-clients) for
// a change without a mode change too, where processes block it: a DCGM or
// NVSM holds the MIG devices a destroy takes away just as it holds a GPU
// whose mode changes. It returns the processes still there afterwards.
// With a mode change the clients are stopped in their own step, after
// this check; they are restarted when the change ends either way.
func (a *attempt) stopClientsForStrays(strays []string) ([]string, error) {
	d, ch := a.d, a.ch
	if len(strays) == 0 || d.Units == nil || len(d.S.HostGPUClients) == 0 || len(ch.StoppedUnits) > 0 || gpus.ModeChanges(a.v.plan) {
		return strays, nil
	}
	d.Log.Info("processes block the change; stopping the host GPU clients", "processes", strays, "units", d.S.HostGPUClients)
	_ = d.notify().Status("stopping host GPU clients %v", d.S.HostGPUClients)
	stopped, err := d.Units.StopActive(a.ctx, d.S.HostGPUClients)
	ch.StoppedUnits = stopped
	d.saveJournal()
	if err != nil {
		return nil, retryable("stopping host GPU clients", err)
	}
	if len(stopped) == 0 {
		return strays, nil
	}
	left, err := gpus.Blockers(d.GPU, a.v.n, a.v.plan)
	if err != nil {
		return nil, retryable("listing GPU processes", err)
	}
	return left, nil
}
