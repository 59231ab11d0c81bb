package reconcile

import (
	"context"

	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/record"
)

// sameNode checks that a journaled change is resumed on the Node object it
// started on. A Node deleted and created again (same name, new UID) is a
// new object: the taint and the paused operand labels were on the old one,
// and the new one shows nothing of the change. So the change takes the new
// Node as its own and goes through its disruption again: state pending,
// taint, pause, eviction (the evictions already made are kept).
func (d *Daemon) sameNode(ctx context.Context, node *Node, ch *journal.Change) {
	if node == nil {
		return
	}
	uid := string(node.UID)
	if ch.NodeUID == "" || ch.NodeUID == uid {
		ch.NodeUID = uid
		return
	}
	d.Log.Warn("the Node was deleted and created again mid-change; redoing its disruption on the new one",
		"config", ch.Config, "oldUID", ch.NodeUID, "newUID", uid, "phase", ch.Phase)
	ch.NodeUID, ch.TaintAdded, ch.Operands = uid, false, nil
	if ch.Phase == journal.PhaseDraining {
		d.advance(ch, journal.PhasePending)
	}
	d.saveJournal()
	if ch.Phase == journal.PhaseApplying || ch.Phase == journal.PhaseRestoring {
		d.setState(ctx, record.StatePending) // pending itself is set where it starts
	}
}
