package reconcile

import (
	"slices"

	"github.com/migagent/mig-agent/journal"
)

// The change as a state machine: every move between the phases of a
// journaled change, in one place. A step moves the change with advance
// (journaled by the step right after); a move not listed here is a bug,
// logged and counted (the core tests fail on any).
//
//	pending ──► draining ──► applying ──► restoring ──► refreshing ──► (done)
//	   │           │  ▲          │  ▲          │              │
//	   │           ▼  │          ▼  │          └──► applying ◄┘  (a resumed change
//	   │        pending │     rebooting             re-applies: idempotent)
//	   └──────────────► applying (standalone: nothing to drain)
//	                     rebooting ──► draining (rebooted, then failed: drained again)
var moves = map[journal.Phase][]journal.Phase{
	// Standalone has nothing to drain: pending goes straight to applying.
	journal.PhasePending: {journal.PhaseDraining, journal.PhaseApplying},
	// The Node deleted and created again mid-drain: drained again from
	// pending (nodeuid.go).
	journal.PhaseDraining: {journal.PhaseDraining, journal.PhaseApplying, journal.PhasePending},
	// A mode change no GPU reset applied waits for a reboot (reboot.go); a
	// CDI refresh that failed after the GPUs changed is retried from
	// refreshing (cdi.go).
	journal.PhaseApplying: {journal.PhaseApplying, journal.PhaseRebooting, journal.PhaseRestoring, journal.PhaseRefreshing},
	// After the reboot the change applies on; a failure after it drains
	// again (the reboot lifted nothing, restore lifts the taint).
	journal.PhaseRebooting: {journal.PhaseRebooting, journal.PhaseApplying, journal.PhaseDraining},
	journal.PhaseRestoring: {journal.PhaseRestoring, journal.PhaseRefreshing, journal.PhaseApplying},
	// The device plugin's resources never showed: the retry re-applies
	// (nothing left to do on the GPUs) and refreshes again.
	journal.PhaseRefreshing: {journal.PhaseRefreshing, journal.PhaseApplying},
}

// canMove reports whether a change may move from one phase to another.
func canMove(from, to journal.Phase) bool {
	return slices.Contains(moves[from], to)
}

// advance moves ch to phase to.
func (d *Daemon) advance(ch *journal.Change, to journal.Phase) {
	if !canMove(ch.Phase, to) {
		d.badMoves.Add(1)
		d.Log.Error("a change moved between phases the state machine does not list; please report it",
			"config", ch.Config, "from", ch.Phase, "to", to)
	}
	ch.Phase = to
}
