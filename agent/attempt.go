package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/nvmlx"
)

// attempt runs (or resumes) the change to config desired, step by step,
// journaling each step before it starts.
func (d *Daemon) attempt(ctx context.Context, node *corev1.Node, desired string, req Request) outcome {
	j := &d.Journal.State
	ch := j.Change
	now := d.Clock.Now()
	if ch == nil {
		ch = &Change{Config: desired, PreviousConfig: j.Applied, RequestedBy: req.By, RequestedVia: req.Via, RequestedAt: req.At, StartedAt: now, Phase: PhasePending}
	} else {
		ch.Attempt++
		d.Log.Info("resuming change", "config", ch.Config, "phase", ch.Phase, "step", ch.Step)
	}
	fail := func(reason string, retryable bool, evReason string) outcome {
		if ctx.Err() != nil {
			// Shutting down (SIGTERM, perhaps the machine going down for the
			// reboot this change asked for) or a newer desired config is no
			// failure: the journal keeps the change; the next pass (or start)
			// resumes it, or undoes its pause and taint for the newer one.
			d.Log.Info("interrupted mid-change; the journal keeps it", "config", ch.Config, "phase", ch.Phase, "interrupted", reason)
			return outParked
		}
		if j.Change == nil {
			ch2 := *ch
			return d.failure(ctx, node, &ch2, reason, retryable, evReason)
		}
		return d.failure(ctx, node, ch, reason, retryable, evReason)
	}
	if desired == "" {
		return fail(fmt.Sprintf("the node label %s is set but empty: name a MIG config, or remove the label", LabelConfig), false, ReasonInvalid)
	}
	n, err := d.discover()
	if err != nil {
		return fail("reading the GPUs through NVML: "+err.Error(), true, ReasonFailed)
	}
	if d.fileErr != nil {
		return fail(d.fileErr.Error(), true, ReasonInvalid)
	}
	spec, source, err := Lookup(d.File, desired, n.GPUs)
	if err != nil {
		return fail(err.Error(), false, ReasonInvalid)
	}
	ch.Source = source
	d.noteUnusable(ctx, node, n)
	// GPUs NVML cannot open are left alone; a config naming them fails
	// with that reason, after the other GPUs got it (retried: a permission
	// or a lost GPU may come back).
	named := UnusableNamed(spec, desired, n.Unusable)
	reqs, _, err := spec.Resolve(desired, n.GPUs)
	if err != nil {
		if len(named) > 0 && errors.Is(err, geometry.ErrNoMatchingGPU) {
			return fail(unusableReason(desired, named, false), true, ReasonGPUUnusable)
		}
		return fail(err.Error(), false, ReasonInvalid)
	}
	plan, err := geometry.BuildPlan(spec, desired, n.GPUs)
	if err != nil {
		return fail(err.Error(), false, ReasonInvalid)
	}
	for _, w := range plan.Warnings {
		d.Log.Warn("config warning", "config", desired, "warning", w)
	}
	ch.Hash = plan.Hash
	if node != nil {
		if err := geometry.CheckStrategy(node.Labels[LabelStrategy], n.GPUs, reqs); err != nil {
			return fail(fmt.Sprintf("the node's MIG strategy %q cannot serve config %q: %v", node.Labels[LabelStrategy], desired, err), false, ReasonInvalid)
		}
		if d.OtherManager != nil {
			var other string
			// An API server away for a moment is no reason to fail.
			err := d.retryAPI(ctx, func() (err error) { other, err = d.OtherManager(ctx, node); return err })
			if err != nil {
				return fail("checking for another MIG manager: "+err.Error(), true, ReasonFailed)
			}
			if other != "" {
				if !d.S.AllowOtherMigManager {
					return fail("another MIG manager is at work on this node: "+other+" (disable it, or set --allow-other-mig-manager)", false, ReasonManagerConflict)
				}
				d.Log.Warn("another MIG manager is at work on this node; acting anyway (--allow-other-mig-manager)", "other", other)
			}
		}
	}
	if ch.Phase == PhaseRebooting {
		if d.BootID() != ch.RebootBootID {
			ch.Rebooted = true
			d.Log.Info("resuming after reboot", "config", desired)
		} else if planChanges(plan) {
			if !ch.RebootRequested && d.S.RebootMethod != RebootNone {
				// The agent stopped between journaling the reboot and asking
				// for it: no reboot happened on this boot, so asking now is
				// not a second one.
				d.Log.Warn("the reboot journaled for this change was never requested; requesting it now", "config", desired)
				return d.rebootFor(ctx, node, ch, &Applied{RebootGPUs: modeChangeGPUs(plan)})
			}
			d.Log.Info("waiting for the reboot requested for this change", "config", desired)
			d.setState(ctx, StateRebooting)
			_ = d.notify().Status("waiting for reboot")
			return outRebooting
		}
	}
	d.sameNode(ctx, node, ch)
	if ch.Phase == PhasePending {
		// Later phases keep what the change set out to do: a resumed plan
		// holds only what is left of it.
		ch.GPUsChanged, ch.GPUsUntouched = indices(plan)
	}
	if !planChanges(plan) && ch.Phase == PhasePending {
		// Already applied: success without touching a GPU or a pod.
		ch.GPUsChanged, ch.GPUsUntouched = []int{}, allIndices(plan)
		if len(named) > 0 {
			return d.partial(ctx, node, ch, plan, named)
		}
		return d.success(ctx, node, ch, plan, n, nil, "config already applied; nothing changed", ReasonUnchanged)
	}
	// Nothing is disrupted that cannot be recorded: the rights to write the
	// state, the record, the taint and Events are proven first.
	if err := d.preflight(ctx, node); err != nil {
		return fail(err.Error(), true, ReasonPreflight)
	}
	if ch.Phase == PhasePending {
		// The GPUs are no longer known to hold the handled config: whatever
		// the label says next, even that config again, is acted on.
		j.Change, j.Handled = ch, ""
		if err := d.mustJournal(); err != nil {
			j.Change = nil
			return fail(err.Error(), true, ReasonJournal)
		}
		d.setState(ctx, StatePending)
		d.event(ctx, node, corev1.EventTypeNormal, ReasonStarted, fmt.Sprintf("applying MIG config %q: GPUs %v change, %v untouched", desired, ch.GPUsChanged, ch.GPUsUntouched))
	}
	j.Change = ch
	if d.Slots != nil {
		_ = d.notify().Status("waiting for a rollout slot")
		release, err := d.Slots(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return outParked
			}
			return fail("taking a rollout slot: "+err.Error(), true, ReasonFailed)
		}
		defer release()
	}
	if ch.DisruptedAt == nil {
		at := d.Clock.Now().UTC()
		ch.DisruptedAt = &at
	}
	if d.Disrupt != nil && (ch.Phase == PhasePending || ch.Phase == PhaseDraining) {
		if oc, ok := d.drain(ctx, node, ch, n, plan); !ok {
			return oc
		}
	}
	if strays, err := d.strayProcesses(n, plan); err != nil {
		return fail("listing GPU processes: "+err.Error(), true, ReasonFailed)
	} else if len(strays) > 0 {
		return fail("processes no pod accounts for are using what the change takes away: "+strings.Join(strays, ", "), true, ReasonFailed)
	}
	if modeChanges(plan) && d.Units != nil && len(d.S.HostGPUClients) > 0 && len(ch.StoppedUnits) == 0 {
		_ = d.notify().Status("stopping host GPU clients %v", d.S.HostGPUClients)
		stopped, err := d.Units.StopActive(ctx, d.S.HostGPUClients)
		ch.StoppedUnits = stopped
		d.saveJournal()
		if err != nil {
			return fail("stopping host GPU clients: "+err.Error(), true, ReasonFailed)
		}
	}
	if d.Disrupt != nil && node != nil && d.S.RestartDevicePlugin && ch.Phase != PhaseApplying && ch.StalePlugins == nil {
		// The device plugin pods running now read the old geometry: the
		// ones still running when the change is done are restarted.
		var pods []string
		err := d.retryAPI(ctx, func() (err error) { pods, err = d.Disrupt.DevicePlugins(ctx); return err })
		if err != nil {
			return fail("listing the device plugin pods: "+err.Error(), true, ReasonFailed)
		}
		ch.StalePlugins = pods
	}
	ch.Phase = PhaseApplying
	if err := d.mustJournal(); err != nil {
		return fail(err.Error(), true, ReasonJournal)
	}
	var release func() error
	if d.Inhibit != nil {
		if r, err := d.Inhibit(ctx, "applying MIG geometry "+desired); err == nil {
			release = r
		} else {
			d.Log.Warn("taking a shutdown inhibitor failed", "err", err)
		}
	}
	opts := ApplyOptions{Step: func(gpu int, what string) error {
		ch.Step = fmt.Sprintf("GPU %d: %s", gpu, what)
		if err := d.mustJournal(); err != nil {
			return err
		}
		_ = d.notify().Status("%s", ch.Step)
		d.Log.Info("applying", "gpu", gpu, "step", what)
		return nil
	}}
	var applied *Applied
	if d.Hooks != nil {
		// Standalone (only there are hooks set): the hooks file runs around
		// the change as nvidia-mig-parted apply runs it; a failing hook
		// fails the change.
		env := HookEnv{ConfigFile: d.S.ConfigFile, SelectedConfig: desired, HooksFile: d.S.HooksFile}
		a := NewPlanApplier(d.GPU, d.File, desired, opts, n, plan)
		err = ApplyWithHooks(ctx, d.Log, d.Hooks, env, false, a)
		applied = &a.Result
	} else {
		applied, err = ApplyAndVerify(d.GPU, n, plan, d.File, desired, opts)
	}
	if release != nil {
		_ = release()
	}
	switch {
	case errors.Is(err, ErrRebootRequired):
		return d.rebootFor(ctx, node, ch, applied)
	case errors.Is(err, nvmlx.ErrNVMLNotBack):
		// NVML did not come back after a GPU reset: failed for now, not
		// ready, and NVML is opened again with its own backoff; the retry
		// reads the GPUs as the reset left them.
		oc := fail("applying: "+err.Error(), true, ReasonFailed)
		if oc == outRetry {
			d.nvmlLost(err)
			return outNVMLDown
		}
		return oc
	case err != nil:
		return fail("applying: "+err.Error(), true, ReasonFailed)
	}
	return d.finish(ctx, node, ch, plan, applied, named)
}

// partial ends a change whose GPUs hold the config, except those named
// that NVML cannot open: the change is done (journal, applied config), and
// its result is a failure with that reason, retried with backoff.
func (d *Daemon) partial(ctx context.Context, node *corev1.Node, ch *Change, plan *geometry.Plan, named []nvmlx.UnusableGPU) outcome {
	j := &d.Journal.State
	j.Change, j.Applied, j.AppliedHash = nil, ch.Config, plan.Hash
	j.RebootFor = nil // the change is done: its reboot mark with it
	d.Metrics.SetAppliedConfig(ch.Config, plan.Hash)
	return d.failure(ctx, node, ch, unusableReason(ch.Config, named, true), true, ReasonGPUUnusable)
}

func allIndices(p *geometry.Plan) []int {
	out := []int{}
	for _, g := range p.GPUs {
		out = append(out, g.Index)
	}
	return out
}

// drain taints the node, pauses operands and evicts the affected pods.
func (d *Daemon) drain(ctx context.Context, node *corev1.Node, ch *Change, n *Node, plan *geometry.Plan) (outcome, bool) {
	ch.Phase = PhaseDraining
	fail := func(reason string) (outcome, bool) {
		if ctx.Err() != nil {
			// A newer label (the pass logs it) or the process ending.
			if !errors.Is(context.Cause(ctx), errSuperseded) {
				d.Log.Info("shutting down mid-change; the journal resumes it at the next start", "config", ch.Config)
			}
			return outParked, false
		}
		return d.failure(ctx, node, ch, reason, true, ReasonFailed), false
	}
	if err := d.mustJournal(); err != nil {
		return d.failure(ctx, node, ch, err.Error(), true, ReasonJournal), false
	}
	if d.S.Taint && !ch.TaintAdded {
		err := d.retryAPI(ctx, func() error { _, err := d.Disrupt.Taint(ctx); return err })
		if err != nil {
			return fail("tainting the node: " + err.Error())
		}
		// The taint key is the agent's own: one already there was left by an
		// attempt that could not lift it (a crash between tainting and the
		// journal, an API outage), so this change lifts it too.
		ch.TaintAdded = true
		d.saveJournal()
	}
	if d.S.PauseGPUOperator {
		if len(ch.Operands) == 0 {
			saved, err := d.Disrupt.ReadOperands(ctx)
			if err != nil {
				return fail("reading GPU Operator operand labels: " + err.Error())
			}
			ch.Operands = saved
			d.saveJournal() // before pausing: a crash restores from here
		}
		if err := d.Disrupt.PauseOperands(ctx, ch.Operands); err != nil {
			return fail("pausing GPU Operator operands: " + err.Error())
		}
	}
	gpus, migs := targets(n, plan)
	var pods []string
	var how string
	err := d.retryAPI(ctx, func() (err error) { pods, how, err = d.Disrupt.Affected(ctx, gpus, migs); return err })
	if err != nil {
		return fail("finding the pods that use the changing GPUs: " + err.Error())
	}
	ch.AffectedBy = how
	if how != "" && how != drain.HowNothing { // standalone: no Kubernetes, no PodResources
		d.Metrics.SetCollectorError("pod-resources", strings.HasPrefix(how, drain.HowAllGPUPodsPrefix))
	}
	if len(pods) > 0 {
		msg := fmt.Sprintf("evicting %d pods on GPUs %v: %s", len(pods), ch.GPUsChanged, strings.Join(pods, ", "))
		_ = d.notify().Status("%s", msg)
		d.event(ctx, node, corev1.EventTypeNormal, ReasonEvicting, msg)
		evicted, err := d.evict(ctx, pods)
		ch.Evicted = appendNew(ch.Evicted, evicted...)
		d.Metrics.AddEvictedPods(len(evicted))
		d.saveJournal()
		if err != nil {
			return fail("evicting pods: " + err.Error())
		}
	}
	return 0, true
}

func appendNew(s []string, more ...string) []string {
	for _, m := range more {
		found := false
		for _, x := range s {
			if x == m {
				found = true
				break
			}
		}
		if !found {
			s = append(s, m)
		}
	}
	return s
}

// rebootFor handles a mode change that waits for a reboot: once, never twice.
func (d *Daemon) rebootFor(ctx context.Context, node *corev1.Node, ch *Change, applied *Applied) outcome {
	spent, sameBoot, how := d.rebootSpent(node, ch.Config)
	if ch.Rebooted || (spent && !sameBoot) {
		// Whatever happened in between (a failure, a restart, a lost
		// journal): one reboot per requested change.
		if !ch.Rebooted {
			d.Log.Warn("a reboot was already made for this change; not rebooting again", "config", ch.Config, "from", how)
		}
		ch.Rebooted = true
		d.Metrics.SetRebootGuardTripped(true)
		return d.failure(ctx, node, ch, fmt.Sprintf("MIG mode change on GPUs %v is still pending after the reboot made for it; not rebooting again", applied.RebootGPUs), false, ReasonRebootFailed)
	}
	// Why no GPU reset applied the mode change (empty for a reboot planned
	// before any apply, whose GPUs were never offered a reset).
	why := ""
	if len(applied.NoReset) > 0 {
		why = "no GPU reset: " + noResetReason(applied.RebootGPUs, applied.NoReset)
		d.Log.Info("MIG mode change needs a reboot", "gpus", applied.RebootGPUs, "why", why)
	}
	ch.Phase, ch.RebootBootID = PhaseRebooting, d.BootID()
	if spent {
		// Asked for on this boot already (the journal says so): wait for it.
		ch.RebootRequested = true
		d.saveJournal()
		d.Log.Info("waiting for the reboot requested for this change", "config", ch.Config)
		d.setState(ctx, StateRebooting)
		_ = d.notify().Status("waiting for reboot")
		return outRebooting
	}
	// The mark is journaled before the reboot is asked for: a journal that
	// cannot be written means no reboot (it could not be remembered).
	d.Journal.State.RebootFor = &RebootMark{Config: ch.Config, BootID: ch.RebootBootID, At: d.Clock.Now().UTC()}
	if err := d.mustJournal(); err != nil {
		d.Journal.State.RebootFor = nil
		return d.failure(ctx, node, ch, "not rebooting: "+err.Error(), true, ReasonRebootFailed)
	}
	if d.S.RebootMethod == RebootNone {
		d.Journal.State.RebootFor.Requested = true
		d.saveJournal()
		d.holdSlotForReboot(ctx)
		rec := d.record(ch, StateRebooting, why, d.Clock.Now(), applied.Node)
		d.emit(ctx, node, StateRebooting, rec, corev1.EventTypeNormal, ReasonRebooting,
			fmt.Sprintf("MIG mode change on GPUs %v needs a reboot; --reboot-method none: waiting for someone to reboot the node", applied.RebootGPUs))
		_ = d.notify().Status("waiting for reboot")
		return outRebooting
	}
	d.holdSlotForReboot(ctx)
	rec := d.record(ch, StateRebooting, why, d.Clock.Now(), applied.Node)
	d.emit(ctx, node, StateRebooting, rec, corev1.EventTypeNormal, ReasonRebooting,
		fmt.Sprintf("MIG mode change on GPUs %v needs a reboot; rebooting through %s", applied.RebootGPUs, d.S.RebootMethod))
	d.Metrics.IncReboots()
	_ = d.notify().Status("rebooting for the MIG mode change on GPUs %v", applied.RebootGPUs)
	// The request is not cancelled by a newer label or a shutdown: it is
	// journaled as made, and made at most once.
	if err := d.Reboot.Reboot(context.WithoutCancel(ctx), "mig-agent: MIG mode change of config "+ch.Config); err != nil {
		// Never retried by itself: a reboot is requested at most once.
		return d.failure(ctx, node, ch, "requesting the reboot failed: "+err.Error(), false, ReasonRebootFailed)
	}
	ch.RebootRequested = true
	d.Journal.State.RebootFor.Requested = true
	d.Journal.State.Reboots++ // counted once it was asked for: see Run
	d.saveJournal()
	if d.S.RebootMethod == RebootSim {
		return outRebooted
	}
	return outRebooting
}

// modeChangeGPUs lists the GPUs whose MIG mode the plan changes.
func modeChangeGPUs(p *geometry.Plan) []int {
	var out []int
	for _, g := range p.GPUs {
		if g.ModeChange != geometry.ModeNone {
			out = append(out, g.Index)
		}
	}
	return out
}

// holdSlotForReboot keeps the rollout slot through the reboot: a node that
// goes down for its change is disrupted until it is back, so its slot must
// not pass to another node meanwhile (--max-concurrent).
func (d *Daemon) holdSlotForReboot(ctx context.Context) {
	if d.SlotReboot == nil {
		return
	}
	if err := d.SlotReboot(context.WithoutCancel(ctx)); err != nil {
		d.Log.Warn("keeping the rollout slot through the reboot failed; it expires after the lease duration", "err", err)
	}
}

// finish restores, refreshes the device plugin, waits for resources, and
// records success.
func (d *Daemon) finish(ctx context.Context, node *corev1.Node, ch *Change, plan *geometry.Plan, applied *Applied, named []nvmlx.UnusableGPU) outcome {
	ch.Phase = PhaseRestoring
	d.saveJournal()
	d.restore(ctx, ch)
	converged, failed := d.refresh(ctx, node, ch, applied.Node)
	if failed != "" {
		if ctx.Err() != nil {
			d.Log.Info("interrupted while refreshing the device plugin; the journal keeps the change", "config", ch.Config)
			return outParked
		}
		return d.failure(ctx, node, ch, failed, true, ReasonResourcesTimeout)
	}
	if len(named) > 0 {
		return d.partial(ctx, node, ch, plan, named)
	}
	msg := fmt.Sprintf("MIG config %q applied: GPUs %v changed, %v untouched, %d pods evicted", ch.Config, ch.GPUsChanged, ch.GPUsUntouched, len(ch.Evicted))
	return d.success(ctx, node, ch, plan, applied.Node, converged, msg, ReasonApplied)
}

// refresh makes the device plugin see the new MIG devices (it reads them
// only when it starts: its pods that read the old geometry are restarted)
// and waits up to --resource-wait-timeout until the Node's allocatable shows
// exactly the new geometry's resources. It returns whether they converged
// (nil: not awaited) or, when they did not, the failure reason: the change
// stays journaled, and its retry restarts the device plugin again.
func (d *Daemon) refresh(ctx context.Context, node *corev1.Node, ch *Change, n *Node) (converged *bool, failed string) {
	if d.Disrupt == nil || node == nil || len(ch.GPUsChanged) == 0 {
		return nil, ""
	}
	ch.Phase = PhaseRefreshing
	d.saveJournal()
	if d.S.RestartDevicePlugin && len(ch.StalePlugins) > 0 {
		_ = d.notify().Status("restarting the device plugin")
		var restarted []string
		err := d.retryAPI(ctx, func() (err error) { restarted, err = d.Disrupt.RestartDevicePlugins(ctx, ch.StalePlugins); return err })
		if err != nil {
			return nil, "restarting the device plugin: " + err.Error()
		}
		ch.StalePlugins = nil
		d.saveJournal()
		if len(restarted) > 0 {
			d.event(ctx, node, corev1.EventTypeNormal, ReasonDevicePluginRestarted,
				fmt.Sprintf("restarted %s so that they advertise the new MIG devices", strings.Join(restarted, ", ")))
		}
	}
	if d.S.ResourceWaitTimeout <= 0 {
		return nil, ""
	}
	want, err := ExpectedResources(node.Labels[LabelStrategy], n)
	if err != nil {
		d.Log.Warn("computing the expected resources failed; not waiting for them", "err", err)
		return nil, ""
	}
	_ = d.notify().Status("waiting for the device plugin to advertise the new resources")
	ok, err := d.Disrupt.WaitResources(ctx, want, d.S.ResourceWaitTimeout)
	d.Metrics.SetResourcesConverged(ok)
	if ok {
		return &ok, ""
	}
	if ctx.Err() != nil {
		return &ok, "interrupted"
	}
	// Whatever runs now did not advertise the geometry: the retry
	// restarts it again.
	if pods, lerr := d.Disrupt.DevicePlugins(ctx); lerr == nil {
		ch.StalePlugins = pods
	}
	d.saveJournal()
	return &ok, fmt.Sprintf("the GPUs hold config %q, but the Node's allocatable did not show exactly its resources within %s "+
		"(is the device plugin running on this node?): %v", ch.Config, d.S.ResourceWaitTimeout, err)
}

func (d *Daemon) success(ctx context.Context, node *corev1.Node, ch *Change, plan *geometry.Plan, n *Node, converged *bool, msg, reason string) outcome {
	now := d.Clock.Now()
	rec := d.record(ch, StateSuccess, "", now, n)
	rec.ResourcesConverged = converged
	// Metrics first: whoever sees the state label finds them current.
	d.Metrics.ObserveReconfiguration(StateSuccess, now.Sub(ch.StartedAt))
	d.Metrics.SetAppliedConfig(ch.Config, plan.Hash)
	d.Metrics.SetLastSuccess(now)
	d.Metrics.SetDrift(false)
	d.Metrics.SetRebootGuardTripped(false)
	d.Metrics.SetLastFailure("")
	d.emit(ctx, node, StateSuccess, rec, corev1.EventTypeNormal, reason, msg)
	d.drifted = false
	j := &d.Journal.State
	j.Change = nil
	j.Succeeded(ch.Config, plan.Hash)
	j.RebootFor = nil // the change is done: its reboot mark with it
	d.saveJournal()
	d.Log.Info("mig config applied", "config", ch.Config, "gpusChanged", ch.GPUsChanged, "evicted", len(ch.Evicted))
	_ = d.notify().Status("config %s applied", ch.Config)
	return outSuccess
}
