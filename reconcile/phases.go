package reconcile

import "github.com/migagent/mig-agent/journal"

// advance moves ch to phase to. A move the journal's state machine does
// not list (journal.CanMove) is a bug: logged and counted.
func (d *Daemon) advance(ch *journal.Change, to journal.Phase) {
	if !journal.CanMove(ch.Phase, to) {
		d.badMoves.Add(1)
		d.Log.Error("a change moved between phases the state machine does not list; please report it",
			"config", ch.Config, "from", ch.Phase, "to", to)
	}
	ch.Phase = to
}
