package reconcile

import "context"

// What the core's external tests (package reconcile_test) drive that the
// package keeps to itself.

// Outcome is how a pass ended.
type Outcome = outcome

// The outcomes the tests expect.
const (
	OutSuccess   = outSuccess
	OutFailed    = outFailed
	OutRetry     = outRetry
	OutRebooting = outRebooting
)

// Pass runs one reconcile pass on the Node node gives (Daemon.pass).
func (d *Daemon) Pass(ctx context.Context, node func() (*Node, bool), start, retry bool) (Outcome, bool) {
	return d.pass(ctx, node, start, retry)
}

// Supersede is what the Node watch does on a label change.
func (d *Daemon) Supersede() { d.supersede() }

// OpenNVML opens NVML for a pass.
func (d *Daemon) OpenNVML() bool { return d.openNVML() }

// CheckDrift runs the drift check on node.
func (d *Daemon) CheckDrift(ctx context.Context, node *Node, seen bool) Outcome {
	return d.checkDrift(ctx, node, seen)
}

// BadMoves counts the moves between phases that journal.CanMove does not
// list.
func (d *Daemon) BadMoves() int64 { return d.badMoves.Load() }
