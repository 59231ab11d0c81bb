package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/internal/apihealth"
	"github.com/migagent/mig-agent/internal/backoff"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
)

// Daemon is `mig-agent run`: it converges the node to the desired config
// and holds it. Build it with its dependencies and call Run.
type Daemon struct {
	S   *settings.Settings
	Log *slog.Logger
	GPU nvmlx.GPU
	// Cluster is the Kubernetes side (kube.Cluster), or Standalone.
	Cluster Cluster
	Disrupt Disruptor // nil in standalone mode
	Reboot  Rebooter
	Units   HostUnits // nil when no host GPU clients are configured
	CDI     CDI       // nil: no CDI step
	Notify  Notifier
	Metrics Metrics
	Journal *journal.Journal
	File    *gpus.ConfigFile
	Clock   clock.WithTicker
	Version string
	// BootID identifies the current boot (a reboot changes it).
	BootID func() string
	// Inhibit holds off shutdown while NVML is mid-change (optional).
	Inhibit Inhibitor
	// Others finds another MIG manager at work on this node (optional).
	Others OtherManagers
	// Slots limits how many nodes are disrupted at once (optional;
	// --max-concurrent).
	Slots Slots
	// Owner confirms the node is still this agent's before every
	// GPU-mutating step (optional; nil: standalone).
	Owner Owner
	// Hooks are the nvidia-mig-parted hooks run around each change in
	// standalone mode (S.HooksFile; nil: none).
	Hooks gpus.Hooks
	// Startup lifts the startup taints once the node has converged
	// (optional; nil: none configured).
	Startup StartupTaints

	// status is what the gauges show (report); statusMu guards it.
	statusMu sync.Mutex
	status   Status

	ready    atomic.Bool
	nvmlDown atomic.Bool // the last attempt to open NVML failed
	nvmlFail int         // consecutive failures to open NVML
	// nvmlDownSince: when NVML became unavailable (UnixNano; 0 while up).
	nvmlDownSince atomic.Int64
	drifted       bool
	// stateDecided: migagent_state shows a state (showState); before, all 0.
	stateDecided bool
	// api: whether the API server answers (the Node watch, a probe).
	api apihealth.Health
	// fileErr is why the config file did not read at the last pass (reload.go).
	fileErr error
	// unusableSeen is the set of unusable GPUs last reported (noteUnusable).
	unusableSeen string
	// removals is Request.Seq as the last pass saw it.
	removals uint64
	// badMoves counts moves between phases that journal.CanMove does not list.
	badMoves atomic.Int64
	// lifted: the startup taints are off the Node.
	lifted bool

	// superseded is the rollout slot of a change a newer request stopped:
	// handed on once that change is ended (handOn).
	superseded Slot
	// nodeNow is the Node as the watch shows it now (nil: no watch yet).
	nodeNow func() (*Node, bool)

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

// markNVMLDown notes NVML unavailable, and since when.
func (d *Daemon) markNVMLDown() {
	d.nvmlDown.Store(true)
	d.nvmlDownSince.CompareAndSwap(0, d.Clock.Now().UnixNano())
}

// Live is the liveness of /healthz: an error once NVML has been
// unavailable for --nvml-unavailable-restart (0: never). The container
// restarted then gets the driver's library again: the NVIDIA container
// runtime injects it when a container is created, so a container created
// while the driver was away (a driver reload by the GPU Operator) never
// sees it, however long it waits (cf. gpu-operator issue 2854 for DCGM).
func (d *Daemon) Live() error {
	since := d.nvmlDownSince.Load()
	if d.S == nil || d.S.NVMLUnavailableRestart <= 0 || since == 0 {
		return nil
	}
	down := d.Clock.Since(time.Unix(0, since))
	if down < d.S.NVMLUnavailableRestart {
		return nil
	}
	return fmt.Errorf("NVML has been unavailable for %s (--nvml-unavailable-restart %s): restart the agent so that its container gets the driver's library again",
		down.Round(time.Second), d.S.NVMLUnavailableRestart)
}

// openNVML opens an NVML session for one pass (End closes it: an idle
// agent holds none, so a driver upgrade can unload the module). When NVML
// cannot be opened (no driver yet, the module unloaded) the agent is not
// ready and migagent_nvml_up is 0 until a retry succeeds.
func (d *Daemon) openNVML() bool {
	err := d.GPU.Begin()
	if err == nil {
		d.nvmlDownSince.Store(0)
		if d.nvmlDown.Swap(false) {
			d.Log.Info("NVML is open again", "after", d.nvmlFail)
		}
		d.nvmlFail = 0
		d.report(func(s *Status) { s.NVMLUp = true })
		return true
	}
	d.nvmlFail++
	d.markNVMLDown()
	d.report(func(s *Status) { s.NVMLUp = false })
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
	d.markNVMLDown()
	d.report(func(s *Status) { s.NVMLUp = false })
	d.Log.Error("NVML is not back after a GPU reset; not ready, opening it again with backoff", "err", err)
	_ = d.notify().Status("NVML not back after a GPU reset: %v", err)
}

// nvmlBackoff is the wait before the next attempt to open NVML
// (backoff.NVMLOpen: 1 s doubling to 2 min, ±20%).
func (d *Daemon) nvmlBackoff() time.Duration { return backoff.NVMLOpen(d.nvmlFail) }

func (d *Daemon) notify() Notifier {
	if d.Notify == nil {
		return nopNotifier{}
	}
	return d.Notify
}

// discover reads the GPUs and refreshes the GPU metrics.
func (d *Daemon) discover() (*gpus.Inventory, error) {
	n, err := gpus.Discover(d.GPU)
	d.report(func(s *Status) { s.NVMLUp = err == nil })
	d.Metrics.Collected("nvml", err != nil)
	if err != nil {
		return nil, err
	}
	d.showGPUs(n)
	return n, nil
}

// showGPUs sets the GPU metrics from n.
func (d *Daemon) showGPUs(n *gpus.Inventory) {
	d.report(func(s *Status) { s.GPUs = n })
}

// report changes the daemon's status with change and reports it whole.
func (d *Daemon) report(change func(s *Status)) {
	d.statusMu.Lock()
	defer d.statusMu.Unlock()
	change(&d.status)
	d.Metrics.Report(d.status)
}

// noteUnusable logs and posts a Warning Event when the set of GPUs NVML
// cannot open changes (once per change, not at every pass).
func (d *Daemon) noteUnusable(ctx context.Context, node *Node, n *gpus.Inventory) {
	var key string
	for _, u := range n.Unusable {
		key += fmt.Sprintf("{%d %s} ", u.Index, u.Return)
	}
	if key == d.unusableSeen {
		return
	}
	d.unusableSeen = key
	for _, u := range n.Unusable {
		d.Log.Warn("GPU cannot be opened through NVML; leaving it alone", "gpu", u.Index, "return", u.Return, "err", u.Reason)
		d.event(ctx, node, EventWarning, record.ReasonGPUUnusable,
			fmt.Sprintf("GPU %d cannot be opened through NVML (%s): mig-agent leaves it alone, and a config that names it fails", u.Index, u.Reason))
	}
}

// reconcile decides what to do for the node as it is now. start is true
// for the first pass after the process started; v is what the pass read
// and planned already (nil: nothing yet), so that one pass reads the GPUs
// once and plans once.
func (d *Daemon) reconcile(ctx context.Context, node *Node, start, retry bool, v *view) outcome {
	req := d.Cluster.Desired(node)
	desired := req.Config
	d.report(func(s *Status) { s.Desired = desired })
	d.reloadFile()
	j := &d.Journal.State
	if d.forgetReboot(desired) {
		// A new value of the label is a new change: it may reboot once.
		d.saveJournal()
	}
	// A label set to "" is a request too: it fails with a reason (attempt).
	if !req.Asked {
		d.labelRemoved(ctx, v)
		d.handOn(false)
		return outSuccess
	}
	if req.Seq != d.removals {
		// The label was removed and set again since the last pass: the
		// removal is handled first, so the value set is a new request.
		d.removals = req.Seq
		d.labelRemoved(ctx, v)
	}
	if j.Change != nil && j.Change.Config != desired {
		d.abandon(ctx, j.Change, fmt.Sprintf("the desired config changed to %q", desired), v.inventory())
	}
	// The same change asked again: its attempt takes its own slot again.
	d.handOn(j.Change != nil)
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
		if v != nil && !gpus.PlanChanges(v.plan) && !d.redefined(v) {
			return outSuccess
		}
	case !retry && j.Waiting(desired, d.Clock.Now()):
		return outRetry
	}
	return d.attempt(ctx, node, req, v)
}

// nvmlStarted reports whether a change in phase may have touched a GPU:
// before applying, only the taint, operands and pods were.
func nvmlStarted(phase journal.Phase) bool {
	return phase != journal.PhasePending && phase != journal.PhaseDraining && phase != ""
}

// restore starts stopped units, restores operand labels and removes the
// taint, as the journal says; the API calls ride out an API server outage
// (retryAPI). A taint that still could not be lifted is lifted by the next
// change, which takes it as its own.
func (d *Daemon) restore(ctx context.Context, ch *journal.Change) {
	ctx = context.WithoutCancel(ctx)
	if len(ch.StoppedUnits) > 0 && d.Units != nil {
		if err := d.Units.Start(ctx, ch.StoppedUnits); err != nil {
			d.Log.Error("starting host GPU clients failed", "units", ch.StoppedUnits, "err", err)
		} else {
			ch.StoppedUnits = nil
		}
	}
	if d.Disrupt != nil {
		d.Disrupt.Release(ctx, ch, d.step(ctx, false))
	}
	d.saveJournal()
}

func (d *Daemon) saveJournal() {
	err := d.Journal.Save()
	if err != nil {
		d.Log.Error("writing the journal failed", "path", d.Journal.Path(), "err", err)
	}
	d.crashHook()
}

// backoff is the wait before retry number n (1-based) of a failed change.
func (d *Daemon) backoff(n int) time.Duration {
	return backoff.Failure(n, d.S.RetryBackoffMax).Round(time.Second)
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
	d.report(func(s *Status) { s.State = state })
}

// settleState decides migagent_state after a pass that set none (there
// was nothing to do): the state the Node shows or, standalone, success once
// the selected config is handled. Until a state is decided all four are 0:
// a gauge that said success before the agent looked would count the node
// among the converged ones.
func (d *Daemon) settleState(node *Node) {
	switch {
	case d.stateDecided:
	case node != nil && node.State != "":
		d.showState(node.State)
	case node == nil && d.Journal.State.Handled != "" && d.Journal.State.Failing == "": // standalone: no Node
		d.showState(record.StateSuccess)
	}
}

func (d *Daemon) event(ctx context.Context, node *Node, evType, reason, msg string) {
	if err := d.Cluster.Event(context.WithoutCancel(ctx), node, evType, reason, msg); err != nil {
		d.Log.Warn("posting an event failed", "reason", reason, "err", err)
	}
}

// retryAPI retries an API call for up to two minutes (an API server
// restart) while its error is transient (backoff.Transient), with the
// jittered backoff of backoff.API; any other answer ends it at once.
func (d *Daemon) retryAPI(ctx context.Context, fn func() error) error {
	return backoff.Retry(ctx, d.Clock, outageRetry, d.Cluster.API().Transient, func(err error) {
		d.Log.Debug("API call failed; retrying", "err", err)
	}, fn)
}

// labelRemoved handles a removal of the desired label: the journaled change
// is abandoned and the label's next value is a new request, acted on at
// once (no backoff of an earlier failure), also when it names the config
// that is applied (a record follows).
func (d *Daemon) labelRemoved(ctx context.Context, v *view) {
	j := &d.Journal.State
	if j.Change != nil {
		d.abandon(ctx, j.Change, "the desired config label was removed", v.inventory())
		// Nothing is asked now: no state is true of the node (neither the
		// change's pending nor a failure of a request no one makes).
		d.setState(ctx, "")
	}
	j.ClearBackoff()
	// Its next value is a new request: it may reboot once.
	forgot := d.forgetReboot("")
	if j.Handled != "" || forgot {
		j.Handled = ""
		d.saveJournal()
	}
}

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
