package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/internal/backoff"
	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/nvmlx"
)

// Daemon is `mig-agent run`: it converges the node to the desired config
// and holds it. Build it with its dependencies and call Run.
type Daemon struct {
	S   *Settings
	Log *slog.Logger
	GPU nvmlx.GPU
	// Cluster is the Kubernetes side (Kube), or Standalone.
	Cluster Cluster
	Disrupt Disruptor // nil in standalone mode
	Reboot  Rebooter
	Units   HostUnits // nil when no host GPU clients are configured
	Notify  Notifier
	Metrics Metrics
	Journal *Journal
	File    *ConfigFile
	Clock   clock.WithTicker
	Version string
	// BootID identifies the current boot (a reboot changes it).
	BootID func() string
	// Inhibit holds off shutdown while NVML is mid-change (optional).
	Inhibit func(ctx context.Context, why string) (release func() error, err error)
	// OtherManager names another MIG manager at work on this node, or "".
	OtherManager func(ctx context.Context, node *corev1.Node) (string, error)
	// Slots takes a cluster-wide rollout slot (optional; --max-concurrent).
	Slots func(ctx context.Context) (release func(), err error)
	// SlotReboot keeps the slot taken by Slots through a reboot: the next
	// release stops renewing it without freeing it, and the Lease is
	// stretched to cover the reboot (optional).
	SlotReboot func(ctx context.Context) error
	// Hooks are the nvidia-mig-parted hooks run around each change in
	// standalone mode (S.HooksFile; nil: none).
	Hooks Hooks

	ready    atomic.Bool
	nvmlDown atomic.Bool // the last attempt to open NVML failed
	nvmlFail int         // consecutive failures to open NVML
	drifted  bool
	// stateDecided: migagent_state shows a state (showState); before, all 0.
	stateDecided bool
	// published is the generated config text last written to the ConfigMap.
	published string
	// journalErr is the error of the last journal write (nil: it worked).
	journalErr atomic.Pointer[error]
	// apiDown: the API server did not answer the Node watch (apihealth.go).
	apiDown atomic.Bool
	// fileErr is why the config file did not read at the last pass (reload.go).
	fileErr error
	// unusableSeen is the set of unusable GPUs last reported (noteUnusable).
	unusableSeen string

	mu         sync.Mutex
	cancelPass context.CancelFunc // stops the reconcile pass in progress
}

// ErrExitAfterReboot is returned by Run when the sim reboot method
// "rebooted" the machine: the process ends as if the machine went down.
var ErrExitAfterReboot = errors.New("rebooted")

// outcome of one attempt.
type outcome int

const (
	outSuccess   outcome = iota
	outFailed            // not retried until the label changes
	outRetry             // retried with backoff
	outRebooting         // waiting for a reboot
	outRebooted          // the sim reboot happened: exit
	outParked            // shutting down mid-change; resumes at next start
	outNVMLDown          // NVML cannot be opened: retried with backoff
)

// Ready reports whether the daemon is serving (for /readyz).
func (d *Daemon) Ready() error {
	if !d.ready.Load() {
		return errors.New("not ready: node watch not established or NVML not answering")
	}
	if d.nvmlDown.Load() {
		return errors.New("not ready: NVML cannot be opened (retrying)")
	}
	return d.degraded()
}

// openNVML opens an NVML session for one pass (End closes it: an idle
// agent holds none, so a driver upgrade can unload the module). When NVML
// cannot be opened (no driver yet, the module unloaded) the agent is not
// ready and migagent_nvml_up is 0 until a retry succeeds.
func (d *Daemon) openNVML() bool {
	err := d.GPU.Begin()
	if err == nil {
		if d.nvmlDown.Swap(false) {
			d.Log.Info("NVML is open again", "after", d.nvmlFail)
		}
		d.nvmlFail = 0
		d.Metrics.SetNVMLUp(true)
		return true
	}
	d.nvmlFail++
	d.nvmlDown.Store(true)
	d.Metrics.SetNVMLUp(false)
	if d.nvmlFail == 1 {
		d.Log.Error("NVML cannot be opened; not ready, retrying with backoff", "err", err)
		_ = d.notify().Status("NVML cannot be opened: %v", err)
	} else {
		d.Log.Debug("NVML still cannot be opened", "attempts", d.nvmlFail, "err", err)
	}
	return false
}

// nvmlLost marks NVML as not open (it did not come back after a GPU
// reset): not ready and migagent_nvml_up 0 until a Begin succeeds again.
func (d *Daemon) nvmlLost(err error) {
	d.nvmlFail = max(d.nvmlFail, 1)
	d.nvmlDown.Store(true)
	d.Metrics.SetNVMLUp(false)
	d.Log.Error("NVML is not back after a GPU reset; not ready, opening it again with backoff", "err", err)
	_ = d.notify().Status("NVML not back after a GPU reset: %v", err)
}

// nvmlBackoff is the wait before the next attempt to open NVML: 1s
// doubling to 2 minutes, each drawn within ±20% so that the agents of a
// cluster whose driver came back together do not retry in step.
func (d *Daemon) nvmlBackoff() time.Duration {
	b := time.Second
	for i := 1; i < d.nvmlFail && b < 2*time.Minute; i++ {
		b *= 2
	}
	b = min(b, 2*time.Minute)
	return b - b/5 + rand.N(2*b/5+1)
}

func (d *Daemon) notify() Notifier {
	if d.Notify == nil {
		return nopNotifier{}
	}
	return d.Notify
}

// discover reads the GPUs and refreshes the GPU metrics.
func (d *Daemon) discover() (*Inventory, error) {
	n, err := Discover(d.GPU)
	d.Metrics.SetNVMLUp(err == nil)
	d.Metrics.SetCollectorError("nvml", err != nil)
	if err != nil {
		return nil, err
	}
	d.Metrics.SetGPUs(metricGPUs(n))
	d.Metrics.SetUnusableGPUs(metricUnusable(n))
	return n, nil
}

func metricUnusable(n *Inventory) []metrics.UnusableGPU {
	out := make([]metrics.UnusableGPU, 0, len(n.Unusable))
	for _, u := range n.Unusable {
		out = append(out, metrics.UnusableGPU{Index: u.Index, Error: u.Return})
	}
	return out
}

// noteUnusable logs and posts a Warning Event when the set of GPUs NVML
// cannot open changes (once per change, not at every pass).
func (d *Daemon) noteUnusable(ctx context.Context, node *corev1.Node, n *Inventory) {
	key := fmt.Sprint(metricUnusable(n))
	if key == d.unusableSeen {
		return
	}
	d.unusableSeen = key
	for _, u := range n.Unusable {
		d.Log.Warn("GPU cannot be opened through NVML; leaving it alone", "gpu", u.Index, "return", u.Return, "err", u.Reason)
		d.event(ctx, node, corev1.EventTypeWarning, ReasonGPUUnusable,
			fmt.Sprintf("GPU %d cannot be opened through NVML (%s): mig-agent leaves it alone, and a config that names it fails", u.Index, u.Reason))
	}
}

func metricGPUs(n *Inventory) []metrics.GPU {
	out := make([]metrics.GPU, 0, len(n.Devices))
	for i, dev := range n.Devices {
		g := metrics.GPU{Index: dev.Index, UUID: dev.UUID, Model: dev.Name, PCIBusID: dev.PCIBusID,
			MigEnabled: dev.MigMode.Current, ModePending: dev.MigMode.Current != dev.MigMode.Pending, Instances: map[string]int{}}
		for _, gi := range n.Instances[i] {
			g.Instances[gi.Profile]++
		}
		out = append(out, g)
	}
	return out
}

// reconcile decides what to do for the node as it is now. start is true
// for the first pass after the process started; v is what the pass read
// and planned already (nil: nothing yet), so that one pass reads the GPUs
// once and plans once.
func (d *Daemon) reconcile(ctx context.Context, node *corev1.Node, start, retry bool, v *view) outcome {
	req := d.Cluster.Desired(node)
	desired := req.Config
	d.Metrics.SetDesiredConfig(desired)
	d.reloadFile()
	j := &d.Journal.State
	if d.forgetReboot(desired) {
		// A new value of the label is a new change: it may reboot once.
		d.saveJournal()
	}
	// A label set to "" is a request too: it fails with a reason (attempt).
	if !req.Asked {
		if j.Change != nil {
			d.abandon(ctx, j.Change, "the desired config label was removed", v.inventory())
		}
		// The label is gone: its next value is a new request, acted on at
		// once (no backoff of an earlier failure), also when it names the
		// config that is applied (a record follows).
		j.ClearBackoff()
		if j.Handled != "" {
			j.Handled = ""
			d.saveJournal()
		}
		return outSuccess
	}
	if j.Change != nil && j.Change.Config != desired {
		d.abandon(ctx, j.Change, fmt.Sprintf("the desired config changed to %q", desired), v.inventory())
	}
	if j.Failing != desired {
		j.ClearBackoff()
	}
	switch {
	case j.Change != nil && !retry && j.Waiting(desired, d.Clock.Now()):
		// a change kept in the journal after a failure waits for its backoff
		return outRetry
	case j.Change != nil:
		// resume the journaled change
	case desired == j.Handled && j.Failing == "" && desired != "":
		if !start {
			return outSuccess
		}
		// At start: hold the geometry (a reboot drops every instance).
		if v == nil {
			if n, err := d.discover(); err == nil {
				v, _ = d.look(n, desired)
			}
		}
		if v != nil && !planChanges(v.plan) {
			return outSuccess
		}
	case !retry && j.Waiting(desired, d.Clock.Now()):
		return outRetry
	}
	return d.attempt(ctx, node, req, v)
}

func planChanges(p *geometry.Plan) bool {
	for _, g := range p.GPUs {
		if g.Action == geometry.ActionChange {
			return true
		}
	}
	return false
}

// abandon undoes the side effects of a journaled change that will not be
// finished (the label moved on), so nothing stays paused or tainted.
//
// n is the pass's read of the GPUs for the record (nil: read them).
func (d *Daemon) abandon(ctx context.Context, ch *Change, why string, n *Inventory) {
	d.Log.Info("abandoning unfinished change", "config", ch.Config, "why", why)
	d.restore(ctx, ch)
	d.Journal.State.Change, d.Journal.State.Handled = nil, ""
	d.saveJournal()
	// The trail shows the request that never finished, and why. The state
	// label is left to the request that follows.
	rec := d.record(ch, StateFailed, "abandoned: "+why, d.Clock.Now(), n)
	if !nvmlStarted(ch.Phase) {
		// Planned, never applied: no GPU was changed.
		rec.GPUsChanged, rec.GPUsUntouched = []int{}, append(append([]int{}, ch.GPUsUntouched...), ch.GPUsChanged...)
		slices.Sort(rec.GPUsUntouched)
	}
	ctx = context.WithoutCancel(ctx)
	err := d.retryAPI(ctx, func() error {
		node, err := d.Cluster.GetNode(ctx)
		if err != nil {
			return err
		}
		state := StatePending
		if node != nil && node.Labels[LabelState] != "" {
			state = node.Labels[LabelState]
		}
		return d.Cluster.Record(ctx, node, rec, state)
	})
	if err != nil {
		d.Log.Error("writing the change record failed", "err", err)
	}
}

// nvmlStarted reports whether a change in phase may have touched a GPU:
// before applying, only the taint, operands and pods were.
func nvmlStarted(phase Phase) bool {
	return phase != PhasePending && phase != PhaseDraining && phase != ""
}

// restore starts stopped units, restores operand labels and removes the
// taint, as the journal says; the API calls ride out an API server outage
// (retryAPI). A taint that still could not be lifted is lifted by the next
// change, which takes it as its own.
func (d *Daemon) restore(ctx context.Context, ch *Change) {
	ctx = context.WithoutCancel(ctx)
	if len(ch.StoppedUnits) > 0 && d.Units != nil {
		if err := d.Units.Start(ctx, ch.StoppedUnits); err != nil {
			d.Log.Error("starting host GPU clients failed", "units", ch.StoppedUnits, "err", err)
		} else {
			ch.StoppedUnits = nil
		}
	}
	if d.Disrupt != nil && len(ch.Operands) > 0 {
		if err := d.retryAPI(ctx, func() error { return d.Disrupt.RestoreOperands(ctx, ch.Operands) }); err != nil {
			d.Log.Error("restoring GPU Operator operand labels failed", "err", err)
		} else {
			ch.Operands = nil
		}
	}
	if d.Disrupt != nil && ch.TaintAdded {
		if err := d.retryAPI(ctx, func() error { return d.Disrupt.Untaint(ctx) }); err != nil {
			d.Log.Error("removing the reconfiguring taint failed", "err", err)
		} else {
			ch.TaintAdded = false
		}
	}
	d.saveJournal()
}

func (d *Daemon) saveJournal() {
	err := d.Journal.Save()
	if err != nil {
		d.Log.Error("writing the journal failed", "path", d.Journal.Path(), "err", err)
	}
	d.setJournalErr(err)
	d.crashHook()
}

// backoff is the wait before retry number n (1-based) of a failed change.
func (d *Daemon) backoff(n int) time.Duration {
	return backoff.Failure(n, d.S.RetryBackoffMax).Round(time.Second)
}

// failure ends an attempt: restore, record, event, metrics, and the retry
// schedule when the cause may pass.
// n is the GPUs as the pass read them when it did not touch them since
// (nil: read them now).
func (d *Daemon) failure(ctx context.Context, node *corev1.Node, ch *Change, se *StepError, n *Inventory) outcome {
	reason, retryable := se.Reason, se.Retryable
	// A change a reboot was requested for stays in the journal through a
	// failure that may pass, so that its retry knows the reboot: never a
	// second one for the same change, whatever fails in between (NVML not
	// up yet at boot, the API server away).
	keep := retryable && ch != nil && ch.RebootBootID != "" && d.Journal.State.Change == ch
	// A change whose GPUs are done but whose resources never showed stays
	// too: its retry restarts the device plugin and waits again (a fresh
	// pass would find the config applied and report success unseen).
	refreshing := retryable && ch != nil && ch.Phase == PhaseRefreshing && d.Journal.State.Change == ch
	waiting := false
	if keep && !refreshing {
		if ch.Phase == PhaseRebooting && d.BootID() != ch.RebootBootID {
			ch.Rebooted = true
		}
		waiting = ch.Phase == PhaseRebooting && !ch.Rebooted
		if ch.Rebooted {
			ch.Phase = PhaseDraining // restore lifts the taint: the retry drains again
		}
	}
	if ch != nil && !waiting {
		// Still waiting for the reboot: the taint and paused operands stay
		// through it, as they do without a failure.
		d.restore(ctx, ch)
	}
	now := d.Clock.Now()
	rec := d.record(ch, StateFailed, reason, now, n)
	d.Log.Error("mig config failed", "config", rec.Config, "reason", reason, "retry", retryable)
	// Metrics first: whoever sees the state label finds them current.
	d.Metrics.ObserveReconfiguration(StateFailed, now.Sub(rec.StartedAt))
	d.Metrics.SetLastFailure(reason)
	d.emit(ctx, node, StateFailed, rec, corev1.EventTypeWarning, se.Event, reason)
	if !keep && !refreshing {
		d.Journal.State.Change = nil
	}
	if !retryable {
		d.Journal.State.GaveUp(rec.Config)
		d.saveJournal()
		_ = d.notify().Status("failed: %s", reason)
		return outFailed
	}
	d.saveJournal()
	wait := d.Journal.State.Retry(rec.Config, now, d.backoff)
	_ = d.notify().Status("failed, retrying in %s: %s", wait, reason)
	return outRetry
}

// record builds the audit record of the change, with the geometry of n (the
// GPUs as just read; nil reads them now).
func (d *Daemon) record(ch *Change, result, reason string, now time.Time, n *Inventory) ChangeRecord {
	rec := ChangeRecord{Result: result, Reason: capReason(reason), FinishedAt: now.UTC(), AgentVersion: d.Version,
		GPUsChanged: []int{}, GPUsUntouched: []int{}, EvictedPods: []string{}}
	if drv, err := d.GPU.DriverVersion(); err == nil {
		rec.DriverVersion = drv
	}
	if ch != nil {
		rec.Config, rec.PreviousConfig, rec.StartedAt = ch.Config, ch.PreviousConfig, ch.StartedAt.UTC()
		rec.ConfigHash, rec.ConfigSource = ch.Hash, ch.Source
		rec.RequestedBy, rec.RequestedVia, rec.RequestedAt = ch.RequestedBy, ch.RequestedVia, ch.RequestedAt
		rec.Reboot = ch.Rebooted || result == StateRebooting
		rec.AffectedBy, rec.DisruptedAt = ch.AffectedBy, ch.DisruptedAt
		if ch.GPUsChanged != nil {
			rec.GPUsChanged = ch.GPUsChanged
		}
		if ch.GPUsUntouched != nil {
			rec.GPUsUntouched = ch.GPUsUntouched
		}
		if ch.Evicted != nil {
			rec.EvictedPods = ch.Evicted
		}
	}
	if n == nil {
		n, _ = d.discover() // refreshes the GPU metrics too
	} else {
		d.Metrics.SetGPUs(metricGPUs(n))
		d.Metrics.SetUnusableGPUs(metricUnusable(n))
	}
	if n != nil {
		rec.Geometry = n.GeometryOf()
		rec.GPUsUnusable = n.Unusable
	}
	return rec
}

// emit writes the record and state to the Node and posts an Event
// (standalone: the log only). API errors are retried briefly, then logged:
// the journal keeps what matters.
func (d *Daemon) emit(ctx context.Context, node *corev1.Node, state string, rec ChangeRecord, evType, reason, msg string) {
	d.showState(state)
	ctx = context.WithoutCancel(ctx)
	node = d.writeRecord(ctx, node, rec, state)
	if err := d.Cluster.Event(ctx, node, evType, reason, msg); err != nil {
		d.Log.Warn("posting an event failed", "reason", reason, "err", err)
	}
}

// setState sets the state label, retrying through API outages.
func (d *Daemon) setState(ctx context.Context, state string) {
	d.showState(state)
	// Shutdown ends the retries at once: the journal holds the change, and
	// the next start sets the state again.
	if err := d.retryAPI(ctx, func() error { return d.Cluster.SetState(ctx, state) }); err != nil && ctx.Err() == nil {
		d.Log.Error("setting the state label failed", "state", state, "err", err)
	}
}

// showState sets migagent_state: the state is decided from now on.
func (d *Daemon) showState(state string) {
	d.stateDecided = true
	d.Metrics.SetState(state)
}

// settleState decides migagent_state after a pass that set none (there
// was nothing to do): the state the Node shows or, standalone, success once
// the selected config is handled. Until a state is decided all four are 0:
// a gauge that said success before the agent looked would count the node
// among the converged ones.
func (d *Daemon) settleState(node *corev1.Node) {
	switch {
	case d.stateDecided:
	case node != nil && node.Labels[LabelState] != "":
		d.showState(node.Labels[LabelState])
	case node == nil && d.Journal.State.Handled != "" && d.Journal.State.Failing == "": // standalone: no Node
		d.showState(StateSuccess)
	}
}

func (d *Daemon) event(ctx context.Context, node *corev1.Node, evType, reason, msg string) {
	if err := d.Cluster.Event(context.WithoutCancel(ctx), node, evType, reason, msg); err != nil {
		d.Log.Warn("posting an event failed", "reason", reason, "err", err)
	}
}

// retryAPI retries an API call for up to two minutes (an API server
// restart) while its error is transient (backoff.Transient), with the
// jittered backoff of backoff.API; any other answer ends it at once.
func (d *Daemon) retryAPI(ctx context.Context, fn func() error) error {
	return backoff.Retry(ctx, d.Clock, outageRetry, func(err error) {
		d.Log.Debug("API call failed; retrying", "err", err)
	}, fn)
}

func indices(p *geometry.Plan) (changed, untouched []int) {
	changed, untouched = []int{}, []int{}
	for _, g := range p.GPUs {
		if g.Action == geometry.ActionChange {
			changed = append(changed, g.Index)
		} else {
			untouched = append(untouched, g.Index)
		}
	}
	return changed, untouched
}

// targets lists what the plan takes away: whole GPUs that change (by GPU
// UUID), MIG devices whose GPU instance is destroyed and MIG devices (compute
// instances) destroyed inside a GPU instance that stays.
func targets(n *Inventory, p *geometry.Plan) (gpuUUIDs, migUUIDs []string) {
	for _, gp := range p.GPUs {
		g, m := targetsOf(n, gp)
		gpuUUIDs, migUUIDs = append(gpuUUIDs, g...), append(migUUIDs, m...)
	}
	return gpuUUIDs, migUUIDs
}

// targetsOf is targets for one GPU's plan.
func targetsOf(n *Inventory, gp geometry.GPUPlan) (gpuUUIDs, migUUIDs []string) {
	if gp.Action != geometry.ActionChange {
		return nil, nil
	}
	dev, insts, ok := n.Device(gp.Index)
	if !ok {
		return nil, nil
	}
	gpuUUIDs = append(gpuUUIDs, dev.UUID)
	for _, in := range gp.Destroy {
		if gi, ok := findGI(insts, in.ProfileID, in.Start); ok {
			for _, ci := range gi.ComputeInstances {
				migUUIDs = append(migUUIDs, ci.UUID)
			}
		}
	}
	for _, d := range DoomedCompute(insts, gp) {
		migUUIDs = append(migUUIDs, d.CI.UUID)
	}
	return gpuUUIDs, migUUIDs
}

// PreviewEvictions fills each changing GPU's Evict with the pods the change
// would evict, as the daemon would find them; it returns how they were
// found (PodResources, or every GPU pod of the node and why).
func PreviewEvictions(ctx context.Context, d Disruptor, n *Inventory, p *geometry.Plan) (string, error) {
	how := ""
	for i, gp := range p.GPUs {
		gpus, migs := targetsOf(n, gp)
		if len(gpus) == 0 {
			continue
		}
		pods, h, err := d.Affected(ctx, gpus, migs)
		if err != nil {
			return "", fmt.Errorf("GPU %d: %w", gp.Index, err)
		}
		p.GPUs[i].Evict, how = pods, h
	}
	return how, nil
}

// strayProcesses lists NVML processes on what the plan takes away.
func (d *Daemon) strayProcesses(n *Inventory, p *geometry.Plan) ([]string, error) {
	var out []string
	for _, gp := range p.GPUs {
		if gp.Action != geometry.ActionChange {
			continue
		}
		procs, err := d.GPU.Processes(gp.Index)
		if err != nil {
			return nil, err
		}
		_, insts, _ := n.Device(gp.Index)
		doomed := map[int]bool{}
		for _, in := range gp.Destroy {
			if gi, ok := findGI(insts, in.ProfileID, in.Start); ok {
				doomed[gi.ID] = true
			}
		}
		doomedCI := map[[2]int]bool{}
		for _, d := range DoomedCompute(insts, gp) {
			doomedCI[[2]int{d.GI.ID, d.CI.ID}] = true
		}
		for _, pr := range procs {
			if gp.ModeChange != geometry.ModeNone || pr.GIID < 0 || doomed[pr.GIID] || doomedCI[[2]int{pr.GIID, pr.CIID}] {
				out = append(out, fmt.Sprintf("pid %d (%s) on GPU %d", pr.PID, pr.Name, gp.Index))
			}
		}
	}
	return out, nil
}

func modeChanges(p *geometry.Plan) bool {
	return slices.ContainsFunc(p.GPUs, func(g geometry.GPUPlan) bool { return g.ModeChange != geometry.ModeNone })
}
