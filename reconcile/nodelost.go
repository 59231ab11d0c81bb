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
// (its node Lease: the run's context ends with journal.ErrAnotherAgent as
// its cause): a failed record and a MigNodeLeaseLost Warning Event, and
// nothing undone. The node is the other agent's now: the taint and paused
// operands stay for its change, which takes them as its own (the taint key
// is the agents' one; a paused operand reads back as enabled) and lifts
// them at its end; the state label is left to it too, and so is the record
// once it wrote one since this change started. The journal keeps the
// change, for this agent should it hold the node again.
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
	rec := d.record(a.ch, record.StateFailed, reason, d.Clock.Now(), n)
	if other := d.recordedSince(a.ch); other != nil {
		d.Log.Error("node lost mid-change; not recording over the record of the agent that holds the node now",
			"config", a.ch.Config, "reason", reason, "theirs", other.Config, "theirResult", other.Result)
		d.event(a.ctx, a.node, EventWarning, record.ReasonNodeLost, reason)
		return oc
	}
	d.Log.Error("mig config failed", "config", rec.Config, "reason", reason, "retry", false)
	d.Metrics.SetLastFailure(reason)
	_ = d.end(a.ctx, a.node, "", rec, EventWarning, record.ReasonNodeLost, reason)
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
