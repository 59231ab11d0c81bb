package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/internal/readonce"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/record"
)

// A pass that acts runs the change as a checklist (attempt): named steps
// in order, each journaled before it touches anything. A step passes
// (nil), fails the change (a *StepError: the reason recorded, whether a
// retry may pass it, the Event), or ends the pass without a failure (an
// endPass: applied, waiting for a reboot, interrupted); conclude turns what
// the checklist ended with into the pass's outcome, in one place.

// StepError is why a step failed the change.
type StepError struct {
	// Reason is recorded, posted as the Event's message and logged.
	Reason string
	// Retryable: the cause may pass; the change is retried with backoff.
	// Otherwise it waits for the next request.
	Retryable bool
	// Event is the Event reason (record.ReasonFailed, record.ReasonInvalid, ...).
	Event string
	// Always: a failure also when the pass is interrupted (a reboot
	// decision, which must not be made again by a resumed pass).
	Always bool
	// Err is the cause, when an error is (errors.Is sees through).
	Err error
}

func (e *StepError) Error() string { return e.Reason }
func (e *StepError) Unwrap() error { return e.Err }

// invalid: the request cannot be served as it is; not retried.
func invalid(format string, a ...any) *StepError {
	return &StepError{Reason: fmt.Sprintf(format, a...), Event: record.ReasonInvalid}
}

// retryable: what may pass (an NVML error, an API server away); retried.
func retryable(what string, err error) *StepError {
	return &StepError{Reason: what + ": " + err.Error(), Retryable: true, Event: record.ReasonFailed, Err: err}
}

// endPass ends the checklist without a failure, with this outcome.
type endPass outcome

func (e endPass) Error() string { return fmt.Sprintf("pass ended with outcome %d", int(e)) }

// view is what one pass knows of the GPUs and the desired config: the GPUs
// read once, the config looked up once and planned once.
type view struct {
	config string
	n      *gpus.Inventory
	spec   *geometry.Spec
	source string
	reqs   []geometry.Request
	plan   *geometry.Plan
	// named are the GPUs NVML cannot open that the config names: they are
	// left alone, and the change fails with that reason once the other
	// GPUs hold the config.
	named []nvmlx.UnusableGPU
}

// inventory is the pass's read of the GPUs (nil when it has none yet).
func (v *view) inventory() *gpus.Inventory {
	if v == nil {
		return nil
	}
	return v.n
}

// look looks config up and plans it on the GPUs as read (n).
func (d *Daemon) look(n *gpus.Inventory, config string) (*view, *StepError) {
	spec, source, err := gpus.Lookup(d.File, config, n.GPUs)
	if err != nil {
		return nil, invalid("%s", err)
	}
	// GPUs NVML cannot open are left alone; a config naming them fails
	// with that reason, after the other GPUs got it (retried: a permission
	// or a lost GPU may come back).
	named := gpus.UnusableNamed(spec, config, n.Unusable)
	reqs, _, err := spec.Resolve(config, n.GPUs)
	if err != nil {
		if len(named) > 0 && errors.Is(err, geometry.ErrNoMatchingGPU) {
			return nil, &StepError{Reason: gpus.UnusableReason(config, named, false), Retryable: true, Event: record.ReasonGPUUnusable}
		}
		return nil, invalid("%s", err)
	}
	plan, err := geometry.BuildPlan(spec, config, n.GPUs)
	if err != nil {
		return nil, invalid("%s", err)
	}
	return &view{config: config, n: n, spec: spec, source: source, reqs: reqs, plan: plan, named: named}, nil
}

// attempt is one run of the checklist for the change in progress.
type attempt struct {
	d        *Daemon
	ctx      context.Context
	checkCtx context.Context // ctx for the checks before the change: they share their reads (readonce)
	node     *Node           // nil standalone
	ch       *journal.Change
	v        *view         // nil until the plan step (or handed in by the pass)
	applied  *gpus.Applied // what the apply step did
	slot     Slot          // the rollout slot taken (nil: none)
	touched  bool          // the apply step began: the GPUs may have changed
	// plugins brings the device plugin list started beside the drain
	// (nil: none started).
	plugins chan pluginList
	// announced: checkNode set the state pending.
	announced bool
}

// pluginList is what listing the device plugins returned.
type pluginList struct {
	pods []string
	err  error
}

// attempt runs (or resumes) the change to req's config; v is what the pass
// already read and planned for it (nil: read and plan now).
func (d *Daemon) attempt(ctx context.Context, node *Node, req Request, v *view) (oc outcome) {
	j := &d.Journal.State
	ch := j.Change
	if ch == nil {
		ch = &journal.Change{Config: req.Config, PreviousConfig: j.Applied, PreviousHash: j.AppliedHash, RequestedBy: req.By, RequestedVia: req.Via, RequestedBySource: req.Source,
			RequestedAt: req.At, StartedAt: d.Clock.Now(), Phase: journal.PhasePending}
	} else {
		ch.Attempt++
		d.Log.Info("resuming change", "config", ch.Config, "phase", ch.Phase, "step", ch.Step)
	}
	if v != nil && v.config != req.Config {
		v = nil
	}
	a := &attempt{d: d, ctx: ctx, checkCtx: readonce.With(ctx), node: node, ch: ch, v: v}
	defer func() {
		// The slot is held until the outcome is recorded (a failure
		// restores the node first). A change parked by a shutdown keeps it,
		// as a reboot does: its node is disrupted until the agent, back,
		// ends it. A superseded one keeps it until the next pass has ended
		// it (abandon, handOn).
		switch {
		case a.slot == nil:
		case oc == outParked && errors.Is(context.Cause(ctx), errSuperseded):
			d.superseded = a.slot
		default:
			a.slot.Release(oc == outParked)
		}
	}()
	return d.leaveIfLost(a, d.conclude(a, a.run()))
}

// run is the checklist. Each step's time is logged at debug level ("step
// done"), which the bench reads to break a change's latency down.
func (a *attempt) run() error {
	for _, step := range []struct {
		name string
		do   func() error
	}{
		{"plan", a.plan},                           // read the GPUs, look the config up, build the plan
		{"checkNode", a.checkNode},                 // the MIG strategy can serve it; no other MIG manager
		{"awaitReboot", a.awaitReboot},             // a change waiting for its reboot waits on
		{"begin", a.begin},                         // nothing to do, or the intent journaled and announced
		{"takeSlot", a.takeSlot},                   // a rollout slot (--max-concurrent)
		{"drain", a.drain},                         // new clients kept off, operands paused, the clients of what changes evicted
		{"checkProcesses", a.checkProcesses},       // nothing else uses what the change takes away
		{"stopHostClients", a.stopHostClients},     // host GPU clients stopped for a mode change
		{"noteDevicePlugins", a.noteDevicePlugins}, // the device plugins that read the old geometry
		{"apply", a.apply},                         // NVML, step by step
		{"refreshCDI", a.refreshCDI},               // device nodes and CDI specs where CDI is in use
		{"finish", a.finish},                       // restore, refresh the device plugin, record success
	} {
		began := a.d.Clock.Now()
		err := step.do()
		a.d.Log.Debug("step done", "step", step.name, "ms", float64(a.d.Clock.Since(began).Microseconds())/1000)
		if err != nil {
			return err
		}
	}
	return nil
}

// conclude turns what the checklist ended with into the pass's outcome:
// the one place where a failure becomes a record, an Event and a retry.
func (d *Daemon) conclude(a *attempt, err error) outcome {
	var end endPass
	if errors.As(err, &end) {
		return outcome(end)
	}
	if err == nil {
		return outSuccess // the last step ends the pass; not reached
	}
	var se *StepError
	if !errors.As(err, &se) {
		se = &StepError{Reason: err.Error(), Retryable: true, Event: record.ReasonFailed}
	}
	if a.ctx.Err() != nil && !se.Always {
		// Shutting down (SIGTERM, perhaps the machine going down for the
		// reboot this change asked for) or a newer desired config is no
		// failure: the journal keeps the change; the next pass (or start)
		// resumes it, or undoes its disruption for the newer one.
		// A newer label is logged by the pass.
		if !errors.Is(context.Cause(a.ctx), errSuperseded) {
			d.Log.Info("interrupted mid-change; the journal keeps it", "config", a.ch.Config, "phase", a.ch.Phase, "interrupted", se.Reason)
		}
		return outParked
	}
	ch := a.ch
	if d.Journal.State.Change == nil {
		c := *ch // not journaled: the failure must not make it so
		ch = &c
	}
	var n *gpus.Inventory // the GPUs as read, unless the apply step may have changed them
	if a.v != nil && !a.touched {
		n = a.v.n
	}
	oc := d.failure(a.ctx, a.node, ch, se, n)
	if oc == outRetry && errors.Is(se, nvmlx.ErrNVMLNotBack) {
		// NVML did not come back after a GPU reset: failed for now, not
		// ready, and NVML is opened again with its own backoff; the retry
		// reads the GPUs as the reset left them.
		d.nvmlLost(se.Err)
		return outNVMLDown
	}
	return oc
}

func (a *attempt) plan() error {
	if a.ch.Config == "" {
		return invalid("the node label %s is set but empty: name a MIG config, or remove the label", record.LabelConfig)
	}
	var n *gpus.Inventory
	if a.v == nil {
		var err error
		if n, err = a.d.discover(); err != nil {
			return retryable("reading the GPUs through NVML", err)
		}
	}
	if a.d.fileErr != nil {
		return &StepError{Reason: a.d.fileErr.Error(), Retryable: true, Event: record.ReasonInvalid}
	}
	if a.v != nil {
		n = a.v.n
	}
	a.d.noteUnusable(a.ctx, a.node, n)
	if a.v == nil {
		v, err := a.d.look(n, a.ch.Config)
		if err != nil {
			return err
		}
		a.v = v
	}
	for _, w := range a.v.plan.Warnings {
		a.d.Log.Warn("config warning", "config", a.ch.Config, "warning", w)
	}
	a.ch.Source, a.ch.Hash = a.v.source, a.v.plan.Hash
	return nil
}

func (a *attempt) checkNode() error {
	d, node, desired := a.d, a.node, a.ch.Config
	if node != nil {
		if err := geometry.CheckStrategy(node.Strategy, a.v.n.GPUs, a.v.reqs); err != nil {
			return invalid("the node's MIG strategy %q cannot serve config %q: %v", node.Strategy, desired, err)
		}
	}
	// The request is valid and the GPUs need it: the node says pending
	// while the checks below read the cluster (they only read). Should one
	// refuse, the state goes on to failed with the reason once pending is
	// written, as from any later step; nothing is touched before the
	// preflight and the journal (begin). Pending alongside the reads saves
	// their time, and the preflight's and the journal's before them: label
	// → pending 28 → 17 ms on a slow machine (docs/bench.md).
	if a.announces() {
		a.announced = true
		done := make(chan struct{})
		go func() { defer close(done); d.setState(a.ctx, record.StatePending) }()
		defer func() { <-done }()
	}
	if node == nil {
		return nil
	}
	if err := a.checkPath(); err != nil {
		return err
	}
	if d.Others == nil {
		return nil
	}
	var other string
	// An API server away for a moment is no reason to fail.
	err := d.retryAPI(a.ctx, func() (err error) { other, err = d.Others.Check(a.checkCtx); return err })
	if err != nil {
		return retryable("checking for another MIG manager", err)
	}
	if other != "" {
		if !d.S.AllowOtherMigManager {
			return &StepError{Reason: "another MIG manager is at work on this node: " + other + " (disable it, or set --allow-other-mig-manager)",
				Event: record.ReasonManagerConflict}
		}
		d.Log.Warn("another MIG manager is at work on this node; acting anyway (--allow-other-mig-manager)", "other", other)
	}
	return nil
}

// checkPath notes which allocation path serves the node; it refuses a node
// both paths serve, and on the DRA path what that driver cannot announce.
func (a *attempt) checkPath() error {
	if a.d.Disrupt == nil {
		return nil
	}
	var path, conflict string
	if err := a.d.retryAPI(a.ctx, func() (err error) { path, conflict, err = a.d.Disrupt.ServedBy(a.checkCtx); return err }); err != nil {
		return retryable("finding the allocation path of the node", err)
	}
	if conflict != "" {
		return &StepError{Reason: "the node's GPUs are served by both the device plugin and the NVIDIA DRA driver, which NVIDIA does not support: " +
			conflict + " (serve this node's GPUs through one of them)", Event: record.ReasonAllocationPathConflict}
	}
	a.ch.ServedBy = cmp.Or(path, a.ch.ServedBy)
	if err := geometry.CheckDRA(a.v.plan); path == record.ServedByDRA && err != nil {
		return invalid("config %q cannot be served on this node, whose GPUs NVIDIA's DRA driver serves: %v", a.ch.Config, err)
	}
	return nil
}

// announces: this attempt starts a change that the GPUs need (not one
// already applied, not a resumed one): it sets the state pending
// (checkNode).
func (a *attempt) announces() bool {
	return a.ch.Phase == journal.PhasePending && gpus.PlanChanges(a.v.plan)
}

// begin ends the pass when the GPUs hold the config already; otherwise it
// proves the rights the change needs and journals and announces it.
func (a *attempt) begin() error {
	d, ch, plan := a.d, a.ch, a.v.plan
	j := &d.Journal.State
	d.sameNode(a.ctx, a.node, ch)
	if ch.Phase == journal.PhasePending {
		// Later phases keep what the change set out to do: a resumed plan
		// holds only what is left of it.
		ch.GPUsChanged, ch.GPUsUntouched = gpus.Indices(plan)
	}
	if !gpus.PlanChanges(plan) && ch.Phase == journal.PhasePending {
		// Already applied: success without touching a GPU or a client.
		ch.GPUsChanged, ch.GPUsUntouched = []int{}, gpus.AllIndices(plan)
		if len(a.v.named) > 0 {
			return d.partial(ch, plan, a.v.named)
		}
		return d.success(a.ctx, a.node, ch, plan, a.v.n, nil, "config already applied; nothing changed", record.ReasonUnchanged)
	}
	if ch.Phase == journal.PhasePending && !a.announced {
		// A change sent back to pending just now (sameNode: its Node was
		// made again) says so on the new Node.
		d.setState(a.ctx, record.StatePending)
	}
	// The change goes ahead unless the preflight refuses it: the device
	// plugin list (noteDevicePlugins) starts now, beside the writes.
	a.listPluginsAhead()
	// Nothing is disrupted that cannot be recorded: the rights to write
	// what the change records and disrupts are proven first (preflight).
	if err := d.preflight(a.ctx, a.node); err != nil {
		return &StepError{Reason: err.Error(), Retryable: true, Event: record.ReasonPreflight}
	}
	if ch.Phase == journal.PhasePending {
		// The GPUs are no longer known to hold the handled config: whatever
		// the label says next, even that config again, is acted on.
		j.Change, j.Handled = ch, ""
		if err := d.mustJournal(); err != nil {
			j.Change = nil
			return &StepError{Reason: err.Error(), Retryable: true, Event: record.ReasonJournal}
		}
		d.event(a.ctx, a.node, EventNormal, record.ReasonStarted, fmt.Sprintf("applying MIG config %q: GPUs %v change, %v untouched; %s",
			ch.Config, ch.GPUsChanged, ch.GPUsUntouched, record.RequestedByText(ch.RequestedBy, ch.RequestedVia, ch.RequestedBySource)))
	}
	j.Change = ch
	return nil
}

func (a *attempt) takeSlot() error {
	d := a.d
	if d.Slots != nil {
		_ = d.notify().Status("waiting for a rollout slot")
		if a.slot != nil {
			return nil // taken already this attempt (before a reboot)
		}
		slot, err := d.Slots.Acquire(a.ctx)
		if err != nil {
			if a.ctx.Err() != nil {
				return endPass(outParked)
			}
			return retryable("taking a rollout slot", err)
		}
		a.slot = slot
	}
	if a.ch.DisruptedAt == nil {
		// The slot is taken: the disruption begins.
		at := d.Clock.Now().UTC()
		a.ch.DisruptedAt = &at
	}
	return nil
}

func (a *attempt) drain() error {
	if a.d.Disrupt == nil || (a.ch.Phase != journal.PhasePending && a.ch.Phase != journal.PhaseDraining) {
		return nil
	}
	ctx, stop := a.ctx, context.CancelFunc(func() {})
	if a.slot != nil { // a slot lost ends the drain: failed before the next eviction
		ctx, stop = a.slot.Guard(a.ctx)
	}
	defer stop()
	err := a.d.vacate(ctx, a.node, a.ch, a.v.n, a.v.plan, a.confirm)
	if ctx.Err() != nil && a.ctx.Err() == nil {
		if cerr := a.confirm("its next eviction"); cerr != nil {
			return cerr
		}
	}
	return err
}

// confirm says whether the next disruptive step (what) may run: the
// rollout slot is still this node's (Slot.Check) and the node still this
// agent's (Owner.Confirm). A lost one stops the change before the step,
// with the reason; the failure restores what the change paused and its
// retry takes a slot again.
func (a *attempt) confirm(what string) error {
	if a.slot != nil {
		if err := a.slot.Check(a.ctx); err != nil {
			if a.ctx.Err() != nil {
				return endPass(outParked)
			}
			return &StepError{Reason: fmt.Sprintf("the rollout slot was lost (%v): stopped before %s", err, what),
				Retryable: true, Event: record.ReasonSlotLost, Err: err}
		}
	}
	if a.d.Owner != nil {
		if err := a.d.Owner.Confirm(a.ctx); err != nil {
			if a.ctx.Err() != nil {
				return endPass(outParked)
			}
			return &StepError{Reason: fmt.Sprintf("this agent no longer holds its node (%v): stopped before %s", err, what),
				Retryable: true, Event: record.ReasonNodeLost, Err: err}
		}
	}
	return nil
}

func (a *attempt) checkProcesses() error {
	strays, err := gpus.Blockers(a.d.GPU, a.v.n, a.v.plan)
	if err != nil {
		return retryable("listing GPU processes", err)
	}
	if strays, err = a.stopClientsForStrays(strays); err != nil {
		return err
	}
	if len(strays) > 0 {
		return &StepError{Reason: gpus.StrayReason(strays),
			Retryable: true, Event: record.ReasonFailed}
	}
	return nil
}

func (a *attempt) stopHostClients() error {
	d, ch := a.d, a.ch
	if !gpus.ModeChanges(a.v.plan) || d.Units == nil || len(d.S.HostGPUClients) == 0 || len(ch.StoppedUnits) > 0 {
		return nil
	}
	_ = d.notify().Status("stopping host GPU clients %v", d.S.HostGPUClients)
	stopped, err := d.Units.StopActive(a.ctx, d.S.HostGPUClients)
	ch.StoppedUnits = stopped
	d.saveJournal()
	if err != nil {
		return retryable("stopping host GPU clients", err)
	}
	return nil
}

func (a *attempt) noteDevicePlugins() error {
	if !a.wantsPluginList() {
		return nil
	}
	// The device plugin pods running now read the old geometry: the ones
	// still running when the change is done are restarted.
	var l pluginList
	if a.plugins != nil {
		l = <-a.plugins
	} else {
		l = a.listPlugins()
	}
	if l.err != nil {
		return retryable("listing the device plugin pods", l.err)
	}
	a.ch.NotePlugins(l.pods)
	a.ch.PluginsNoted = true
	return nil
}

// wantsPluginList: the list of the device plugins that read the old
// geometry (restarted or not: their figures never count) is not taken yet.
func (a *attempt) wantsPluginList() bool {
	d, ch := a.d, a.ch
	return d.Disrupt != nil && a.node != nil && ch.Phase != journal.PhaseApplying && !ch.PluginsNoted
}

// listPluginsAhead starts noteDevicePlugins' list once the change is going
// ahead (begin), so that it overlaps the preflight, the journal, the state
// write and the drain: a list is a consistent read, which the API server
// holds until its watch cache has caught up with etcd (a progress
// notification it asks etcd for), 65 to 80 ms in the bench (docs/bench.md)
// when a write came just before. The list is still taken before the GPUs
// change; a device plugin the drain removes (a paused operand) is gone by
// the restart, which skips it.
func (a *attempt) listPluginsAhead() {
	if a.plugins != nil || !a.wantsPluginList() {
		return
	}
	done := make(chan pluginList, 1)
	a.plugins = done
	go func() { done <- a.listPlugins() }()
}

func (a *attempt) listPlugins() (l pluginList) {
	l.err = a.d.retryAPI(a.ctx, func() (err error) { l.pods, err = a.d.Disrupt.DevicePlugins(a.checkCtx); return err })
	return l
}

func (a *attempt) apply() error {
	d, ch := a.d, a.ch
	a.touched = true
	d.advance(ch, journal.PhaseApplying)
	if err := d.mustJournal(); err != nil {
		return &StepError{Reason: err.Error(), Retryable: true, Event: record.ReasonJournal}
	}
	var release func() error
	if d.Inhibit != nil {
		if r, err := d.Inhibit.Inhibit(a.ctx, "applying MIG geometry "+ch.Config); err == nil {
			release = r
		} else {
			d.Log.Warn("taking a shutdown inhibitor failed", "err", err)
		}
	}
	opts := gpus.ApplyOptions{Step: func(gpu int, what string) error {
		step := fmt.Sprintf("GPU %d: %s", gpu, what)
		if err := a.confirm(step); err != nil {
			return err
		}
		ch.Step = step
		if err := d.mustJournal(); err != nil {
			return err
		}
		_ = d.notify().Status("%s", ch.Step)
		d.Log.Info("applying", "gpu", gpu, "step", what)
		return nil
	}}
	var applied *gpus.Applied
	var err error
	if d.Hooks != nil {
		// Standalone (only there are hooks set): the hooks file runs around
		// the change as nvidia-mig-parted apply runs it; a failing hook
		// fails the change.
		env := gpus.HookEnv{ConfigFile: d.S.ConfigFile, SelectedConfig: ch.Config, HooksFile: d.S.HooksFile, Timeout: d.S.CommandTimeout}
		pa := gpus.NewPlanApplier(d.GPU, d.File, ch.Config, opts, a.v.n, a.v.plan)
		err = gpus.ApplyWithHooks(a.ctx, d.Log, d.Hooks, env, false, pa)
		applied = &pa.Result
	} else {
		applied, err = gpus.ApplyAndVerify(d.GPU, a.v.n, a.v.plan, d.File, ch.Config, opts)
	}
	if release != nil {
		_ = release()
	}
	var stop *StepError
	var end endPass
	switch {
	case errors.Is(err, gpus.ErrRebootRequired):
		return a.rebootFor(applied)
	case errors.As(err, &stop):
		return stop // a lost slot or node: stopped before a GPU step
	case errors.As(err, &end):
		return end
	case err != nil:
		return retryable("applying", gpus.HolderAdvice(err))
	}
	a.applied = applied
	return nil
}

func (a *attempt) finish() error {
	return a.d.afterApply(a.ctx, a.node, a.ch, a.v.plan, a.applied, a.v.named)
}

// vacate clears the GPUs the change takes of their clients: new clients
// are kept off and the GPU Operator's operands paused (Disruptor.Hold), and
// the clients holding what the change takes away evicted. confirm is asked
// before each disruptive step (see attempt.confirm).
func (d *Daemon) vacate(ctx context.Context, node *Node, ch *journal.Change, n *gpus.Inventory, plan *geometry.Plan, confirm func(what string) error) error {
	d.advance(ch, journal.PhaseDraining)
	if err := d.mustJournal(); err != nil {
		return &StepError{Reason: err.Error(), Retryable: true, Event: record.ReasonJournal, Always: true}
	}
	if err := confirm("draining the node"); err != nil {
		return err
	}
	if err := d.Disrupt.Hold(ctx, ch, d.S.Taint, d.S.PauseGPUOperator, d.step(ctx, true)); err != nil {
		return err
	}
	gpuUUIDs, migUUIDs := gpus.Takes(n, plan)
	if slices.Contains(migUUIDs, "") {
		// NVML could not read a MIG device's UUID (the backend leaves it
		// empty): the clients using that device cannot be found.
		return &StepError{Reason: "a MIG device the change takes away has no UUID NVML could read: cannot tell which pods use it; not changing it",
			Retryable: true, Event: record.ReasonFailed}
	}
	var pods []string
	var how string
	err := d.retryAPI(ctx, func() (err error) { pods, how, err = d.Disrupt.Affected(ctx, gpuUUIDs, migUUIDs); return err })
	if err != nil {
		return retryable("finding the pods that use the changing GPUs", err)
	}
	ch.AffectedBy = how
	if how != "" && how != record.AffectedByNothing { // "": nothing could tell who holds the devices (standalone)
		d.Metrics.Collected("pod-resources", strings.HasPrefix(how, record.AffectedByAllGPUPodsPrefix))
	}
	if len(pods) > 0 {
		if err := confirm("evicting pods"); err != nil {
			return err
		}
		msg := fmt.Sprintf("evicting %d pods on GPUs %v: %s", len(pods), ch.GPUsChanged, strings.Join(pods, ", "))
		_ = d.notify().Status("%s", msg)
		d.event(ctx, node, EventNormal, record.ReasonEvicting, msg)
		evicted, err := d.evict(ctx, pods)
		ch.Evicted = appendNew(ch.Evicted, evicted...)
		d.Metrics.Evicted(len(evicted))
		d.saveJournal()
		if err != nil {
			return retryable("evicting pods", err)
		}
	}
	return nil
}

// step is the Step of Disruptor.Hold (hold) and Release: do, retried
// through an API server outage where retry. Holding, the change is
// journaled after it (a crash restores from there) and a failure is the
// change's, retryable; releasing, a failure is logged (the next change
// lifts what is left, taking it as its own).
func (d *Daemon) step(ctx context.Context, hold bool) Step {
	return func(what string, retry bool, do func() error) error {
		run := do
		if retry {
			run = func() error { return d.retryAPI(ctx, do) }
		}
		switch e := run(); {
		case e != nil && hold:
			return retryable(what, e)
		case e != nil:
			d.Log.Error(what+" failed", "err", e)
			return e
		case hold:
			d.saveJournal()
		}
		return nil
	}
}

func appendNew(s []string, more ...string) []string {
	for _, m := range more {
		if !slices.Contains(s, m) {
			s = append(s, m)
		}
	}
	return s
}

// afterApply restores what the disruption paused, refreshes the device
// plugin, waits for the new devices to be advertised, and records success:
// it ends the pass.
func (d *Daemon) afterApply(ctx context.Context, node *Node, ch *journal.Change, plan *geometry.Plan, applied *gpus.Applied, named []nvmlx.UnusableGPU) error {
	d.advance(ch, journal.PhaseRestoring)
	d.saveJournal()
	// The stale device plugins are restarted before the disruption is
	// lifted: their successors start as the node takes clients again.
	failed := d.restartPlugins(ctx, node, ch)
	d.restore(ctx, ch)
	var converged *bool
	if failed == "" {
		converged, failed = d.refresh(ctx, node, ch, applied.After)
	} else { // kept as a failed refresh: its retry restarts them again
		d.advance(ch, journal.PhaseRefreshing)
		d.saveJournal()
	}
	if failed != "" {
		if ctx.Err() != nil {
			d.Log.Info("interrupted while refreshing the device plugin; the journal keeps the change", "config", ch.Config)
			return endPass(outParked)
		}
		return &StepError{Reason: failed, Retryable: true, Event: record.ReasonResourcesTimeout}
	}
	if len(named) > 0 {
		return d.partial(ch, plan, named)
	}
	msg := fmt.Sprintf("MIG config %q applied: GPUs %v changed, %v untouched, %d pods evicted", ch.Config, ch.GPUsChanged, ch.GPUsUntouched, len(ch.Evicted))
	return d.success(ctx, node, ch, plan, applied.After, converged, msg, record.ReasonApplied)
}

// refresh makes the device plugin see the new MIG devices (it reads them
// only when it starts: those that read the old geometry are restarted)
// and waits up to --resource-wait-timeout until the node advertises exactly
// the new geometry (Disruptor.WaitResources). It returns whether they converged
// (nil: not awaited) or, when they did not, the failure reason: the change
// stays journaled, and its retry restarts the device plugin again.
func (d *Daemon) refresh(ctx context.Context, node *Node, ch *journal.Change, n *gpus.Inventory) (converged *bool, failed string) {
	if d.Disrupt == nil || node == nil || len(ch.GPUsChanged) == 0 {
		return nil, ""
	}
	d.advance(ch, journal.PhaseRefreshing)
	d.saveJournal()
	// A retry restarts here what the last wait found not advertising.
	if failed := d.restartPlugins(ctx, node, ch); failed != "" {
		return nil, failed
	}
	if d.S.ResourceWaitTimeout <= 0 {
		return nil, ""
	}
	what := "the device plugin to advertise the new resources"
	if ch.ServedBy == record.ServedByDRA {
		what = "the DRA driver to announce the new MIG devices"
	}
	_ = d.notify().Status("waiting for %s", what)
	migMode, migDevices := n.Exposed()
	waited, ok, err := d.Disrupt.WaitResources(ctx, ch, node.Strategy, migMode, migDevices, d.S.ResourceWaitTimeout)
	restarted := ch.PluginsRestarted
	ch.PluginsRestarted = false // the wait has looked for their successors
	if !waited {
		d.Log.Warn("computing the expected resources failed; not waiting for them", "err", err)
		return nil, ""
	}
	d.report(func(s *Status) { s.ResourcesNotConverged = !ok })
	if ok {
		return &ok, ""
	}
	if ctx.Err() != nil {
		return &ok, "interrupted"
	}
	// Whatever runs now did not advertise the geometry: the retry
	// restarts it again.
	hint := "is the device plugin running on this node?"
	if ch.ServedBy == record.ServedByDRA {
		hint = "is the NVIDIA DRA driver's kubelet plugin running on this node?"
	}
	if d.S.RestartDevicePlugin { // listed only to be restarted: their figures never count
		pods, listErr := d.Disrupt.DevicePlugins(ctx)
		ch.NotePlugins(pods)
		if restarted && listErr == nil && len(pods) == 0 {
			hint = "no plugin pod is on this node now: the one restarted was not replaced; its DaemonSet makes the new one " +
				"(is kube-controller-manager's DaemonSet controller running, and does the pod tolerate the node's taints?)"
		}
	}
	d.saveJournal()
	if ch.ServedBy == record.ServedByDRA {
		return &ok, fmt.Sprintf("the GPUs hold config %q, but the node's %s ResourceSlices did not announce exactly its devices within %s (%s): %v",
			ch.Config, "gpu.nvidia.com", d.S.ResourceWaitTimeout, hint, err)
	}
	return &ok, fmt.Sprintf("the GPUs hold config %q, but the Node's allocatable did not show exactly its resources within %s (%s): %v",
		ch.Config, d.S.ResourceWaitTimeout, hint, err)
}

// restartPlugins restarts the change's stale device plugins
// (ch.StalePlugins), once, and notes in ch that their successors are on
// their way (PluginsRestarted); it returns the failure reason.
func (d *Daemon) restartPlugins(ctx context.Context, node *Node, ch *journal.Change) (failed string) {
	if d.Disrupt == nil || node == nil || len(ch.GPUsChanged) == 0 || !d.S.RestartDevicePlugin || len(ch.StalePlugins) == 0 {
		return ""
	}
	_ = d.notify().Status("restarting the device plugin")
	var restarted []string
	err := d.retryAPI(ctx, func() (err error) { restarted, err = d.Disrupt.RestartDevicePlugins(ctx, ch.StalePlugins); return err })
	if err != nil {
		return "restarting the device plugin: " + err.Error()
	}
	ch.StalePlugins = nil
	ch.PluginsRestarted = ch.PluginsRestarted || len(restarted) > 0
	d.saveJournal()
	if len(restarted) > 0 {
		d.event(ctx, node, EventNormal, record.ReasonDevicePluginRestarted,
			fmt.Sprintf("restarted %s so that they advertise the new MIG devices", strings.Join(restarted, ", ")))
	}
	return ""
}

// preflight proves the rights to record the change before anything is
// disrupted (with a cluster only).
func (d *Daemon) preflight(ctx context.Context, node *Node) error {
	if node == nil {
		return nil
	}
	err := d.retryAPI(ctx, func() error { return d.Cluster.Preflight(ctx, d.S.Taint) })
	if err != nil {
		return fmt.Errorf("preflight: the agent may not write what the change must record, so nothing is changed: %w", err)
	}
	return nil
}
