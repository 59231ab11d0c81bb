package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/migagent/mig-agent/geometry"
)

// Run watches the node (or, standalone, holds the selected config) until
// ctx ends. It returns nil on shutdown and ErrExitAfterReboot after a
// simulated reboot.
func (d *Daemon) Run(ctx context.Context) error {
	if j := d.Journal.State; j.Applied != "" {
		d.Metrics.SetAppliedConfig(j.Applied, j.AppliedHash)
	}
	for range d.Journal.State.Reboots {
		d.Metrics.IncReboots()
	}
	if err := d.Journal.Probe(); err != nil {
		d.Log.Error("the journal cannot be written; no change will be made until it can", "path", d.Journal.Path(), "err", err)
		d.setJournalErr(err)
	}
	if d.openNVML() {
		if n, err := d.discover(); err != nil {
			d.Log.Error("NVML is not answering; staying up, degraded", "err", err)
		} else if d.Kube != nil {
			d.publish(ctx, n)
		}
		d.GPU.End()
	}
	if d.Kube == nil {
		return d.runStandalone(ctx)
	}
	trigger := make(chan struct{}, 1)
	poke := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(d.Kube.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", d.Kube.Node).String()
		}))
	inf := factory.Core().V1().Nodes()
	lister := inf.Lister()
	_, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { poke() },
		// The Node is gone: a change still draining stops where it safely
		// can; the journal keeps it for the Node created again (nodeuid.go).
		DeleteFunc: func(any) { d.supersede() },
		UpdateFunc: func(oldObj, newObj any) {
			o, n := oldObj.(*corev1.Node), newObj.(*corev1.Node)
			if o.Labels[LabelConfig] != n.Labels[LabelConfig] {
				// Never keep acting on a stale value: a change still
				// draining for the old one stops.
				d.supersede()
			}
			if o.Labels[LabelConfig] != n.Labels[LabelConfig] || o.Labels[LabelStrategy] != n.Labels[LabelStrategy] {
				poke()
			}
		},
	})
	if err != nil {
		return err
	}
	// Returning (a simulated reboot, a parked change) must stop the informer
	// before Shutdown waits for it, or the process never exits.
	ctx, cancel := context.WithCancel(ctx)
	if err := d.watchAPIHealth(ctx, inf.Informer()); err != nil {
		cancel()
		return err
	}
	factory.Start(ctx.Done())
	defer func() {
		cancel()
		factory.Shutdown()
	}()
	d.Log.Info("watching node", "node", d.Kube.Node)
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return nil
	}
	d.ready.Store(true)
	_ = d.notify().Ready()
	d.event(ctx, d.node(lister), corev1.EventTypeNormal, "MigAgentStarted", fmt.Sprintf("mig-agent %s started", d.Version))
	return d.loop(ctx, trigger, func() *corev1.Node { return d.node(lister) }, nil)
}

// loop reconciles at start, on every trigger (the desired label changed),
// when a retry is due and on every drift tick, until ctx ends or an
// outcome ends the process. afterFirst runs once the first pass is done.
func (d *Daemon) loop(ctx context.Context, trigger <-chan struct{}, node func() *corev1.Node, afterFirst func()) error {
	drift := d.ticker(d.S.DriftInterval)
	var retry, reopen <-chan time.Time
	started := false // the first pass that saw our Node (it may appear later)
	pass := func(n *corev1.Node, isRetry bool) outcome {
		if d.Kube != nil && n == nil {
			return outSuccess // our Node is not in the cache (yet)
		}
		if !d.openNVML() {
			return outNVMLDown
		}
		defer d.GPU.End()
		start := !started
		started = true
		pctx, cancel := context.WithCancelCause(ctx)
		d.setSupersede(func() { cancel(errSuperseded) })
		defer func() { d.setSupersede(nil); cancel(nil) }()
		oc := d.reconcile(pctx, n, start, isRetry)
		if oc == outSuccess {
			d.settleState(n)
		}
		if oc == outParked && ctx.Err() == nil {
			d.Log.Info("a newer desired config supersedes the change in progress")
			return outSuccess // the trigger that cancelled it is pending
		}
		return oc
	}
	oc := pass(node(), false)
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
			retry = d.Clock.After(max(d.retryAt.Sub(d.Clock.Now()), 0))
		case outNVMLDown:
			reopen = d.Clock.After(d.nvmlBackoff())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-trigger:
			if oc = pass(node(), false); oc != outRetry {
				retry = nil // a new request supersedes the pending retry
			}
		case <-retry:
			retry = nil
			oc = pass(node(), true)
		case <-reopen:
			reopen = nil
			oc = pass(node(), false)
		case <-drift:
			if !d.openNVML() {
				oc = outNVMLDown
				break
			}
			oc = d.checkDrift(ctx, node())
			d.GPU.End()
		}
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

func (d *Daemon) node(l interface {
	Get(string) (*corev1.Node, error)
}) *corev1.Node {
	n, err := l.Get(d.Kube.Node)
	if err != nil {
		return nil
	}
	return n
}

func (d *Daemon) ticker(every time.Duration) <-chan time.Time {
	if every <= 0 {
		return nil
	}
	return d.Clock.NewTicker(every).C()
}

// publish writes the generated configs to the node's ConfigMap, at start
// and whenever discovery changes what they hold.
func (d *Daemon) publish(ctx context.Context, n *Node) {
	cfg, err := geometry.Generate(n.GPUs).Marshal()
	if err != nil {
		d.Log.Error("generating configs failed", "err", err)
		return
	}
	if string(cfg) == d.published {
		return
	}
	err = d.retryAPI(ctx, func() error {
		node, err := d.Kube.GetNode(ctx)
		if err != nil {
			return err
		}
		return d.Kube.PublishConfigs(ctx, node, string(cfg))
	})
	if err != nil {
		d.Log.Error("publishing the generated configs failed", "err", err)
		return
	}
	d.published = string(cfg)
}

// checkDrift compares the GPUs with the applied config and, with
// --reapply-on-drift, re-applies it; it returns that attempt's outcome
// (outSuccess when there was nothing to do), for the caller's retry timer.
func (d *Daemon) checkDrift(ctx context.Context, node *corev1.Node) outcome {
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
	if d.Kube != nil {
		d.publish(ctx, n)
	}
	plan, err := d.plan(n, j.Applied)
	if err != nil {
		return outSuccess
	}
	drift := planChanges(plan)
	d.Metrics.SetDrift(drift)
	if drift && !d.drifted {
		changed, _ := indices(plan)
		msg := fmt.Sprintf("GPUs %v no longer match the applied config %q", changed, j.Applied)
		d.Log.Warn("geometry drift", "config", j.Applied, "gpus", changed)
		d.event(ctx, node, corev1.EventTypeWarning, ReasonDrift, msg)
	}
	d.drifted = drift
	if drift && d.S.ReapplyOnDrift {
		d.Journal.State.Handled = ""
		if node != nil || d.Kube == nil {
			return d.reconcile(ctx, node, false, true)
		}
	}
	return outSuccess
}

// runStandalone applies the selected config and holds it. READY=1 is sent
// only once the geometry is applied (or the first attempt failed, with the
// reason in STATUS): units ordered after this one, the kubelet and its
// device plugin, start on the right geometry.
func (d *Daemon) runStandalone(ctx context.Context) error {
	return d.loop(ctx, nil, func() *corev1.Node { return nil }, func() {
		d.ready.Store(true)
		_ = d.notify().Ready()
	})
}
