package reconcile

import (
	"fmt"

	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/record"
)

// refreshCDI runs the CDI step after the GPUs changed, as NVIDIA's
// reconfigure does after applying (mig-parted
// pkg/mig/reconfigure/reconfigure.go Run: runNvidiaSMI, handleCDI), before
// anything paused is brought back. A failure is a named, retryable step
// error; the change stays journaled (in the refreshing phase, as when the
// resources do not show), so that its retry runs the step again instead of
// finding the GPUs done and reporting success.
func (a *attempt) refreshCDI() error {
	d, ch := a.d, a.ch
	if d.CDI == nil || len(ch.GPUsChanged) == 0 {
		return nil
	}
	_ = d.notify().Status("refreshing CDI")
	done, err := d.CDI.Refresh(a.ctx)
	if err != nil {
		d.advance(ch, journal.PhaseRefreshing)
		d.saveJournal()
		return &StepError{Reason: fmt.Sprintf("the GPUs hold config %q, but refreshing CDI failed: %v", ch.Config, err),
			Retryable: true, Event: record.ReasonFailed, Err: err}
	}
	if done {
		d.Log.Info("CDI refreshed after the change", "config", ch.Config)
	}
	return nil
}
