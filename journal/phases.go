package journal

import "slices"

// The change as a state machine: every move between the phases of a
// journaled change, in one place. The agent moves a change step by step
// and checks each move here; a move not listed is a bug (it logs and
// counts it, and its core tests fail on any).
//
//	pending ──► draining ──► applying ──► restoring ──► refreshing ──► (done)
//	   │           │  ▲          │  ▲          │              │
//	   │           ▼  │          ▼  │          └──► applying ◄┘  (a resumed change
//	   │        pending │     rebooting             re-applies: idempotent)
//	   └──────────────► applying (standalone: nothing to drain)
//	                     rebooting ──► draining (rebooted, then failed: drained again)
var moves = map[Phase][]Phase{
	// Standalone has nothing to drain: pending goes straight to applying.
	PhasePending: {PhaseDraining, PhaseApplying},
	// The Node deleted and created again mid-drain: drained again from
	// pending.
	PhaseDraining: {PhaseDraining, PhaseApplying, PhasePending},
	// A mode change no GPU reset applied waits for a reboot; a CDI
	// refresh that failed after the GPUs changed is retried from
	// refreshing.
	PhaseApplying: {PhaseApplying, PhaseRebooting, PhaseRestoring, PhaseRefreshing},
	// After the reboot the change applies on; a failure after it drains
	// again (the reboot lifted nothing, restore lifts the taint).
	PhaseRebooting: {PhaseRebooting, PhaseApplying, PhaseDraining},
	PhaseRestoring: {PhaseRestoring, PhaseRefreshing, PhaseApplying},
	// The device plugin's resources never showed: the retry re-applies
	// (nothing left to do on the GPUs) and refreshes again.
	PhaseRefreshing: {PhaseRefreshing, PhaseApplying},
}

// CanMove reports whether a change may move from one phase to another.
func CanMove(from, to Phase) bool {
	return slices.Contains(moves[from], to)
}
