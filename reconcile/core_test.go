package reconcile_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// The reconcile core on the simulator, with a fake clock and fake
// adapters: no API server, no kubelet. Each test drives passes as the loop
// runs them (Daemon.pass) and checks the GPUs, the journal, the records and
// what was done to pods.

// core is a daemon under test and what it runs on.
type core struct {
	d        *reconcile.Daemon
	sim      *nvmlx.Sim
	spec     string
	simState string
	stateDir string
	cluster  *testsupport.FakeCluster
	disrupt  *testsupport.FakeDisruptor
	reboot   *testsupport.FakeRebooter
	clock    *clocktesting.FakeClock
}

func testSettings() *settings.Settings {
	return &settings.Settings{NVML: "sim:test", Namespace: "mig-agent", Taint: true, EvictUnmanagedPods: true,
		RestartDevicePlugin: true, ResourceWaitTimeout: time.Minute, RebootMethod: settings.RebootNone,
		DrainTimeout: time.Minute, RetryBackoffMax: 40 * time.Second, DriftInterval: time.Minute}
}

// newCore builds a daemon over a fresh simulator with spec.
func newCore(t *testing.T, spec string, o nvmlsim.Options, config string) *core {
	t.Helper()
	dir := t.TempDir()
	c := &core{spec: spec, simState: filepath.Join(dir, "sim.json"), stateDir: filepath.Join(dir, "state"),
		cluster: testsupport.NewFakeCluster(config), disrupt: testsupport.NewFakeDisruptor(),
		reboot: &testsupport.FakeRebooter{}, clock: clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
	c.restart(t, o)
	t.Cleanup(func() {
		if n := c.d.BadMoves(); n > 0 {
			t.Errorf("%d moves between phases that journal.CanMove does not list", n)
		}
	})
	return c
}

// restart builds the daemon afresh over the same GPUs, journal and
// cluster, as a new process would (o: the simulator's options).
func (c *core) restart(t *testing.T, o nvmlsim.Options) {
	t.Helper()
	o.StatePath = c.simState
	c.sim = testsupport.NewSim(t, c.spec, o)
	j, err := journal.Open(c.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	sim := c.sim
	c.d = &reconcile.Daemon{S: testSettings(), Log: testsupport.Discard(), GPU: sim, Cluster: c.cluster, Disrupt: c.disrupt,
		Reboot: c.reboot, Metrics: testsupport.FakeMetrics{}, Journal: j, Clock: c.clock, Version: "test",
		BootID: func() string { return fmt.Sprintf("boot-%d", sim.BootCount()) }}
}

// pass runs one reconcile pass on the Node as the watch shows it.
func (c *core) pass(start, retry bool) reconcile.Outcome {
	oc, _ := c.d.Pass(context.Background(), func() (*reconcile.Node, bool) { return c.cluster.Seen(), true }, start, retry)
	return oc
}

// holds reports whether the GPUs hold config name.
func (c *core) holds(t *testing.T, name string) bool {
	t.Helper()
	n, err := gpus.Discover(c.sim)
	if err != nil {
		t.Fatal(err)
	}
	spec, _, err := gpus.Lookup(c.d.File, name, n.GPUs)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := geometry.BuildPlan(spec, name, n.GPUs)
	if err != nil {
		t.Fatal(err)
	}
	return !gpus.PlanChanges(plan)
}

// runPods puts a pod on every MIG device of the GPUs; it returns the pods
// on devices of a profile other than keep, sorted: those that an
// all-balanced → all-<keep> change evicts.
func (c *core) runPods(t *testing.T, keep string, indices ...int) (doomed []string) {
	t.Helper()
	n, err := gpus.Discover(c.sim)
	if err != nil {
		t.Fatal(err)
	}
	for _, gpu := range indices {
		for _, gi := range n.Instances[gpu] {
			for _, ci := range gi.ComputeInstances {
				name := fmt.Sprintf("ml/gpu%d-%s-at%d", gpu, gi.Profile, gi.Placement.Start)
				c.disrupt.Pods[name] = ci.UUID
				if gi.Profile != keep {
					doomed = append(doomed, name)
				}
			}
		}
	}
	sort.Strings(doomed)
	return doomed
}

// applied brings the GPUs and the journal to config name through a pass.
func (c *core) applied(t *testing.T, name string) {
	t.Helper()
	c.cluster.SetLabel(name)
	if oc := c.pass(true, false); oc != reconcile.OutSuccess || !c.holds(t, name) {
		t.Fatalf("applying %s: reconcile.Outcome %v, record %+v", name, oc, c.cluster.Last())
	}
}

func wantSuccess(t *testing.T, c *core, config string) record.ChangeRecord {
	t.Helper()
	rec := c.cluster.Last()
	if rec.Result != record.StateSuccess || rec.Config != config || rec.Reason != "" {
		t.Fatalf("last record %+v, want success of %s", rec, config)
	}
	if !c.holds(t, config) {
		t.Fatalf("the GPUs do not hold %s", config)
	}
	j := c.d.Journal.State
	if j.Change != nil || j.Applied != config || j.Handled != config {
		t.Fatalf("journal %+v, want %s applied and handled, no change", j, config)
	}
	if c.disrupt.Tainted {
		t.Fatal("the node is still tainted")
	}
	if got := c.cluster.Seen().State; got != record.StateSuccess {
		t.Fatalf("state label %q", got)
	}
	return rec
}

// A change resumes at the phase its journal holds: a crash before the
// GPUs were touched (pending, draining) redoes the disruption, evicting
// the pods still there; a crash later (applying, restoring, refreshing)
// evicts nothing more, finishes the GPUs and records what the journal
// says was done.
func TestCoreResumeAtEachPhase(t *testing.T) {
	for _, tc := range []struct {
		phase journal.Phase
		// gpusDone: the GPUs already hold the new config.
		gpusDone    bool
		wantAffect  bool
		wantRestart bool
	}{
		{phase: journal.PhasePending, wantAffect: true},
		{phase: journal.PhaseDraining, wantAffect: true},
		{phase: journal.PhaseApplying},
		{phase: journal.PhaseRestoring, gpusDone: true},
		{phase: journal.PhaseRefreshing, gpusDone: true, wantRestart: true},
	} {
		t.Run(string(tc.phase), func(t *testing.T) {
			c := newCore(t, "h200x2", nvmlsim.Options{}, "")
			c.applied(t, "all-balanced")
			pods := c.runPods(t, "1g.18gb", 0, 1)
			// The state a crash at this phase leaves.
			ch := &journal.Change{Config: "all-1g.18gb", PreviousConfig: "all-balanced", RequestedBy: "test",
				StartedAt: c.clock.Now(), Phase: tc.phase, GPUsChanged: []int{0, 1}, GPUsUntouched: []int{},
				NodeUID: "uid-1", TaintAdded: tc.phase != journal.PhasePending}
			if tc.phase == journal.PhaseApplying {
				// GPU 0 was done when the agent stopped; GPU 1 was not.
				f := testsupport.ParseSpec(t, "version: v1\nmig-configs:\n  gpu0:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 7}\n")
				if _, err := testsupport.ApplyConfig(t, c.sim, f, "gpu0", gpus.ApplyOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.gpusDone {
				if _, err := testsupport.ApplyConfig(t, c.sim, nil, "all-1g.18gb", gpus.ApplyOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.wantAffect {
				ch.Evicted = slices.Clone(pods) // evicted before the crash
				for _, p := range pods {
					delete(c.disrupt.Pods, p)
				}
			}
			if tc.phase == journal.PhaseRefreshing {
				ch.StalePlugins = []string{"gpu-operator/nvidia-device-plugin-daemonset-x/uid-dp"}
			}
			c.disrupt.Tainted = ch.TaintAdded
			c.d.Journal.State.Change, c.d.Journal.State.Handled = ch, ""
			if err := c.d.Journal.Save(); err != nil {
				t.Fatal(err)
			}
			c.cluster.SetLabel("all-1g.18gb")
			c.restart(t, nvmlsim.Options{})
			c.disrupt.AffectedCalls, c.disrupt.Evicted = 0, nil

			if oc := c.pass(true, false); oc != reconcile.OutSuccess {
				t.Fatalf("reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
			}
			rec := wantSuccess(t, c, "all-1g.18gb")
			if got := c.disrupt.AffectedCalls > 0; got != tc.wantAffect {
				t.Errorf("looked for affected pods: %v, want %v", got, tc.wantAffect)
			}
			if got := slices.Sorted(slices.Values(c.disrupt.Evicted)); tc.wantAffect && !slices.Equal(got, pods) {
				t.Errorf("evicted %v, want %v", c.disrupt.Evicted, pods)
			}
			if !tc.wantAffect && len(c.disrupt.Evicted) != 0 {
				t.Errorf("evicted %v after the GPUs were touched", c.disrupt.Evicted)
			}
			if got := slices.Sorted(slices.Values(rec.EvictedPods)); !slices.Equal(got, pods) {
				t.Errorf("record evictedPods %v, want %v", got, pods)
			}
			if !slices.Equal(rec.GPUsChanged, []int{0, 1}) || rec.PreviousConfig != "all-balanced" {
				t.Errorf("record gpusChanged %v previous %q", rec.GPUsChanged, rec.PreviousConfig)
			}
			if tc.wantRestart != slices.ContainsFunc(c.disrupt.Restarted, func(p []string) bool {
				return slices.Equal(p, []string{"gpu-operator/nvidia-device-plugin-daemonset-x/uid-dp"})
			}) {
				t.Errorf("device plugin restarts %v, want the journaled one: %v", c.disrupt.Restarted, tc.wantRestart)
			}
		})
	}
}

// A new label mid-change stops the change where it safely can (waiting
// for evictions), leaves the GPUs untouched, and the next pass abandons it
// (undoing its taint, recording why) and applies the new config.
func TestCoreSupersede(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	c.runPods(t, "1g.18gb", 1)
	c.cluster.SetLabel("all-1g.18gb")
	c.disrupt.DuringEvict = func() {
		// What the Node watch does on a label change (Kube.Watch: Stale).
		c.cluster.SetLabel("all-3g.71gb")
		c.d.Supersede()
	}
	if oc := c.pass(false, false); oc != reconcile.OutSuccess {
		t.Fatalf("superseded pass: reconcile.Outcome %v, want the success that waits for the pending trigger", oc)
	}
	j := c.d.Journal.State
	if j.Change == nil || j.Change.Config != "all-1g.18gb" || j.Change.Phase != journal.PhaseDraining {
		t.Fatalf("journal change %+v, want all-1g.18gb kept at draining", j.Change)
	}
	if !c.holds(t, "all-balanced") || len(c.disrupt.Evicted) != 0 || !c.disrupt.Tainted {
		t.Fatalf("superseded change went on: GPUs balanced %v, evicted %v, tainted %v",
			c.holds(t, "all-balanced"), c.disrupt.Evicted, c.disrupt.Tainted)
	}

	if oc := c.pass(false, false); oc != reconcile.OutSuccess {
		t.Fatalf("reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	wantSuccess(t, c, "all-3g.71gb")
	var abandoned *record.ChangeRecord
	for i, r := range c.cluster.Records {
		if r.Config == "all-1g.18gb" {
			abandoned = &c.cluster.Records[i]
		}
	}
	if abandoned == nil || abandoned.Result != record.StateFailed || abandoned.Reason != `abandoned: the desired config changed to "all-3g.71gb"` {
		t.Fatalf("record of the superseded change: %+v", abandoned)
	}
}

// A failure that may pass is retried after a backoff that grows (5 s
// doubling), is jittered (by up to a fifth) and capped at
// --retry-backoff-max; a pass before the retry is due touches nothing; the
// retry after the cause is gone succeeds.
func TestCoreBackoff(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	// A process no pod accounts for on a GPU instance the change destroys.
	n, err := gpus.Discover(c.sim)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(n.Instances[0], func(gi nvmlx.GPUInstance) bool { return gi.Profile != "1g.18gb" })
	gi := n.Instances[0][i]
	stray := nvmlx.Process{PID: 4242, GIID: gi.ID, CIID: gi.ComputeInstances[0].ID, Name: "python"}
	if err := c.sim.AddProcess(0, stray); err != nil {
		t.Fatal(err)
	}
	c.cluster.SetLabel("all-1g.18gb")

	const tries = 25
	maxWait := c.d.S.RetryBackoffMax
	var waits []time.Duration
	for i := range tries {
		records := len(c.cluster.Records)
		if oc := c.pass(false, i > 0); oc != reconcile.OutRetry {
			t.Fatalf("try %d: reconcile.Outcome %v, want a retry", i+1, oc)
		}
		if rec := c.cluster.Last(); len(c.cluster.Records) != records+1 || rec.Result != record.StateFailed || rec.Config != "all-1g.18gb" {
			t.Fatalf("try %d: record %+v", i+1, rec)
		}
		wait := c.d.Journal.State.RetryAt.Sub(c.clock.Now())
		waits = append(waits, wait)
		base := min(5*time.Second<<i, maxWait)
		if wait < base || wait > base+base/5+time.Second/2 {
			t.Fatalf("try %d: wait %v, want %v to %v (+ rounding)", i+1, wait, base, base+base/5)
		}
		// Not due yet: no attempt.
		c.clock.Step(wait - time.Second)
		if oc := c.pass(false, false); oc != reconcile.OutRetry || len(c.cluster.Records) != records+1 {
			t.Fatalf("try %d: a pass before the retry was due attempted the change", i+1)
		}
		c.clock.Step(time.Second)
	}
	capped := waits[5:] // 5, 10, 20, 40 s: capped from the fourth on
	if slices.Min(capped) == slices.Max(capped) {
		t.Errorf("the waits at the cap are all %v: no jitter", capped[0])
	}
	if !c.holds(t, "all-balanced") {
		t.Fatal("a failed change touched the GPUs")
	}
	if err := c.sim.RemoveProcess(0, stray.PID); err != nil {
		t.Fatal(err)
	}
	if oc := c.pass(false, true); oc != reconcile.OutSuccess {
		t.Fatalf("retry after the cause went: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	wantSuccess(t, c, "all-1g.18gb")
	if p := c.d.Journal.State.Progress; p.Failing != "" || p.Attempts != 0 || !p.RetryAt.IsZero() {
		t.Errorf("backoff kept after success: %+v", p)
	}
}

// The node says pending as soon as the request is known valid and needed,
// alongside the checks' reads and before the preflight and the journal
// (label → pending, docs/bench.md). A
// preflight that then refuses leaves nothing journaled and nothing touched,
// and the state goes on to failed with the reason; once the rights are
// there the retry applies the change.
func TestCorePendingBeforePreflight(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	c.cluster.SetLabel("all-1g.18gb")
	started := c.cluster.Count(record.ReasonStarted)
	var stateAt, journaled []string
	refuse := true
	c.cluster.PreflightFunc = func() error {
		stateAt = append(stateAt, c.cluster.Seen().State)
		if ch := c.d.Journal.State.Change; ch != nil {
			journaled = append(journaled, ch.Config)
		}
		if refuse {
			return errors.New(`nodes "node-1" is forbidden: cannot patch`)
		}
		return nil
	}
	if oc := c.pass(false, false); oc != reconcile.OutRetry {
		t.Fatalf("preflight refused: reconcile.Outcome %v, want a retry", oc)
	}
	if !slices.Equal(stateAt, []string{record.StatePending}) || len(journaled) != 0 {
		t.Fatalf("at the preflight: state %v, journaled %v; want pending, nothing journaled", stateAt, journaled)
	}
	rec := c.cluster.Last()
	if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "forbidden") || c.cluster.Seen().State != record.StateFailed {
		t.Fatalf("after the refusal: record %+v, state %q", rec, c.cluster.Seen().State)
	}
	if c.d.Journal.State.Change != nil || c.cluster.Count(record.ReasonStarted) != started {
		t.Fatalf("a refused change was journaled (%+v) or announced started (events %v)", c.d.Journal.State.Change, c.cluster.Events)
	}
	if !c.holds(t, "all-balanced") {
		t.Fatal("a change the preflight refused touched the GPUs")
	}
	refuse = false
	c.clock.Step(c.d.Journal.State.RetryAt.Sub(c.clock.Now()))
	if oc := c.pass(false, true); oc != reconcile.OutSuccess {
		t.Fatalf("retry with the rights: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	wantSuccess(t, c, "all-1g.18gb")
}

// A change mid-drain whose Node was deleted and made again goes back to
// pending (sameNode): the new Node says pending before its disruption is
// redone, though the change was not announced afresh in checkNode.
func TestCoreRecreatedNodeSaysPending(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	ch := &journal.Change{Config: "all-1g.18gb", PreviousConfig: "all-balanced", RequestedBy: "test",
		StartedAt: c.clock.Now(), Phase: journal.PhaseDraining, GPUsChanged: []int{0, 1}, GPUsUntouched: []int{},
		NodeUID: "uid-of-the-deleted-node", TaintAdded: true}
	c.d.Journal.State.Change, c.d.Journal.State.Handled = ch, ""
	if err := c.d.Journal.Save(); err != nil {
		t.Fatal(err)
	}
	c.cluster.SetLabel("all-1g.18gb")
	c.restart(t, nvmlsim.Options{})
	from := len(c.cluster.States)
	if oc := c.pass(true, false); oc != reconcile.OutSuccess {
		t.Fatalf("reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	if got := c.cluster.States[from:]; len(got) == 0 || got[0] != record.StatePending {
		t.Fatalf("states written %v: the new Node was not told pending first", got)
	}
	wantSuccess(t, c, "all-1g.18gb")
}

// Another MIG manager found while pending is being written (slowly): the
// refusal's failed comes after pending, never before it, so the node ends
// failed; nothing is journaled, announced or touched.
func TestCorePendingThenRefused(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	c.cluster.SetLabel("all-1g.18gb")
	c.d.Others = testsupport.FakeOthers{Other: "the GPU Operator's MIG manager (pod gpu-operator/nvidia-mig-manager-x)"}
	c.cluster.SlowState = 50 * time.Millisecond
	started, from := c.cluster.Count(record.ReasonStarted), len(c.cluster.States)
	if oc := c.pass(false, false); oc == reconcile.OutSuccess {
		t.Fatal("a change went ahead beside another MIG manager")
	}
	if got := c.cluster.States[from:]; !slices.Equal(got, []string{record.StatePending, record.StateFailed}) || c.cluster.Seen().State != record.StateFailed {
		t.Fatalf("states written %v, node at %q; want pending then failed", got, c.cluster.Seen().State)
	}
	if rec := c.cluster.Last(); !strings.Contains(rec.Reason, "another MIG manager") || c.cluster.Count(record.ReasonManagerConflict) == 0 {
		t.Errorf("record %+v: the reason does not name the other manager, or no Event", rec)
	}
	if c.d.Journal.State.Change != nil || c.cluster.Count(record.ReasonStarted) != started || !c.holds(t, "all-balanced") {
		t.Fatal("a refused change was journaled, announced or applied")
	}
}

// GPUs changed behind the agent's back are reported once as drift (Event,
// metric) and left alone; with --reapply-on-drift the applied config is
// applied again.
func TestCoreDrift(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	drift := func() reconcile.Outcome {
		t.Helper()
		if !c.d.OpenNVML() {
			t.Fatal("NVML down")
		}
		defer c.d.GPU.End()
		return c.d.CheckDrift(context.Background(), c.cluster.Seen(), true)
	}
	if oc := drift(); oc != reconcile.OutSuccess || c.cluster.Count(record.ReasonDrift) != 0 {
		t.Fatalf("no drift yet: reconcile.Outcome %v, drift events %d", oc, c.cluster.Count(record.ReasonDrift))
	}
	// Someone else re-carves GPU 1.
	other := testsupport.ParseSpec(t, "version: v1\nmig-configs:\n  other:\n    - devices: [1]\n      mig-enabled: true\n      mig-devices: {\"7g.141gb\": 1}\n")
	if _, err := testsupport.ApplyConfig(t, c.sim, other, "other", gpus.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	records := len(c.cluster.Records)
	for range 2 {
		if oc := drift(); oc != reconcile.OutSuccess {
			t.Fatalf("reconcile.Outcome %v", oc)
		}
	}
	if got := c.cluster.Count(record.ReasonDrift); got != 1 {
		t.Errorf("%d drift events over two checks, want 1", got)
	}
	if c.holds(t, "all-balanced") || len(c.cluster.Records) != records {
		t.Fatal("drift without --reapply-on-drift changed the GPUs or recorded a change")
	}

	c.d.S.ReapplyOnDrift = true
	if oc := drift(); oc != reconcile.OutSuccess {
		t.Fatalf("reapply: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	rec := wantSuccess(t, c, "all-balanced")
	if !slices.Equal(rec.GPUsChanged, []int{1}) {
		t.Errorf("reapply changed GPUs %v, want [1]", rec.GPUsChanged)
	}
	if oc := drift(); oc != reconcile.OutSuccess || c.cluster.Count(record.ReasonDrift) != 1 {
		t.Errorf("after the reapply: reconcile.Outcome %v, drift events %d", oc, c.cluster.Count(record.ReasonDrift))
	}
}

// A MIG mode change that needs a reboot asks for it once, waits through a
// restart on the same boot without asking again, and finishes after the
// reboot; the record says a reboot was made.
func TestCoreRebootResume(t *testing.T) {
	noReset := nvmlsim.Options{NoReset: true}
	c := newCore(t, "a100-40gbx2", noReset, "")
	f := testsupport.ParseSpec(t, "version: v1\nmig-configs:\n  gpu1:\n    - devices: [1]\n      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 2}\n")
	setup := func() {
		c.d.File = f
		c.d.S.RebootMethod = settings.RebootSystemctl
	}
	setup()
	c.cluster.SetLabel("gpu1")
	if oc := c.pass(true, false); oc != reconcile.OutRebooting {
		t.Fatalf("reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	ch := c.d.Journal.State.Change
	if c.reboot.Calls != 1 || ch == nil || ch.Phase != journal.PhaseRebooting || c.d.Journal.State.RebootFor == nil || !c.d.Journal.State.RebootFor.Requested {
		t.Fatalf("reboots %d, journal change %+v", c.reboot.Calls, ch)
	}
	if rec := c.cluster.Last(); rec.Result != record.StateRebooting || !rec.Reboot {
		t.Fatalf("record %+v, want rebooting", rec)
	}

	// The agent restarts on the same boot: it waits, it does not reboot again.
	c.restart(t, noReset)
	setup()
	if oc := c.pass(true, false); oc != reconcile.OutRebooting || c.reboot.Calls != 1 {
		t.Fatalf("same boot: reconcile.Outcome %v, reboots %d", oc, c.reboot.Calls)
	}

	if err := nvmlsim.Reboot(c.simState); err != nil {
		t.Fatal(err)
	}
	c.restart(t, noReset)
	setup()
	if oc := c.pass(true, false); oc != reconcile.OutSuccess {
		t.Fatalf("after the reboot: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	rec := wantSuccess(t, c, "gpu1")
	if !rec.Reboot || c.reboot.Calls != 1 || !slices.Equal(rec.GPUsChanged, []int{1}) {
		t.Errorf("record reboot %v gpusChanged %v, reboots asked %d", rec.Reboot, rec.GPUsChanged, c.reboot.Calls)
	}
	if c.d.Journal.State.RebootFor != nil {
		t.Errorf("reboot mark kept after success: %+v", c.d.Journal.State.RebootFor)
	}
}

// A label removed and set again between two passes is two requests: the
// pass that sees the removal count grown handles the removal first, so the
// value set again is acted on at once, not after the backoff of the failed
// request before it.
// The device plugin pods that read the old geometry are evicted while the
// agent's taint still keeps their DaemonSet from placing new ones, so that
// lifting the taint is the Node update on which the DaemonSet controller
// places them; the taint is lifted after.
func TestCoreDevicePluginRestartedBeforeTaintLifted(t *testing.T) {
	c := newCore(t, "h200x1", nvmlsim.Options{}, "")
	c.disrupt.Plugins = []string{"gpu-operator/nvidia-device-plugin-daemonset-x/uid-dp"}
	c.cluster.SetLabel("all-1g.18gb")
	if oc := c.pass(false, false); oc != reconcile.OutSuccess {
		t.Fatalf("reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	if !slices.Equal(c.disrupt.RestartedTainted, []bool{true}) {
		t.Errorf("restarts %v tainted %v, want one, while tainted", c.disrupt.Restarted, c.disrupt.RestartedTainted)
	}
	if c.disrupt.Tainted {
		t.Error("the taint is still on after success")
	}
}

func TestCoreRelabelSkipsBackoff(t *testing.T) {
	c := newCore(t, "h200x1", nvmlsim.Options{Faults: "CreateGpuInstanceWithPlacement:1=ERROR_INSUFFICIENT_RESOURCES"}, "")
	c.cluster.SetLabel("all-balanced")
	if oc := c.pass(false, false); oc != reconcile.OutRetry || c.cluster.Last().Result != record.StateFailed {
		t.Fatalf("reconcile.Outcome %v, record %+v: want a failure retried with backoff", oc, c.cluster.Last())
	}
	// Not due: the same request waits for its backoff.
	if oc := c.pass(false, false); oc != reconcile.OutRetry {
		t.Fatalf("reconcile.Outcome %v, want the backoff's wait", oc)
	}
	// Removed and set again: one snapshot shows the value, the count grown.
	c.cluster.Update(func(n *reconcile.Node) { n.Request.Seq++ })
	if oc := c.pass(false, false); oc != reconcile.OutSuccess || c.cluster.Last().Result != record.StateSuccess {
		t.Fatalf("reconcile.Outcome %v, record %+v: want the new request acted on at once", oc, c.cluster.Last())
	}
}

// The config file defines the applied config anew (same name, new
// definition): the drift check applies it as a new request, without
// --reapply-on-drift, and records the hash before and after; a change made
// on the GPUs by hand afterwards is still only drift.
func TestCoreChangedDefinitionIsNewRequest(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	file := filepath.Join(t.TempDir(), "config.yaml")
	write := func(profile string, n int) {
		t.Helper()
		y := fmt.Sprintf("version: v1\nmig-configs:\n  mine:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {%q: %d}\n", profile, n)
		if err := os.WriteFile(file, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("1g.18gb", 7)
	c.d.S.ConfigFile = file
	c.applied(t, "mine")
	first := wantSuccess(t, c, "mine")
	drift := func() reconcile.Outcome {
		t.Helper()
		if !c.d.OpenNVML() {
			t.Fatal("NVML down")
		}
		defer c.d.GPU.End()
		return c.d.CheckDrift(context.Background(), c.cluster.Seen(), true)
	}
	records := len(c.cluster.Records)
	if oc := drift(); oc != reconcile.OutSuccess || len(c.cluster.Records) != records {
		t.Fatalf("unchanged file: reconcile.Outcome %v, %d new records", oc, len(c.cluster.Records)-records)
	}

	write("3g.71gb", 2)
	if oc := drift(); oc != reconcile.OutSuccess {
		t.Fatalf("changed definition: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	rec := wantSuccess(t, c, "mine")
	if rec.PreviousConfig != "mine" || rec.PreviousConfigHash != first.ConfigHash || rec.ConfigHash == first.ConfigHash || rec.ConfigHash == "" {
		t.Errorf("record config %q previousConfig %q, hash %q previousConfigHash %q; first hash %q",
			rec.Config, rec.PreviousConfig, rec.ConfigHash, rec.PreviousConfigHash, first.ConfigHash)
	}
	if !slices.Equal(rec.GPUsChanged, []int{0, 1}) {
		t.Errorf("gpusChanged %v, want [0 1]", rec.GPUsChanged)
	}
	if c.d.Journal.State.AppliedHash != rec.ConfigHash {
		t.Errorf("journal applied hash %q, want %q", c.d.Journal.State.AppliedHash, rec.ConfigHash)
	}
	if got := c.cluster.Count(record.ReasonDrift); got != 0 {
		t.Errorf("%d drift events for a changed definition, want 0", got)
	}
	// Checked again: nothing more to do.
	records = len(c.cluster.Records)
	if oc := drift(); oc != reconcile.OutSuccess || len(c.cluster.Records) != records {
		t.Errorf("after the new definition: reconcile.Outcome %v, %d new records", oc, len(c.cluster.Records)-records)
	}
	// A hand-made change on the GPUs: drift, not re-applied
	// (--reapply-on-drift is off).
	other := testsupport.ParseSpec(t, "version: v1\nmig-configs:\n  other:\n    - devices: [1]\n      mig-enabled: true\n      mig-devices: {\"7g.141gb\": 1}\n")
	if _, err := testsupport.ApplyConfig(t, c.sim, other, "other", gpus.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if oc := drift(); oc != reconcile.OutSuccess || c.cluster.Count(record.ReasonDrift) != 1 || len(c.cluster.Records) != records {
		t.Errorf("hand-made change: reconcile.Outcome %v, drift events %d, %d new records", oc, c.cluster.Count(record.ReasonDrift), len(c.cluster.Records)-records)
	}

	// At start, a definition changed while the agent was away is acted on
	// too, even where the GPUs happen to match (only the hash differs).
	write("7g.141gb", 1) // GPU 1 holds this by hand; GPU 0 does not
	c.restart(t, nvmlsim.Options{})
	c.d.S.ConfigFile = file
	if oc := c.pass(true, false); oc != reconcile.OutSuccess {
		t.Fatalf("start pass: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	rec2 := wantSuccess(t, c, "mine")
	if rec2.PreviousConfigHash != rec.ConfigHash || rec2.ConfigHash == rec.ConfigHash {
		t.Errorf("start: hash %q previousConfigHash %q, want previous %q", rec2.ConfigHash, rec2.PreviousConfigHash, rec.ConfigHash)
	}
}

// The CDI step runs once after a change that touched GPUs, not for a
// config already applied; a failure is a named, retryable failure whose
// retry runs the step again (the change stays journaled) and then succeeds.
func TestCoreCDIAfterChange(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	f := &testsupport.FakeCDI{}
	c.d.CDI = f
	c.applied(t, "all-1g.18gb")
	if f.Calls != 1 {
		t.Fatalf("CDI refreshed %d times after a change, want 1", f.Calls)
	}
	c.cluster.SetLabel("all-1g.18gb")
	c.d.Journal.State.Handled = ""
	if oc := c.pass(false, false); oc != reconcile.OutSuccess || f.Calls != 1 {
		t.Fatalf("config already applied: reconcile.Outcome %v, CDI calls %d, want 1", oc, f.Calls)
	}
	f.Fail = errors.New("nvidia-ctk system create-device-nodes: exit status 1: permission denied")
	c.cluster.SetLabel("all-balanced")
	if oc := c.pass(false, false); oc != reconcile.OutRetry {
		t.Fatalf("reconcile.Outcome %v, want a retry", oc)
	}
	rec := c.cluster.Last()
	if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "refreshing CDI failed: nvidia-ctk system create-device-nodes") {
		t.Fatalf("record %+v", rec)
	}
	if c.d.Journal.State.Change == nil {
		t.Fatal("the change left the journal: its retry would not refresh CDI")
	}
	f.Fail = nil
	if oc := c.pass(false, true); oc != reconcile.OutSuccess {
		t.Fatalf("retry: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	wantSuccess(t, c, "all-balanced")
	if f.Calls != 3 {
		t.Errorf("CDI calls %d, want 3", f.Calls)
	}
}

// downGPU is a GPU whose NVML cannot be opened while down is set (the
// driver unloaded).
type downGPU struct {
	nvmlx.GPU
	down bool
}

func (g *downGPU) Begin() error {
	if g.down {
		return errors.New("NVML: Driver Not Loaded")
	}
	return g.GPU.Begin()
}

// /healthz (Live) fails once NVML has been unavailable for
// --nvml-unavailable-restart, counted from the first failure, and passes
// again once it opens; 0 never fails it.
func TestCoreLiveAfterNVMLUnavailable(t *testing.T) {
	c := newCore(t, "h200x1", nvmlsim.Options{}, "")
	g := &downGPU{GPU: c.d.GPU, down: true}
	c.d.GPU = g
	c.d.S.NVMLUnavailableRestart = 5 * time.Minute
	if err := c.d.Live(); err != nil {
		t.Fatalf("Live before any failure: %v", err)
	}
	if c.d.OpenNVML() {
		t.Fatal("NVML opened while down")
	}
	c.clock.Step(4 * time.Minute)
	if c.d.OpenNVML() || c.d.Live() != nil {
		t.Fatalf("Live after 4m down: %v, want nil", c.d.Live())
	}
	c.clock.Step(time.Minute)
	err := c.d.Live()
	if err == nil || !strings.Contains(err.Error(), "NVML has been unavailable for 5m0s") {
		t.Fatalf("Live after 5m down = %v", err)
	}
	c.d.S.NVMLUnavailableRestart = 0
	if err := c.d.Live(); err != nil {
		t.Errorf("Live with the setting off: %v", err)
	}
	c.d.S.NVMLUnavailableRestart = 5 * time.Minute
	g.down = false
	if !c.d.OpenNVML() {
		t.Fatal("NVML did not open")
	}
	c.d.GPU.End()
	if err := c.d.Live(); err != nil {
		t.Errorf("Live once NVML is back: %v", err)
	}
	// A new outage counts from its own start.
	g.down = true
	c.d.OpenNVML()
	c.clock.Step(time.Minute)
	if err := c.d.Live(); err != nil {
		t.Errorf("Live 1m into a new outage: %v", err)
	}
}

// Host GPU clients are stopped for a change without a mode change too
// where their processes block it, and started again after; without them
// the failure says what to do.
func TestCoreHostClientsStoppedForBlockingProcesses(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	n, err := gpus.Discover(c.sim)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(n.Instances[0], func(gi nvmlx.GPUInstance) bool { return gi.Profile != "1g.18gb" })
	gi := n.Instances[0][i]
	engine := nvmlx.Process{PID: 777, GIID: gi.ID, CIID: gi.ComputeInstances[0].ID, Name: "nv-hostengine"}
	if err := c.sim.AddProcess(0, engine); err != nil {
		t.Fatal(err)
	}
	// No host clients configured: a failure that names the holder and
	// what to do.
	c.cluster.SetLabel("all-1g.18gb")
	if oc := c.pass(false, false); oc != reconcile.OutRetry {
		t.Fatalf("reconcile.Outcome %v, want a retry", oc)
	}
	if r := c.cluster.Last().Reason; !strings.Contains(r, "pid 777 (nv-hostengine)") || !strings.Contains(r, "--host-gpu-clients") {
		t.Fatalf("reason %q", r)
	}
	units := &testsupport.FakeUnits{GPUs: c.sim, PID: map[string]uint32{"nvidia-dcgm.service": 777}}
	c.d.Units, c.d.S.HostGPUClients = units, []string{"nvidia-dcgm.service"}
	if oc := c.pass(false, true); oc != reconcile.OutSuccess {
		t.Fatalf("with host clients: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	wantSuccess(t, c, "all-1g.18gb")
	if !slices.Equal(units.Stopped, []string{"nvidia-dcgm.service"}) || !slices.Equal(units.Started, []string{"nvidia-dcgm.service"}) {
		t.Errorf("stopped %v, started %v", units.Stopped, units.Started)
	}
}

// The allocation path: a node served by the device plugin and the DRA
// driver at once is refused before anything is touched; on the DRA path
// the record says so, and a wait that does not converge fails the change
// with the DRA driver named.
func TestCoreAllocationPath(t *testing.T) {
	t.Run("both refused", func(t *testing.T) {
		c := newCore(t, "h200x2", nvmlsim.Options{}, "")
		c.applied(t, "all-balanced")
		pods := c.runPods(t, "1g.18gb", 0, 1)
		c.disrupt.Conflict = "nvidia.com/gpu in the Node's allocatable and gpu.nvidia.com ResourceSlice s1"
		c.cluster.SetLabel("all-1g.18gb")
		c.disrupt.AffectedCalls = 0
		if oc := c.pass(true, false); oc == reconcile.OutSuccess {
			t.Fatal("a node served by both paths was changed")
		}
		rec := c.cluster.Last()
		if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "both the device plugin and the NVIDIA DRA driver") {
			t.Fatalf("record %+v", rec)
		}
		if c.cluster.Count(record.ReasonAllocationPathConflict) != 1 || c.disrupt.AffectedCalls != 0 || len(c.disrupt.Evicted) != 0 || !c.holds(t, "all-balanced") {
			t.Fatalf("events %v, affected %d, evicted %v: something was touched", c.cluster.Events, c.disrupt.AffectedCalls, c.disrupt.Evicted)
		}
		if len(pods) == 0 {
			t.Fatal("no pods to keep")
		}
	})
	t.Run("dra", func(t *testing.T) {
		c := newCore(t, "h200x2", nvmlsim.Options{}, "")
		c.disrupt.Path = record.ServedByDRA
		c.applied(t, "all-balanced")
		if rec := c.cluster.Last(); rec.ServedBy != record.ServedByDRA {
			t.Fatalf("record servedBy %q", rec.ServedBy)
		}
		rec := neverConverges(t, c)
		if !strings.Contains(rec.Reason, "gpu.nvidia.com ResourceSlices did not announce exactly its devices") || rec.ServedBy != record.ServedByDRA {
			t.Fatalf("record %+v", rec)
		}
		if c.cluster.Count(record.ReasonResourcesTimeout) != 1 {
			t.Fatalf("events %v", c.cluster.Events)
		}
		if strings.Contains(rec.Reason, "was not replaced") {
			t.Errorf("reason blames a plugin pod that was never restarted: %s", rec.Reason)
		}
	})
	// The plugin restarted after the change and its DaemonSet made no new
	// pod: the reason says so, not "is it running?".
	t.Run("plugin not replaced", func(t *testing.T) {
		c := newCore(t, "h200x2", nvmlsim.Options{}, "")
		c.applied(t, "all-balanced")
		c.disrupt.Plugins = []string{"gpu-operator/nvidia-device-plugin-daemonset-x/uid-dp"}
		c.disrupt.NotReplaced = true
		rec := neverConverges(t, c)
		if len(c.disrupt.Restarted) != 1 || !strings.Contains(rec.Reason, "no plugin pod is on this node now: the one restarted was not replaced") ||
			!strings.Contains(rec.Reason, "the Node's allocatable did not show exactly its resources") {
			t.Fatalf("restarts %v, record %+v", c.disrupt.Restarted, rec)
		}
	})
}

// The device plugin pods that read the GPUs before the change are the
// change's own state, journaled: a wait after the agent restarted still
// knows them (their figures never count) and that their successors are on
// their way; nothing of it lives in the Disruptor.
func TestCoreOldPluginsJournaled(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	before := "gpu-operator/nvidia-device-plugin-daemonset-a/uid-a"
	c.disrupt.Plugins = []string{before}
	waits := len(c.disrupt.Waits)
	neverConverges(t, c)
	if len(c.disrupt.Waits) != waits+1 {
		t.Fatalf("%d waits, want 1", len(c.disrupt.Waits)-waits)
	}
	if w := c.disrupt.Waits[waits]; !slices.Equal(w.OldPlugins, []string{before}) || !w.PluginsRestarted {
		t.Fatalf("first wait given %+v", w)
	}
	j, err := journal.Open(c.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if ch := j.State.Change; ch == nil || !slices.Contains(ch.OldPlugins, before) || ch.PluginsRestarted {
		t.Fatalf("journaled change %+v: want the old plugin kept, the restart awaited", ch)
	}
	// The successor did not advertise the change; the agent restarts.
	after := "gpu-operator/nvidia-device-plugin-daemonset-b/uid-b"
	c.disrupt.Plugins = []string{after}
	c.restart(t, nvmlsim.Options{})
	yes := true
	c.disrupt.Converge = &yes
	if oc := c.pass(true, true); oc != reconcile.OutSuccess {
		t.Fatalf("retry after a restart: %v", oc)
	}
	last := c.disrupt.Waits[len(c.disrupt.Waits)-1]
	if !slices.Contains(last.OldPlugins, before) || !last.PluginsRestarted {
		t.Fatalf("wait after the agent's restart given %+v: the old plugin or the restart forgotten", last)
	}
}

// neverConverges asks c for all-1g.18gb with the resources never showing
// it, and returns the record the pass ends with (not a success).
func neverConverges(t *testing.T, c *core) record.ChangeRecord {
	t.Helper()
	no := false
	c.disrupt.Converge = &no
	c.cluster.SetLabel("all-1g.18gb")
	if oc := c.pass(true, false); oc == reconcile.OutSuccess {
		t.Fatal("success without the resources converging")
	}
	return c.cluster.Last()
}

// The config file as a ConfigMap volume mounts it (the chart's
// migConfigMap): the kubelet writes a new timestamped directory and swaps
// the ..data symlink to it. The next pass reads the file anew through the
// symlinks, with no restart: a config added to the ConfigMap is applied,
// and the record names the file as it is now.
func TestCoreConfigMapVolumeUpdateIsRead(t *testing.T) {
	c := newCore(t, "h200x1", nvmlsim.Options{}, "")
	dir := t.TempDir()
	text := "version: v1\nmig-configs:\n  first:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"7g.141gb\": 1}\n"
	publish := func(version, text string) {
		t.Helper()
		ts := filepath.Join(dir, "..2026_01_02_03_04_05."+version)
		if err := os.Mkdir(ts, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ts, "config.yaml"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	publish("1", text)
	if err := os.Symlink(filepath.Join("..data", "config.yaml"), filepath.Join(dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	c.d.S.ConfigFile = filepath.Join(dir, "config.yaml")
	c.applied(t, "first")
	wantSuccess(t, c, "first")

	text += "  second:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 7}\n"
	publish("2", text)
	c.cluster.SetLabel("second")
	if oc := c.pass(false, false); oc != reconcile.OutSuccess {
		t.Fatalf("a config added to the mounted ConfigMap: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	rec := wantSuccess(t, c, "second")
	sum := sha256.Sum256([]byte(text))
	if want := c.d.S.ConfigFile + "@sha256:" + hex.EncodeToString(sum[:]); rec.ConfigSource != want {
		t.Errorf("configSource %q, want %q (the file as it is now)", rec.ConfigSource, want)
	}
}
