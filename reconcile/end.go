package reconcile

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/record"
)

// The one exit of a change: every way a change ends (success, failure,
// waiting for a reboot, abandoned for a newer request) fills in its record
// here (record) and hands it, with the state label, to the Cluster through
// end, the one caller of Cluster.Record; end also posts the Event and
// reports metrics and the journal. The writing of the record (bounded,
// patched, retried) is the Cluster's.

// success ends a change whose GPUs hold its config: the record, the
// state label, the Event. It ends the pass (endPass(outSuccess)) only when
// the record landed; otherwise the change is no success: a failure that
// says why (retried; the retry finds the config applied and records that).
func (d *Daemon) success(ctx context.Context, node *Node, ch *journal.Change, plan *geometry.Plan, n *gpus.Inventory, converged *bool, msg, reason string) error {
	now := d.Clock.Now()
	rec := d.record(ch, record.StateSuccess, "", now, n)
	rec.ResourcesConverged = converged
	// Metrics first: whoever sees the state label finds them current. They
	// say what the GPUs hold, which is so even when the record fails.
	d.Metrics.Reconfigured(record.StateSuccess, now.Sub(ch.StartedAt))
	d.report(func(s *Status) {
		s.AppliedConfig, s.AppliedHash, s.LastSuccess = ch.Config, plan.Hash, now
		s.Drift, s.RebootGuardTripped, s.LastFailure = false, false, ""
	})
	if err := d.end(ctx, node, record.StateSuccess, rec, EventNormal, reason, msg); err != nil {
		return &StepError{Reason: "the GPUs hold the config, but its success record could not be written, so the change is not reported a success: " + err.Error(),
			Retryable: true, Event: record.ReasonRecordFailed, Always: true, Err: err}
	}
	d.drifted = false
	j := &d.Journal.State
	j.Change = nil
	j.Succeeded(ch.Config, plan.Hash)
	j.RebootFor = nil // the change is done: its reboot mark with it
	d.saveJournal()
	d.Log.Info("mig config applied", "config", ch.Config, "gpusChanged", ch.GPUsChanged, "evicted", len(ch.Evicted))
	_ = d.notify().Status("config %s applied", ch.Config)
	return endPass(outSuccess)
}

// partial ends a change whose GPUs hold the config, except those named
// that NVML cannot open: the change is done (journal, applied config), and
// its result is a failure with that reason, retried with backoff.
func (d *Daemon) partial(ch *journal.Change, plan *geometry.Plan, named []nvmlx.UnusableGPU) error {
	j := &d.Journal.State
	j.Change, j.Applied, j.AppliedHash = nil, ch.Config, plan.Hash
	j.RebootFor = nil // the change is done: its reboot mark with it
	d.report(func(s *Status) { s.AppliedConfig, s.AppliedHash = ch.Config, plan.Hash })
	return &StepError{Reason: gpus.UnusableReason(ch.Config, named, true), Retryable: true, Event: record.ReasonGPUUnusable, Always: true}
}

// failure ends an attempt: restore, record, event, metrics, and the retry
// schedule when the cause may pass.
// n is the GPUs as the pass read them when it did not touch them since
// (nil: read them now).
func (d *Daemon) failure(ctx context.Context, node *Node, ch *journal.Change, se *StepError, n *gpus.Inventory) outcome {
	reason, retryable := se.Reason, se.Retryable
	keep, waiting := d.keepThroughFailure(ch)
	keep = keep && retryable
	waiting = waiting && retryable
	// A change whose GPUs are done but whose resources never showed stays
	// too: its retry restarts the device plugin and waits again (a fresh
	// pass would find the config applied and report success unseen).
	refreshing := retryable && ch != nil && ch.Phase == journal.PhaseRefreshing && d.Journal.State.Change == ch
	if refreshing {
		waiting = false
	}
	if ch != nil && !waiting {
		// Still waiting for the reboot: the taint and paused operands stay
		// through it, as they do without a failure.
		d.restore(ctx, ch)
	}
	now := d.Clock.Now()
	rec := d.record(ch, record.StateFailed, reason, now, n)
	d.Log.Error("mig config failed", "config", rec.Config, "reason", reason, "retry", retryable)
	// Metrics first: whoever sees the state label finds them current.
	d.Metrics.Reconfigured(record.StateFailed, now.Sub(rec.StartedAt))
	d.report(func(s *Status) { s.LastFailure = reason })
	d.end(ctx, node, record.StateFailed, rec, EventWarning, se.Event, reason)
	if !keep && !refreshing {
		d.Journal.State.Change = nil
	}
	if !retryable {
		d.Journal.State.GaveUp(rec.Config)
		d.saveJournal()
		_ = d.notify().Status("failed: %s", reason)
		return outFailed
	}
	d.saveJournal()
	wait := d.Journal.State.Retry(rec.Config, now, d.backoff)
	_ = d.notify().Status("failed, retrying in %s: %s", wait, reason)
	return outRetry
}

// record builds the audit record of the change, with the geometry of n (the
// GPUs as just read; nil reads them now).
func (d *Daemon) record(ch *journal.Change, result, reason string, now time.Time, n *gpus.Inventory) record.ChangeRecord {
	rec := ch.Record(result, reason, now)
	rec.AgentVersion, rec.Reboot = d.Version, ch != nil && (d.rebooted(ch) || result == record.StateRebooting)
	if drv, err := d.GPU.DriverVersion(); err == nil {
		rec.DriverVersion = drv
	}
	if n == nil {
		n, _ = d.discover() // refreshes the GPU metrics too
	} else {
		d.showGPUs(n)
	}
	if n != nil {
		rec.Geometry = n.GeometryOf()
		for _, u := range n.Unusable { // NVML's entries, as the record has them
			rec.GPUsUnusable = append(rec.GPUsUnusable, record.UnusableGPU{Index: u.Index, Return: u.Return, Reason: u.Reason})
		}
	}
	return rec
}

// end hands the record of a change with the state label to the Cluster
// (the one caller of Cluster.Record) and posts the Event (none when evType
// is ""). The Cluster bounds the record, retries API errors and falls back
// to a shorter record or the state alone; what did not land is logged, and
// returned.
func (d *Daemon) end(ctx context.Context, node *Node, state string, rec record.ChangeRecord, evType, reason, msg string) error {
	if state != "" {
		d.showState(state)
	}
	ctx = context.WithoutCancel(ctx)
	err := d.Cluster.Record(ctx, rec, state)
	if err != nil {
		d.Log.Error("writing the change record failed", "config", rec.Config, "result", rec.Result, "err", err)
	}
	if evType != "" && (err == nil || state != record.StateSuccess) {
		// (A success whose record did not land is no success: its failure
		// posts the Event.)
		d.event(ctx, node, evType, reason, msg)
	}
	return err
}

// abandon undoes the side effects of a journaled change that will not be
// finished (the label moved on), so nothing stays paused or tainted.
//
// n is the pass's read of the GPUs for the record (nil: read them).
func (d *Daemon) abandon(ctx context.Context, ch *journal.Change, why string, n *gpus.Inventory) {
	d.Log.Info("abandoning unfinished change", "config", ch.Config, "why", why)
	d.restore(ctx, ch)
	d.Journal.State.Change, d.Journal.State.Handled = nil, ""
	d.saveJournal()
	// The trail shows the request that never finished, and why. The state
	// label is left to the request that follows.
	rec := stoppedRecord(d.record(ch, record.StateFailed, "abandoned: "+why, d.Clock.Now(), n), ch)
	// The state label stays as it is: it belongs to the request that follows.
	_ = d.end(ctx, nil, "", rec, EventNormal, record.ReasonAbandoned, fmt.Sprintf("abandoned MIG config %q: %s; GPUs %v changed, %d pods evicted",
		ch.Config, why, rec.GPUsChanged, len(rec.EvictedPods)))
	// Recorded, restored: its slot goes on only now, so that its record
	// ends before the next node's disruption begins.
	d.handOn(false)
}

// stoppedRecord is rec of a change stopped unfinished: one stopped before
// any GPU step (planned, never applied) lists no GPU as changed.
func stoppedRecord(rec record.ChangeRecord, ch *journal.Change) record.ChangeRecord {
	if !nvmlStarted(ch.Phase) {
		rec.GPUsChanged, rec.GPUsUntouched = []int{}, append(append([]int{}, ch.GPUsUntouched...), ch.GPUsChanged...)
		slices.Sort(rec.GPUsUntouched)
	}
	return rec
}

// handOn releases the slot of a superseded change (d.superseded), once
// that change is ended (handed on), or, keep, when it goes on (kept for its
// next attempt to take again).
func (d *Daemon) handOn(keep bool) {
	if s := d.superseded; s != nil {
		d.superseded = nil
		s.Release(keep)
	}
}
