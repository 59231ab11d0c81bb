package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/record"
)

// Run watches the node (or, standalone, holds the selected config) until
// ctx ends. It returns nil on shutdown and ErrExitAfterReboot after a
// simulated reboot.
func (d *Daemon) Run(ctx context.Context) error {
	if j := d.Journal.State; j.Applied != "" {
		d.report(func(s *Status) { s.AppliedConfig, s.AppliedHash = j.Applied, j.AppliedHash })
	}
	for range d.Journal.State.Reboots {
		d.Metrics.Rebooted()
	}
	if err := d.Journal.Probe(); err != nil {
		d.Log.Error("the journal cannot be written; no change will be made until it can", "path", d.Journal.Path(), "err", err)
	}
	if d.openNVML() {
		if n, err := d.discover(); err != nil {
			d.Log.Error("NVML is not answering; staying up, degraded", "err", err)
		} else {
			d.publish(ctx, n)
		}
		d.GPU.End()
	}
	d.api.Reachable, d.api.Probe, d.api.Clock, d.api.Log = d.Cluster.API().Reachable, d.Cluster.API().Probe, d.Clock, d.Log
	trigger := make(chan struct{}, 1)
	poke := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	w, err := d.Cluster.Watch(ctx, WatchHandlers{Changed: poke, Stale: d.supersede,
		Error: func(err error) { d.api.Set(true, err) }})
	if err != nil {
		return err
	}
	defer w.Stop()
	ready := func() {
		d.ready.Store(true)
		_ = d.notify().Ready()
	}
	if w.Sync == nil {
		// Nothing to watch (standalone): READY=1 is sent only once the
		// geometry is applied (or the first attempt failed, with the reason
		// in STATUS), so that units ordered after this one, the kubelet and
		// its device plugin, start on the right geometry.
		return d.loop(ctx, nil, w.Node, ready)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go d.api.Run(ctx)
	if !w.Sync(ctx) {
		return nil
	}
	ready()
	node, _ := w.Node()
	d.event(ctx, node, EventNormal, "MigAgentStarted", fmt.Sprintf("mig-agent %s started", d.Version))
	return d.loop(ctx, trigger, w.Node, nil)
}

// loop reconciles at start, on every trigger (the desired label changed),
// when a retry is due and on every drift tick, until ctx ends or an
// outcome ends the process. afterFirst runs once the first pass is done.
func (d *Daemon) loop(ctx context.Context, trigger <-chan struct{}, node func() (*Node, bool), afterFirst func()) error {
	drift := d.ticker(d.S.DriftInterval)
	var retry, reopen <-chan time.Time
	started := false // the first pass that saw our Node (it may appear later)
	pass := func(isRetry bool) outcome {
		oc, ran := d.pass(ctx, node, !started, isRetry)
		started = started || ran
		return oc
	}
	oc := pass(false)
	if afterFirst != nil && oc != outRebooted && oc != outParked {
		afterFirst()
	}
	for {
		switch oc {
		case outRebooted:
			return ErrExitAfterReboot
		case outParked:
			return nil
		case outRetry:
			retry = d.Clock.After(max(d.Journal.State.RetryAt.Sub(d.Clock.Now()), 0))
		case outNVMLDown:
			reopen = d.Clock.After(d.nvmlBackoff())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-trigger:
			if oc = pass(false); oc != outRetry {
				retry = nil // a new request supersedes the pending retry
			}
		case <-retry:
			retry = nil
			oc = pass(true)
		case <-reopen:
			reopen = nil
			oc = pass(false)
		case <-drift:
			if !d.openNVML() {
				oc = outNVMLDown
				break
			}
			n, seen := node()
			oc = d.checkDrift(ctx, n, seen)
			d.GPU.End()
		}
	}
}

// pass is one reconcile pass over the Node as the watch shows it (nil
// standalone), in its own NVML session; start is true for the first pass
// of the process. A newer desired config cancels it (supersede). ran is
// false when it did not get to reconcile (Node not seen, NVML down).
func (d *Daemon) pass(ctx context.Context, node func() (*Node, bool), start, retry bool) (oc outcome, ran bool) {
	// A newer desired config stops the pass from before the Node is read:
	// one seen after the read cancels it (its trigger is pending), none
	// falls between the read and the registration.
	pctx, cancel := context.WithCancelCause(ctx)
	d.setSupersede(func() { cancel(errSuperseded) })
	defer func() { d.setSupersede(nil); cancel(nil) }()
	d.nodeNow = node
	n, seen := node()
	if !seen {
		return outSuccess, false // our Node is not in the cache (yet)
	}
	if !d.openNVML() {
		return outNVMLDown, false
	}
	defer d.GPU.End()
	oc = d.reconcile(pctx, n, start, retry, nil)
	if oc == outSuccess {
		d.settleState(n)
		d.liftStartupTaints(ctx, n)
	}
	if oc == outParked && ctx.Err() == nil {
		d.Log.Info("a newer desired config supersedes the change in progress")
		return outSuccess, true // the trigger that cancelled it is pending
	}
	return oc, true
}

// liftStartupTaints removes the startup taints once the node holds what it
// asks (a request handled with success, or none), never while a change or
// its retry is pending; the Node's state label has the last word (Lift).
func (d *Daemon) liftStartupTaints(ctx context.Context, n *Node) {
	req := d.Cluster.Desired(n)
	if d.Startup == nil || d.lifted || !d.Journal.State.Converged(req.Config, req.Asked) {
		return
	}
	err := d.retryAPI(ctx, func() (err error) { d.lifted, err = d.Startup.Lift(ctx); return err })
	if err != nil && ctx.Err() == nil {
		d.Log.Error("removing the startup taints failed; retried at the next pass", "err", err)
	}
}

// setSupersede registers how to stop the pass in progress (nil: none).
func (d *Daemon) setSupersede(cancel context.CancelFunc) {
	d.mu.Lock()
	d.cancelPass = cancel
	d.mu.Unlock()
}

// errSuperseded is the cause of a pass stopped by supersede.
var errSuperseded = errors.New("a newer desired config supersedes the change in progress")

// supersede stops the pass in progress, if any, where it can stop safely
// (waiting for evictions or for a rollout slot); NVML steps run to the end.
func (d *Daemon) supersede() {
	d.mu.Lock()
	if d.cancelPass != nil {
		d.cancelPass()
	}
	d.mu.Unlock()
}

func (d *Daemon) ticker(every time.Duration) <-chan time.Time {
	if every <= 0 {
		return nil
	}
	return d.Clock.NewTicker(every).C()
}

// publish writes n's configs and GPUs to the node's ConfigMap (Cluster).
func (d *Daemon) publish(ctx context.Context, n *gpus.Inventory) {
	if err := d.retryAPI(ctx, func() error { return d.Cluster.PublishConfigs(ctx, n) }); err != nil {
		d.Log.Error("publishing the generated configs failed", "err", err)
	}
}

// redefined reports whether v plans the applied config with a definition
// other than the one applied (its hash differs from the journal's).
func (d *Daemon) redefined(v *view) bool {
	j := d.Journal.State
	return v != nil && v.config == j.Applied && j.AppliedHash != "" && v.plan.Hash != j.AppliedHash
}

// checkDrift compares the GPUs with the applied config and, with
// --reapply-on-drift, re-applies it once the Node was seen; it returns that
// attempt's outcome (outSuccess when there was nothing to do), for the
// caller's retry timer.
func (d *Daemon) checkDrift(ctx context.Context, node *Node, seen bool) outcome {
	j := d.Journal.State
	if j.Change != nil || j.Applied == "" || j.Applied != j.Handled {
		return outSuccess
	}
	d.reloadFile()
	n, err := d.discover()
	if err != nil {
		d.Log.Warn("drift check: NVML is not answering", "err", err)
		return outSuccess
	}
	d.publish(ctx, n)
	v, serr := d.look(n, j.Applied)
	if serr != nil {
		return outSuccess
	}
	plan := v.plan
	if d.redefined(v) {
		// The config file now defines the applied config otherwise: a new
		// request, whatever --reapply-on-drift says (that is for changes
		// made on the GPUs by hand).
		d.Log.Info("the applied config's definition changed; applying it as a new request",
			"config", j.Applied, "previousHash", j.AppliedHash, "hash", plan.Hash)
		d.Journal.State.Handled = ""
		if seen {
			return d.reconcile(ctx, node, false, true, v)
		}
		return outSuccess
	}
	drift := gpus.PlanChanges(plan)
	d.report(func(s *Status) { s.Drift = drift })
	if drift && !d.drifted {
		changed, _ := gpus.Indices(plan)
		msg := fmt.Sprintf("GPUs %v no longer match the applied config %q", changed, j.Applied)
		d.Log.Warn("geometry drift", "config", j.Applied, "gpus", changed)
		d.event(ctx, node, EventWarning, record.ReasonDrift, msg)
	}
	d.drifted = drift
	if drift && d.S.ReapplyOnDrift {
		d.Journal.State.Handled = ""
		if seen {
			return d.reconcile(ctx, node, false, true, v)
		}
	}
	return outSuccess
}
