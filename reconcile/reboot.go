package reconcile

// The reboot decision, in one place: whether a mode change that no GPU
// reset applied gets a reboot (rebootFor: once per requested change, never
// twice, whatever fails or restarts in between), waiting for it
// (awaitReboot), keeping the change and its rollout slot through it
// (holdSlotForReboot, keepThroughReboot) and forgetting it (forgetReboot).
// The one caller of Rebooter.Reboot is rebootFor.

import (
	"context"
	"fmt"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
)

// rebootSpent says whether the reboot of the request for config was already
// made (or asked for): from the journal's mark, else, when the journal was
// lost, from a `rebooting` record on the Node for the same request. sameBoot
// is true when the reboot was asked on this boot and has not happened yet.
func (d *Daemon) rebootSpent(node *Node, config string) (spent, sameBoot bool, how string) {
	if m := d.Journal.State.RebootFor; m != nil && m.Config == config {
		if m.BootID == d.BootID() {
			// Journaled but not asked for: the agent stopped in between, no
			// reboot happened, asking now is not a second one.
			return m.Requested, m.Requested, "the journal"
		}
		return true, false, "the journal"
	}
	if node != nil && rebootRecorded(node, config) {
		return true, false, "a " + record.StateRebooting + " record on the Node"
	}
	return false, false, ""
}

// rebootRecorded reports a reboot made for the current request of config,
// as the Node's history shows it: among the newest records for config, up
// to the first one for another config (the label had another value then)
// or a success (that request was finished), a `rebooting` record or one
// with `reboot: true` (every record of a change written after its reboot
// says so). The Node keeps only its newest few records: after several
// failed restarts the `rebooting` one has left it, but those restarts'
// records still carry the reboot.
func rebootRecorded(node *Node, config string) bool {
	for _, r := range node.History {
		if r.Config != config || r.Result == record.StateSuccess {
			return false
		}
		if r.Result == record.StateRebooting || r.Reboot {
			return true
		}
	}
	return false
}

// rebootMark is the reboot decided for ch's request (nil: none): the
// journal keeps it once, for the change and past it.
func (d *Daemon) rebootMark(ch *journal.Change) *journal.RebootMark {
	if m := d.Journal.State.RebootFor; m != nil && ch != nil && m.Config == ch.Config {
		return m
	}
	return nil
}

// rebooted says whether the reboot decided for ch's request has happened:
// the machine booted again since it was asked for.
func (d *Daemon) rebooted(ch *journal.Change) bool {
	m := d.rebootMark(ch)
	return m != nil && m.BootID != d.BootID()
}

// keepThroughFailure says whether a failed change stays journaled because
// of its reboot, and whether it still waits for that reboot (its taint and
// paused operands stay through it). A change a reboot was decided for
// stays through a failure that may pass, so that its retry knows the
// reboot: never a second one for the same change, whatever fails in
// between (NVML not up yet at boot, the API server away). One that was
// rebooted is drained again by its retry (restore lifts the taint).
func (d *Daemon) keepThroughFailure(ch *journal.Change) (keep, waiting bool) {
	if d.rebootMark(ch) == nil || d.Journal.State.Change != ch {
		return false, false
	}
	if d.rebooted(ch) {
		if ch.Phase == journal.PhaseRebooting {
			d.advance(ch, journal.PhaseDraining)
		}
		return true, false
	}
	return true, ch.Phase == journal.PhaseRebooting
}

// forgetReboot drops the reboot mark unless it is for config ("" drops it
// whatever it is for); it reports whether the journal changed.
func (d *Daemon) forgetReboot(config string) bool {
	m := d.Journal.State.RebootFor
	if m == nil || (config != "" && m.Config == config) {
		return false
	}
	d.Journal.State.RebootFor = nil
	return true
}

func (a *attempt) awaitReboot() error {
	d, ch := a.d, a.ch
	if ch.Phase != journal.PhaseRebooting {
		return nil
	}
	if d.rebooted(ch) {
		d.Log.Info("resuming after reboot", "config", ch.Config)
		return nil
	}
	if !gpus.PlanChanges(a.v.plan) {
		return nil
	}
	if m := d.rebootMark(ch); (m == nil || !m.Requested) && d.S.RebootMethod != settings.RebootNone {
		// The agent stopped between journaling the reboot and asking for
		// it: no reboot happened on this boot, so asking now is not a
		// second one.
		d.Log.Warn("the reboot journaled for this change was never requested; requesting it now", "config", ch.Config)
		// The node is disrupted until it is back: the reboot waits for a
		// rollout slot like any disruption.
		if err := a.takeSlot(); err != nil {
			return err
		}
		return a.rebootFor(&gpus.Applied{RebootGPUs: gpus.ModeChangeGPUs(a.v.plan)})
	}
	d.Log.Info("waiting for the reboot requested for this change", "config", ch.Config)
	d.setState(a.ctx, record.StateRebooting)
	_ = d.notify().Status("waiting for reboot")
	return endPass(outRebooting)
}

// rebootFor handles a mode change that waits for a reboot: once, never twice.
// It returns the end of the pass (waiting for the reboot, or the sim
// reboot made) or why no reboot is made, as a failure also when the pass is
// interrupted: a resumed pass must not decide again.
//
// The rollout slot and the node must still be this agent's (confirm)
// before the reboot is decided, and the slot is kept through it.
func (a *attempt) rebootFor(applied *gpus.Applied) error {
	d, ctx, node, ch := a.d, a.ctx, a.node, a.ch
	spent, sameBoot, how := d.rebootSpent(node, ch.Config)
	if d.rebooted(ch) || (spent && !sameBoot) {
		// Whatever happened in between (a failure, a restart, a lost
		// journal): one reboot per requested change.
		if !d.rebooted(ch) {
			d.Log.Warn("a reboot was already made for this change; not rebooting again", "config", ch.Config, "from", how)
			// Known from the Node's records only: remembered from now on.
			d.Journal.State.RebootFor = &journal.RebootMark{Config: ch.Config, BootID: "before " + d.BootID(), At: d.Clock.Now().UTC(), Requested: true}
			d.saveJournal()
		}
		d.report(func(s *Status) { s.RebootGuardTripped = true })
		return &StepError{Reason: fmt.Sprintf("MIG mode change on GPUs %v is still pending after the reboot made for it; not rebooting again", applied.RebootGPUs),
			Event: record.ReasonRebootFailed, Always: true}
	}
	// Why no GPU reset applied the mode change (empty for a reboot planned
	// before any apply, whose GPUs were never offered a reset).
	why := ""
	if len(applied.NoReset) > 0 {
		why = "no GPU reset: " + gpus.NoResetReason(applied.RebootGPUs, applied.NoReset)
		d.Log.Info("MIG mode change needs a reboot", "gpus", applied.RebootGPUs, "why", why)
	}
	if !spent {
		if err := a.confirm("rebooting"); err != nil {
			return err
		}
	}
	d.advance(ch, journal.PhaseRebooting)
	if spent {
		// Asked for on this boot already (the journal says so): wait for it.
		d.saveJournal()
		d.Log.Info("waiting for the reboot requested for this change", "config", ch.Config)
		d.setState(ctx, record.StateRebooting)
		_ = d.notify().Status("waiting for reboot")
		return endPass(outRebooting)
	}
	// The mark is journaled before the reboot is asked for: a journal that
	// cannot be written means no reboot (it could not be remembered).
	d.Journal.State.RebootFor = &journal.RebootMark{Config: ch.Config, BootID: d.BootID(), At: d.Clock.Now().UTC()}
	if err := d.mustJournal(); err != nil {
		d.Journal.State.RebootFor = nil
		return &StepError{Reason: "not rebooting: " + err.Error(), Retryable: true, Event: record.ReasonRebootFailed, Always: true}
	}
	if d.S.RebootMethod == settings.RebootNone {
		d.Journal.State.RebootFor.Requested = true
		d.saveJournal()
		if err := d.holdSlotForReboot(ctx); err != nil {
			return err
		}
		rec := d.record(ch, record.StateRebooting, why, d.Clock.Now(), applied.After)
		d.end(ctx, node, record.StateRebooting, rec, EventNormal, record.ReasonRebooting,
			fmt.Sprintf("MIG mode change on GPUs %v needs a reboot; --reboot-method none: waiting for someone to reboot the node", applied.RebootGPUs))
		_ = d.notify().Status("waiting for reboot")
		return endPass(outRebooting)
	}
	if err := d.holdSlotForReboot(ctx); err != nil {
		d.Journal.State.RebootFor = nil // not asked for: nothing to remember
		d.saveJournal()
		return err
	}
	rec := d.record(ch, record.StateRebooting, why, d.Clock.Now(), applied.After)
	d.end(ctx, node, record.StateRebooting, rec, EventNormal, record.ReasonRebooting,
		fmt.Sprintf("MIG mode change on GPUs %v needs a reboot; rebooting through %s", applied.RebootGPUs, d.S.RebootMethod))
	d.Metrics.Rebooted()
	_ = d.notify().Status("rebooting for the MIG mode change on GPUs %v", applied.RebootGPUs)
	// The request is not cancelled by a newer label or a shutdown: it is
	// journaled as made, and made at most once.
	if err := d.Reboot.Reboot(context.WithoutCancel(ctx), "mig-agent: MIG mode change of config "+ch.Config); err != nil {
		// Never retried by itself: a reboot is requested at most once.
		return &StepError{Reason: "requesting the reboot failed: " + err.Error(), Event: record.ReasonRebootFailed, Always: true}
	}
	d.Journal.State.RebootFor.Requested = true
	d.Journal.State.Reboots++ // counted once it was asked for: see Run
	d.saveJournal()
	if d.S.RebootMethod == settings.RebootSim {
		return endPass(outRebooted)
	}
	return endPass(outRebooting)
}

// holdSlotForReboot keeps the rollout slot through the reboot: a node that
// goes down for its change is disrupted until it is back, so its slot must
// not pass to another node meanwhile (--max-concurrent). A slot that
// cannot be kept (lost, or the API server away) means no reboot: the node
// would be disrupted without counting against the bound.
func (d *Daemon) holdSlotForReboot(ctx context.Context) error {
	if d.Slots == nil {
		return nil
	}
	if err := d.Slots.ExtendForReboot(context.WithoutCancel(ctx)); err != nil {
		return &StepError{Reason: "not rebooting: keeping the rollout slot through the reboot failed: " + err.Error(),
			Retryable: true, Event: record.ReasonSlotLost, Always: true, Err: err}
	}
	return nil
}
