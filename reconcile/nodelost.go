package reconcile

import (
	"context"
	"errors"
	"fmt"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/record"
)

// leaveIfLost ends a change parked because another agent took the node
// (the run's context ended with journal.ErrAnotherAgent): a failed record
// and a MigNodeLeaseLost Warning Event, nothing undone. The node is the
// other agent's: its change takes the taint and paused operands as its own
// and lifts them; the state label is left to it, and so is the record once
// it wrote one. The journal keeps the change, should the node come back.
func (d *Daemon) leaveIfLost(a *attempt, oc outcome) outcome {
	cause := context.Cause(a.ctx)
	if oc != outParked || a.node == nil || d.Journal.State.Change == nil || !errors.Is(cause, journal.ErrAnotherAgent) {
		return oc
	}
	reason := fmt.Sprintf("this agent no longer holds its node (%v): stopped in phase %s, before its next step; "+
		"its taint and paused operands are left to the agent that holds the node now", cause, a.ch.Phase)
	var n *gpus.Inventory // the GPUs as read, unless the apply step may have changed them
	if !a.touched {
		n = a.v.inventory()
	}
	rec := stoppedRecord(d.record(a.ch, record.StateFailed, reason, d.Clock.Now(), n), a.ch)
	d.Log.Error("mig config failed", "config", rec.Config, "reason", reason, "retry", false)
	d.report(func(s *Status) { s.LastFailure = reason })
	if other := d.recordedSince(a.ch); other != nil {
		d.Log.Error("not recording over a record of the agent that holds the node now", "theirs", other.Config, "result", other.Result)
		d.event(a.ctx, a.node, EventWarning, record.ReasonNodeLost, reason)
	} else {
		_ = d.end(a.ctx, a.node, "", rec, EventWarning, record.ReasonNodeLost, reason)
	}
	return oc
}

// recordedSince is the newest record on the Node, as the watch shows it,
// when another change wrote it after ch started (nil: none did).
func (d *Daemon) recordedSince(ch *journal.Change) *record.ChangeRecord {
	if d.nodeNow == nil {
		return nil
	}
	n, ok := d.nodeNow()
	if !ok || n == nil || len(n.History) == 0 {
		return nil
	}
	if r := n.History[0]; !r.StartedAt.Equal(ch.StartedAt) && r.FinishedAt.After(ch.StartedAt) {
		return &r
	}
	return nil
}
