package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
)

// The reconcile core on the simulator, with a fake clock and fake
// adapters: no API server, no kubelet. Each test drives passes as the loop
// runs them (Daemon.pass) and checks the GPUs, the journal, the records and
// what was done to pods.

// fakeCluster is a Cluster holding one Node in memory.
type fakeCluster struct {
	mu      sync.Mutex
	node    *Node
	records []record.ChangeRecord
	events  []string // reasons, in order
	// preflight, when set, answers Preflight (nil: the rights are there).
	preflight func() error
	states    []string      // the state labels written, in order
	slowState time.Duration // how long a pending write takes (real time)
}

var _ Cluster = (*fakeCluster)(nil)

func newFakeCluster(config string) *fakeCluster {
	n := &Node{Name: "node-1", UID: "uid-1"}
	if config != "" {
		n.Request = Request{Config: config, By: "test", Asked: true}
	}
	return &fakeCluster{node: n}
}

func (f *fakeCluster) setLabel(config string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.node = f.node.copy()
	f.node.Request = Request{Config: config, By: "test", Asked: true}
}

// seen is the Node as the watch shows it.
func (f *fakeCluster) seen() *Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.node.copy()
}

func (f *fakeCluster) Watch(context.Context, WatchHandlers) (*NodeWatch, error) {
	return &NodeWatch{Node: func() (*Node, bool) { return f.seen(), true },
		Sync: func(context.Context) bool { return true }, Stop: func() {}}, nil
}

func (f *fakeCluster) Desired(node *Node) Request {
	return node.Request
}

func (f *fakeCluster) GetNode(context.Context) (*Node, error) { return f.seen(), nil }

func (f *fakeCluster) SetState(_ context.Context, state string) error {
	if state == record.StatePending {
		time.Sleep(f.slowState)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states = append(f.states, state)
	f.node = f.node.copy()
	if state != "" {
		f.node.State = state
	} else if f.node.State == "" {
		f.node.State = record.StatePending
	}
	return nil
}

func (f *fakeCluster) Record(ctx context.Context, rec record.ChangeRecord, state string) error {
	f.mu.Lock()
	f.records = append(f.records, rec)
	f.node = f.node.copy()
	f.node.History = append([]record.ChangeRecord{rec}, f.node.History...)
	f.mu.Unlock()
	return f.SetState(ctx, state)
}

func (f *fakeCluster) Event(_ context.Context, _ *Node, _, reason, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, reason)
	return nil
}

func (f *fakeCluster) PublishConfigs(context.Context, string) error { return nil }
func (f *fakeCluster) Preflight(context.Context, bool) error {
	if f.preflight != nil {
		return f.preflight()
	}
	return nil
}
func (f *fakeCluster) Probe(context.Context) error     { return nil }
func (f *fakeCluster) Reachable(context.Context) error { return nil }
func (f *fakeCluster) Transient(error) bool            { return false }

// copy is a copy of the snapshot a watch would hand out.
func (n *Node) copy() *Node {
	c := *n
	c.History = slices.Clone(n.History)
	return &c
}

func (f *fakeCluster) last() record.ChangeRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.records) == 0 {
		return record.ChangeRecord{}
	}
	return f.records[len(f.records)-1]
}

func (f *fakeCluster) count(reason string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.events {
		if r == reason {
			n++
		}
	}
	return n
}

// fakeDisruptor holds pods on MIG devices (by UUID), as PodResources
// reports them, and evicts them at once.
type fakeDisruptor struct {
	mu        sync.Mutex
	pods      map[string]string // "ns/name" → MIG device UUID
	affected  int               // Affected calls
	evicted   []string
	tainted   bool
	plugins   []string   // what DevicePlugins lists
	restarted [][]string // RestartDevicePlugins calls
	// restartedTainted: whether the node was tainted at each of them.
	restartedTainted []bool
	// path and conflict are what ServedBy answers; converge is what
	// WaitResources answers (nil: true).
	path, conflict string
	converge       *bool
	// duringEvict runs inside Evict before the pods go (once).
	duringEvict func()
}

var _ Disruptor = (*fakeDisruptor)(nil)

func (f *fakeDisruptor) Affected(_ context.Context, gpuUUIDs, migUUIDs []string) ([]string, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.affected++
	var out []string
	for name, uuid := range f.pods {
		if slices.Contains(migUUIDs, uuid) || slices.Contains(gpuUUIDs, uuid) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, "pod-resources", nil
}

func (f *fakeDisruptor) Evict(ctx context.Context, names []string) ([]string, error) {
	f.mu.Lock()
	hook := f.duringEvict
	f.duringEvict = nil
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	if ctx.Err() != nil {
		return nil, ctx.Err() // as drain.Disruptor.Evict: the wait ends with the context
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range names {
		delete(f.pods, n)
		f.evicted = append(f.evicted, n)
	}
	return names, nil
}

func (f *fakeDisruptor) Taint(context.Context) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	added := !f.tainted
	f.tainted = true
	return added, nil
}

func (f *fakeDisruptor) Untaint(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tainted = false
	return nil
}

func (f *fakeDisruptor) ReadOperands(context.Context) (json.RawMessage, error) { return nil, nil }
func (f *fakeDisruptor) PauseOperands(context.Context, json.RawMessage) error  { return nil }
func (f *fakeDisruptor) RestoreOperands(context.Context, json.RawMessage) error {
	return nil
}

func (f *fakeDisruptor) DevicePlugins(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.plugins), nil
}

func (f *fakeDisruptor) RestartDevicePlugins(_ context.Context, pods []string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restarted = append(f.restarted, slices.Clone(pods))
	f.restartedTainted = append(f.restartedTainted, f.tainted)
	return pods, nil
}

func (f *fakeDisruptor) WaitResources(context.Context, string, map[string]bool, map[string]string, time.Duration) (bool, bool, error) {
	if f.converge != nil && !*f.converge {
		return true, false, errors.New("announced [MIG-old], want [MIG-new]")
	}
	return true, true, nil
}

func (f *fakeDisruptor) ServedBy(context.Context) (string, string, error) {
	return f.path, f.conflict, nil
}

// fakeRebooter counts reboot requests.
type fakeRebooter struct{ calls int }

func (f *fakeRebooter) Reboot(context.Context, string) error { f.calls++; return nil }

// core is a daemon under test and what it runs on.
type core struct {
	d        *Daemon
	sim      *nvmlx.Sim
	spec     string
	simState string
	stateDir string
	cluster  *fakeCluster
	disrupt  *fakeDisruptor
	reboot   *fakeRebooter
	clock    *clocktesting.FakeClock
}

func testSettings() *settings.Settings {
	return &settings.Settings{NVML: "sim:test", Namespace: "mig-agent", Taint: true, EvictUnmanagedPods: true,
		RestartDevicePlugin: true, ResourceWaitTimeout: time.Minute, RebootMethod: settings.RebootNone,
		DrainTimeout: time.Minute, RetryBackoffMax: 40 * time.Second, DriftInterval: time.Minute}
}

// newCore builds a daemon over a fresh simulator with spec.
func newCore(t *testing.T, spec string, o nvmlx.SimOptions, config string) *core {
	t.Helper()
	dir := t.TempDir()
	c := &core{spec: spec, simState: filepath.Join(dir, "sim.json"), stateDir: filepath.Join(dir, "state"),
		cluster: newFakeCluster(config), disrupt: &fakeDisruptor{pods: map[string]string{}},
		reboot: &fakeRebooter{}, clock: clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
	c.restart(t, o)
	t.Cleanup(func() {
		if n := c.d.badMoves.Load(); n > 0 {
			t.Errorf("%d moves between phases that journal.CanMove does not list", n)
		}
	})
	return c
}

// restart builds the daemon afresh over the same GPUs, journal and
// cluster, as a new process would (o: the simulator's options).
func (c *core) restart(t *testing.T, o nvmlx.SimOptions) {
	t.Helper()
	o.StatePath = c.simState
	c.sim = newSim(t, c.spec, o)
	j, err := journal.Open(c.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	sim := c.sim
	c.d = &Daemon{S: testSettings(), Log: discard(), GPU: sim, Cluster: c.cluster, Disrupt: c.disrupt,
		Reboot: c.reboot, Metrics: metrics.New("test"), Journal: j, Clock: c.clock, Version: "test",
		BootID: func() string { return fmt.Sprintf("boot-%d", sim.BootCount()) }}
}

// pass runs one reconcile pass on the Node as the watch shows it.
func (c *core) pass(start, retry bool) outcome {
	oc, _ := c.d.pass(context.Background(), func() (*Node, bool) { return c.cluster.seen(), true }, start, retry)
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
				c.disrupt.pods[name] = ci.UUID
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
	c.cluster.setLabel(name)
	if oc := c.pass(true, false); oc != outSuccess || !c.holds(t, name) {
		t.Fatalf("applying %s: outcome %v, record %+v", name, oc, c.cluster.last())
	}
}

func wantSuccess(t *testing.T, c *core, config string) record.ChangeRecord {
	t.Helper()
	rec := c.cluster.last()
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
	if c.disrupt.tainted {
		t.Fatal("the node is still tainted")
	}
	if got := c.cluster.seen().State; got != record.StateSuccess {
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
			c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
			c.applied(t, "all-balanced")
			pods := c.runPods(t, "1g.18gb", 0, 1)
			// The state a crash at this phase leaves.
			ch := &journal.Change{Config: "all-1g.18gb", PreviousConfig: "all-balanced", RequestedBy: "test",
				StartedAt: c.clock.Now(), Phase: tc.phase, GPUsChanged: []int{0, 1}, GPUsUntouched: []int{},
				NodeUID: "uid-1", TaintAdded: tc.phase != journal.PhasePending}
			if tc.phase == journal.PhaseApplying {
				// GPU 0 was done when the agent stopped; GPU 1 was not.
				f := parseSpec(t, "version: v1\nmig-configs:\n  gpu0:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 7}\n")
				if _, err := applyConfig(t, c.sim, f, "gpu0", gpus.ApplyOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.gpusDone {
				if _, err := applyConfig(t, c.sim, nil, "all-1g.18gb", gpus.ApplyOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.wantAffect {
				ch.Evicted = slices.Clone(pods) // evicted before the crash
				for _, p := range pods {
					delete(c.disrupt.pods, p)
				}
			}
			if tc.phase == journal.PhaseRefreshing {
				ch.StalePlugins = []string{"gpu-operator/nvidia-device-plugin-daemonset-x/uid-dp"}
			}
			c.disrupt.tainted = ch.TaintAdded
			c.d.Journal.State.Change, c.d.Journal.State.Handled = ch, ""
			if err := c.d.Journal.Save(); err != nil {
				t.Fatal(err)
			}
			c.cluster.setLabel("all-1g.18gb")
			c.restart(t, nvmlx.SimOptions{})
			c.disrupt.affected, c.disrupt.evicted = 0, nil

			if oc := c.pass(true, false); oc != outSuccess {
				t.Fatalf("outcome %v, record %+v", oc, c.cluster.last())
			}
			rec := wantSuccess(t, c, "all-1g.18gb")
			if got := c.disrupt.affected > 0; got != tc.wantAffect {
				t.Errorf("looked for affected pods: %v, want %v", got, tc.wantAffect)
			}
			if got := slices.Sorted(slices.Values(c.disrupt.evicted)); tc.wantAffect && !slices.Equal(got, pods) {
				t.Errorf("evicted %v, want %v", c.disrupt.evicted, pods)
			}
			if !tc.wantAffect && len(c.disrupt.evicted) != 0 {
				t.Errorf("evicted %v after the GPUs were touched", c.disrupt.evicted)
			}
			if got := slices.Sorted(slices.Values(rec.EvictedPods)); !slices.Equal(got, pods) {
				t.Errorf("record evictedPods %v, want %v", got, pods)
			}
			if !slices.Equal(rec.GPUsChanged, []int{0, 1}) || rec.PreviousConfig != "all-balanced" {
				t.Errorf("record gpusChanged %v previous %q", rec.GPUsChanged, rec.PreviousConfig)
			}
			if tc.wantRestart != slices.ContainsFunc(c.disrupt.restarted, func(p []string) bool {
				return slices.Equal(p, []string{"gpu-operator/nvidia-device-plugin-daemonset-x/uid-dp"})
			}) {
				t.Errorf("device plugin restarts %v, want the journaled one: %v", c.disrupt.restarted, tc.wantRestart)
			}
		})
	}
}

// A new label mid-change stops the change where it safely can (waiting
// for evictions), leaves the GPUs untouched, and the next pass abandons it
// (undoing its taint, recording why) and applies the new config.
func TestCoreSupersede(t *testing.T) {
	c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
	c.applied(t, "all-balanced")
	c.runPods(t, "1g.18gb", 1)
	c.cluster.setLabel("all-1g.18gb")
	c.disrupt.duringEvict = func() {
		// What the Node watch does on a label change (Kube.Watch: Stale).
		c.cluster.setLabel("all-3g.71gb")
		c.d.supersede()
	}
	if oc := c.pass(false, false); oc != outSuccess {
		t.Fatalf("superseded pass: outcome %v, want the success that waits for the pending trigger", oc)
	}
	j := c.d.Journal.State
	if j.Change == nil || j.Change.Config != "all-1g.18gb" || j.Change.Phase != journal.PhaseDraining {
		t.Fatalf("journal change %+v, want all-1g.18gb kept at draining", j.Change)
	}
	if !c.holds(t, "all-balanced") || len(c.disrupt.evicted) != 0 || !c.disrupt.tainted {
		t.Fatalf("superseded change went on: GPUs balanced %v, evicted %v, tainted %v",
			c.holds(t, "all-balanced"), c.disrupt.evicted, c.disrupt.tainted)
	}

	if oc := c.pass(false, false); oc != outSuccess {
		t.Fatalf("outcome %v, record %+v", oc, c.cluster.last())
	}
	wantSuccess(t, c, "all-3g.71gb")
	var abandoned *record.ChangeRecord
	for i, r := range c.cluster.records {
		if r.Config == "all-1g.18gb" {
			abandoned = &c.cluster.records[i]
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
	c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
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
	c.cluster.setLabel("all-1g.18gb")

	const tries = 25
	maxWait := c.d.S.RetryBackoffMax
	var waits []time.Duration
	for i := range tries {
		records := len(c.cluster.records)
		if oc := c.pass(false, i > 0); oc != outRetry {
			t.Fatalf("try %d: outcome %v, want a retry", i+1, oc)
		}
		if rec := c.cluster.last(); len(c.cluster.records) != records+1 || rec.Result != record.StateFailed || rec.Config != "all-1g.18gb" {
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
		if oc := c.pass(false, false); oc != outRetry || len(c.cluster.records) != records+1 {
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
	if oc := c.pass(false, true); oc != outSuccess {
		t.Fatalf("retry after the cause went: outcome %v, record %+v", oc, c.cluster.last())
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
	c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
	c.applied(t, "all-balanced")
	c.cluster.setLabel("all-1g.18gb")
	started := c.cluster.count(record.ReasonStarted)
	var stateAt, journaled []string
	refuse := true
	c.cluster.preflight = func() error {
		stateAt = append(stateAt, c.cluster.node.State) // Preflight runs outside the fake's lock
		if ch := c.d.Journal.State.Change; ch != nil {
			journaled = append(journaled, ch.Config)
		}
		if refuse {
			return errors.New(`nodes "node-1" is forbidden: cannot patch`)
		}
		return nil
	}
	if oc := c.pass(false, false); oc != outRetry {
		t.Fatalf("preflight refused: outcome %v, want a retry", oc)
	}
	if !slices.Equal(stateAt, []string{record.StatePending}) || len(journaled) != 0 {
		t.Fatalf("at the preflight: state %v, journaled %v; want pending, nothing journaled", stateAt, journaled)
	}
	rec := c.cluster.last()
	if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "forbidden") || c.cluster.seen().State != record.StateFailed {
		t.Fatalf("after the refusal: record %+v, state %q", rec, c.cluster.seen().State)
	}
	if c.d.Journal.State.Change != nil || c.cluster.count(record.ReasonStarted) != started {
		t.Fatalf("a refused change was journaled (%+v) or announced started (events %v)", c.d.Journal.State.Change, c.cluster.events)
	}
	if !c.holds(t, "all-balanced") {
		t.Fatal("a change the preflight refused touched the GPUs")
	}
	refuse = false
	c.clock.Step(c.d.Journal.State.RetryAt.Sub(c.clock.Now()))
	if oc := c.pass(false, true); oc != outSuccess {
		t.Fatalf("retry with the rights: outcome %v, record %+v", oc, c.cluster.last())
	}
	wantSuccess(t, c, "all-1g.18gb")
}

// A change mid-drain whose Node was deleted and made again goes back to
// pending (sameNode): the new Node says pending before its disruption is
// redone, though the change was not announced afresh in checkNode.
func TestCoreRecreatedNodeSaysPending(t *testing.T) {
	c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
	c.applied(t, "all-balanced")
	ch := &journal.Change{Config: "all-1g.18gb", PreviousConfig: "all-balanced", RequestedBy: "test",
		StartedAt: c.clock.Now(), Phase: journal.PhaseDraining, GPUsChanged: []int{0, 1}, GPUsUntouched: []int{},
		NodeUID: "uid-of-the-deleted-node", TaintAdded: true}
	c.d.Journal.State.Change, c.d.Journal.State.Handled = ch, ""
	if err := c.d.Journal.Save(); err != nil {
		t.Fatal(err)
	}
	c.cluster.setLabel("all-1g.18gb")
	c.restart(t, nvmlx.SimOptions{})
	from := len(c.cluster.states)
	if oc := c.pass(true, false); oc != outSuccess {
		t.Fatalf("outcome %v, record %+v", oc, c.cluster.last())
	}
	if got := c.cluster.states[from:]; len(got) == 0 || got[0] != record.StatePending {
		t.Fatalf("states written %v: the new Node was not told pending first", got)
	}
	wantSuccess(t, c, "all-1g.18gb")
}

// fakeOthers is another MIG manager at work (other) or none ("").
type fakeOthers struct{ other string }

func (o fakeOthers) Check(context.Context) (string, error) { return o.other, nil }

// Another MIG manager found while pending is being written (slowly): the
// refusal's failed comes after pending, never before it, so the node ends
// failed; nothing is journaled, announced or touched.
func TestCorePendingThenRefused(t *testing.T) {
	c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
	c.applied(t, "all-balanced")
	c.cluster.setLabel("all-1g.18gb")
	c.d.Others = fakeOthers{other: "the GPU Operator's MIG manager (pod gpu-operator/nvidia-mig-manager-x)"}
	c.cluster.slowState = 50 * time.Millisecond
	started, from := c.cluster.count(record.ReasonStarted), len(c.cluster.states)
	if oc := c.pass(false, false); oc == outSuccess {
		t.Fatal("a change went ahead beside another MIG manager")
	}
	if got := c.cluster.states[from:]; !slices.Equal(got, []string{record.StatePending, record.StateFailed}) || c.cluster.seen().State != record.StateFailed {
		t.Fatalf("states written %v, node at %q; want pending then failed", got, c.cluster.seen().State)
	}
	if rec := c.cluster.last(); !strings.Contains(rec.Reason, "another MIG manager") || c.cluster.count(record.ReasonManagerConflict) == 0 {
		t.Errorf("record %+v: the reason does not name the other manager, or no Event", rec)
	}
	if c.d.Journal.State.Change != nil || c.cluster.count(record.ReasonStarted) != started || !c.holds(t, "all-balanced") {
		t.Fatal("a refused change was journaled, announced or applied")
	}
}

// GPUs changed behind the agent's back are reported once as drift (Event,
// metric) and left alone; with --reapply-on-drift the applied config is
// applied again.
func TestCoreDrift(t *testing.T) {
	c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
	c.applied(t, "all-balanced")
	drift := func() outcome {
		t.Helper()
		if !c.d.openNVML() {
			t.Fatal("NVML down")
		}
		defer c.d.GPU.End()
		return c.d.checkDrift(context.Background(), c.cluster.seen(), true)
	}
	if oc := drift(); oc != outSuccess || c.cluster.count(record.ReasonDrift) != 0 {
		t.Fatalf("no drift yet: outcome %v, drift events %d", oc, c.cluster.count(record.ReasonDrift))
	}
	// Someone else re-carves GPU 1.
	other := parseSpec(t, "version: v1\nmig-configs:\n  other:\n    - devices: [1]\n      mig-enabled: true\n      mig-devices: {\"7g.141gb\": 1}\n")
	if _, err := applyConfig(t, c.sim, other, "other", gpus.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	records := len(c.cluster.records)
	for range 2 {
		if oc := drift(); oc != outSuccess {
			t.Fatalf("outcome %v", oc)
		}
	}
	if got := c.cluster.count(record.ReasonDrift); got != 1 {
		t.Errorf("%d drift events over two checks, want 1", got)
	}
	if c.holds(t, "all-balanced") || len(c.cluster.records) != records {
		t.Fatal("drift without --reapply-on-drift changed the GPUs or recorded a change")
	}

	c.d.S.ReapplyOnDrift = true
	if oc := drift(); oc != outSuccess {
		t.Fatalf("reapply: outcome %v, record %+v", oc, c.cluster.last())
	}
	rec := wantSuccess(t, c, "all-balanced")
	if !slices.Equal(rec.GPUsChanged, []int{1}) {
		t.Errorf("reapply changed GPUs %v, want [1]", rec.GPUsChanged)
	}
	if oc := drift(); oc != outSuccess || c.cluster.count(record.ReasonDrift) != 1 {
		t.Errorf("after the reapply: outcome %v, drift events %d", oc, c.cluster.count(record.ReasonDrift))
	}
}

// A MIG mode change that needs a reboot asks for it once, waits through a
// restart on the same boot without asking again, and finishes after the
// reboot; the record says a reboot was made.
func TestCoreRebootResume(t *testing.T) {
	noReset := nvmlx.SimOptions{NoReset: true}
	c := newCore(t, "a100-40gbx2", noReset, "")
	f := parseSpec(t, "version: v1\nmig-configs:\n  gpu1:\n    - devices: [1]\n      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 2}\n")
	setup := func() {
		c.d.File = f
		c.d.S.RebootMethod = settings.RebootSystemctl
	}
	setup()
	c.cluster.setLabel("gpu1")
	if oc := c.pass(true, false); oc != outRebooting {
		t.Fatalf("outcome %v, record %+v", oc, c.cluster.last())
	}
	ch := c.d.Journal.State.Change
	if c.reboot.calls != 1 || ch == nil || ch.Phase != journal.PhaseRebooting || c.d.Journal.State.RebootFor == nil || !c.d.Journal.State.RebootFor.Requested {
		t.Fatalf("reboots %d, journal change %+v", c.reboot.calls, ch)
	}
	if rec := c.cluster.last(); rec.Result != record.StateRebooting || !rec.Reboot {
		t.Fatalf("record %+v, want rebooting", rec)
	}

	// The agent restarts on the same boot: it waits, it does not reboot again.
	c.restart(t, noReset)
	setup()
	if oc := c.pass(true, false); oc != outRebooting || c.reboot.calls != 1 {
		t.Fatalf("same boot: outcome %v, reboots %d", oc, c.reboot.calls)
	}

	if err := nvmlx.SimReboot(c.simState); err != nil {
		t.Fatal(err)
	}
	c.restart(t, noReset)
	setup()
	if oc := c.pass(true, false); oc != outSuccess {
		t.Fatalf("after the reboot: outcome %v, record %+v", oc, c.cluster.last())
	}
	rec := wantSuccess(t, c, "gpu1")
	if !rec.Reboot || c.reboot.calls != 1 || !slices.Equal(rec.GPUsChanged, []int{1}) {
		t.Errorf("record reboot %v gpusChanged %v, reboots asked %d", rec.Reboot, rec.GPUsChanged, c.reboot.calls)
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
	c := newCore(t, "h200x1", nvmlx.SimOptions{}, "")
	c.disrupt.plugins = []string{"gpu-operator/nvidia-device-plugin-daemonset-x/uid-dp"}
	c.cluster.setLabel("all-1g.18gb")
	if oc := c.pass(false, false); oc != outSuccess {
		t.Fatalf("outcome %v, record %+v", oc, c.cluster.last())
	}
	if !slices.Equal(c.disrupt.restartedTainted, []bool{true}) {
		t.Errorf("restarts %v tainted %v, want one, while tainted", c.disrupt.restarted, c.disrupt.restartedTainted)
	}
	if c.disrupt.tainted {
		t.Error("the taint is still on after success")
	}
}

func TestCoreRelabelSkipsBackoff(t *testing.T) {
	c := newCore(t, "h200x1", nvmlx.SimOptions{Faults: "CreateGpuInstanceWithPlacement:1=ERROR_INSUFFICIENT_RESOURCES"}, "")
	c.cluster.setLabel("all-balanced")
	if oc := c.pass(false, false); oc != outRetry || c.cluster.last().Result != record.StateFailed {
		t.Fatalf("outcome %v, record %+v: want a failure retried with backoff", oc, c.cluster.last())
	}
	// Not due: the same request waits for its backoff.
	if oc := c.pass(false, false); oc != outRetry {
		t.Fatalf("outcome %v, want the backoff's wait", oc)
	}
	// Removed and set again: one snapshot shows the value, the count grown.
	c.cluster.mu.Lock()
	c.cluster.node = c.cluster.node.copy()
	c.cluster.node.Request.Seq++
	c.cluster.mu.Unlock()
	if oc := c.pass(false, false); oc != outSuccess || c.cluster.last().Result != record.StateSuccess {
		t.Fatalf("outcome %v, record %+v: want the new request acted on at once", oc, c.cluster.last())
	}
}

// The config file defines the applied config anew (same name, new
// definition): the drift check applies it as a new request, without
// --reapply-on-drift, and records the hash before and after; a change made
// on the GPUs by hand afterwards is still only drift.
func TestCoreChangedDefinitionIsNewRequest(t *testing.T) {
	c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
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
	drift := func() outcome {
		t.Helper()
		if !c.d.openNVML() {
			t.Fatal("NVML down")
		}
		defer c.d.GPU.End()
		return c.d.checkDrift(context.Background(), c.cluster.seen(), true)
	}
	records := len(c.cluster.records)
	if oc := drift(); oc != outSuccess || len(c.cluster.records) != records {
		t.Fatalf("unchanged file: outcome %v, %d new records", oc, len(c.cluster.records)-records)
	}

	write("3g.71gb", 2)
	if oc := drift(); oc != outSuccess {
		t.Fatalf("changed definition: outcome %v, record %+v", oc, c.cluster.last())
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
	if got := c.cluster.count(record.ReasonDrift); got != 0 {
		t.Errorf("%d drift events for a changed definition, want 0", got)
	}
	// Checked again: nothing more to do.
	records = len(c.cluster.records)
	if oc := drift(); oc != outSuccess || len(c.cluster.records) != records {
		t.Errorf("after the new definition: outcome %v, %d new records", oc, len(c.cluster.records)-records)
	}
	// A hand-made change on the GPUs: drift, not re-applied
	// (--reapply-on-drift is off).
	other := parseSpec(t, "version: v1\nmig-configs:\n  other:\n    - devices: [1]\n      mig-enabled: true\n      mig-devices: {\"7g.141gb\": 1}\n")
	if _, err := applyConfig(t, c.sim, other, "other", gpus.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if oc := drift(); oc != outSuccess || c.cluster.count(record.ReasonDrift) != 1 || len(c.cluster.records) != records {
		t.Errorf("hand-made change: outcome %v, drift events %d, %d new records", oc, c.cluster.count(record.ReasonDrift), len(c.cluster.records)-records)
	}

	// At start, a definition changed while the agent was away is acted on
	// too, even where the GPUs happen to match (only the hash differs).
	write("7g.141gb", 1) // GPU 1 holds this by hand; GPU 0 does not
	c.restart(t, nvmlx.SimOptions{})
	c.d.S.ConfigFile = file
	if oc := c.pass(true, false); oc != outSuccess {
		t.Fatalf("start pass: outcome %v, record %+v", oc, c.cluster.last())
	}
	rec2 := wantSuccess(t, c, "mine")
	if rec2.PreviousConfigHash != rec.ConfigHash || rec2.ConfigHash == rec.ConfigHash {
		t.Errorf("start: hash %q previousConfigHash %q, want previous %q", rec2.ConfigHash, rec2.PreviousConfigHash, rec.ConfigHash)
	}
}

// fakeCDI records its calls; fail makes the next ones fail.
type fakeCDI struct {
	calls int
	fail  error
}

func (f *fakeCDI) Refresh(context.Context) (bool, error) {
	f.calls++
	return true, f.fail
}

// The CDI step runs once after a change that touched GPUs, not for a
// config already applied; a failure is a named, retryable failure whose
// retry runs the step again (the change stays journaled) and then succeeds.
func TestCoreCDIAfterChange(t *testing.T) {
	c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
	f := &fakeCDI{}
	c.d.CDI = f
	c.applied(t, "all-1g.18gb")
	if f.calls != 1 {
		t.Fatalf("CDI refreshed %d times after a change, want 1", f.calls)
	}
	c.cluster.setLabel("all-1g.18gb")
	c.d.Journal.State.Handled = ""
	if oc := c.pass(false, false); oc != outSuccess || f.calls != 1 {
		t.Fatalf("config already applied: outcome %v, CDI calls %d, want 1", oc, f.calls)
	}
	f.fail = errors.New("nvidia-ctk system create-device-nodes: exit status 1: permission denied")
	c.cluster.setLabel("all-balanced")
	if oc := c.pass(false, false); oc != outRetry {
		t.Fatalf("outcome %v, want a retry", oc)
	}
	rec := c.cluster.last()
	if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "refreshing CDI failed: nvidia-ctk system create-device-nodes") {
		t.Fatalf("record %+v", rec)
	}
	if c.d.Journal.State.Change == nil {
		t.Fatal("the change left the journal: its retry would not refresh CDI")
	}
	f.fail = nil
	if oc := c.pass(false, true); oc != outSuccess {
		t.Fatalf("retry: outcome %v, record %+v", oc, c.cluster.last())
	}
	wantSuccess(t, c, "all-balanced")
	if f.calls != 3 {
		t.Errorf("CDI calls %d, want 3", f.calls)
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
	c := newCore(t, "h200x1", nvmlx.SimOptions{}, "")
	g := &downGPU{GPU: c.d.GPU, down: true}
	c.d.GPU = g
	c.d.S.NVMLUnavailableRestart = 5 * time.Minute
	if err := c.d.Live(); err != nil {
		t.Fatalf("Live before any failure: %v", err)
	}
	if c.d.openNVML() {
		t.Fatal("NVML opened while down")
	}
	c.clock.Step(4 * time.Minute)
	if c.d.openNVML() || c.d.Live() != nil {
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
	if !c.d.openNVML() {
		t.Fatal("NVML did not open")
	}
	c.d.GPU.End()
	if err := c.d.Live(); err != nil {
		t.Errorf("Live once NVML is back: %v", err)
	}
	// A new outage counts from its own start.
	g.down = true
	c.d.openNVML()
	c.clock.Step(time.Minute)
	if err := c.d.Live(); err != nil {
		t.Errorf("Live 1m into a new outage: %v", err)
	}
}

// fakeUnits plays systemd for host GPU client units: stopping a unit ends
// its process on the simulated GPU (as stopping nvidia-dcgm ends
// nv-hostengine).
type fakeUnits struct {
	sim            *nvmlx.Sim
	pid            map[string]uint32 // unit → its process, on GPU 0
	stopped, start []string
}

func (f *fakeUnits) StopActive(_ context.Context, names []string) ([]string, error) {
	for _, n := range names {
		if pid, ok := f.pid[n]; ok {
			if err := f.sim.RemoveProcess(0, pid); err != nil {
				return f.stopped, err
			}
			f.stopped = append(f.stopped, n)
		}
	}
	return f.stopped, nil
}

func (f *fakeUnits) Start(_ context.Context, names []string) error {
	f.start = append(f.start, names...)
	return nil
}

// Host GPU clients are stopped for a change without a mode change too
// where their processes block it, and started again after; without them
// the failure says what to do.
func TestCoreHostClientsStoppedForBlockingProcesses(t *testing.T) {
	c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
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
	c.cluster.setLabel("all-1g.18gb")
	if oc := c.pass(false, false); oc != outRetry {
		t.Fatalf("outcome %v, want a retry", oc)
	}
	if r := c.cluster.last().Reason; !strings.Contains(r, "pid 777 (nv-hostengine)") || !strings.Contains(r, "--host-gpu-clients") {
		t.Fatalf("reason %q", r)
	}
	units := &fakeUnits{sim: c.sim, pid: map[string]uint32{"nvidia-dcgm.service": 777}}
	c.d.Units, c.d.S.HostGPUClients = units, []string{"nvidia-dcgm.service"}
	if oc := c.pass(false, true); oc != outSuccess {
		t.Fatalf("with host clients: outcome %v, record %+v", oc, c.cluster.last())
	}
	wantSuccess(t, c, "all-1g.18gb")
	if !slices.Equal(units.stopped, []string{"nvidia-dcgm.service"}) || !slices.Equal(units.start, []string{"nvidia-dcgm.service"}) {
		t.Errorf("stopped %v, started %v", units.stopped, units.start)
	}
}

// The allocation path: a node served by the device plugin and the DRA
// driver at once is refused before anything is touched; on the DRA path
// the record says so, and a wait that does not converge fails the change
// with the DRA driver named.
func TestCoreAllocationPath(t *testing.T) {
	t.Run("both refused", func(t *testing.T) {
		c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
		c.applied(t, "all-balanced")
		pods := c.runPods(t, "1g.18gb", 0, 1)
		c.disrupt.conflict = "nvidia.com/gpu in the Node's allocatable and gpu.nvidia.com ResourceSlice s1"
		c.cluster.setLabel("all-1g.18gb")
		c.disrupt.affected = 0
		if oc := c.pass(true, false); oc == outSuccess {
			t.Fatal("a node served by both paths was changed")
		}
		rec := c.cluster.last()
		if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "both the device plugin and the NVIDIA DRA driver") {
			t.Fatalf("record %+v", rec)
		}
		if c.cluster.count(record.ReasonAllocationPathConflict) != 1 || c.disrupt.affected != 0 || len(c.disrupt.evicted) != 0 || !c.holds(t, "all-balanced") {
			t.Fatalf("events %v, affected %d, evicted %v: something was touched", c.cluster.events, c.disrupt.affected, c.disrupt.evicted)
		}
		if len(pods) == 0 {
			t.Fatal("no pods to keep")
		}
	})
	t.Run("dra", func(t *testing.T) {
		c := newCore(t, "h200x2", nvmlx.SimOptions{}, "")
		c.disrupt.path = record.ServedByDRA
		c.applied(t, "all-balanced")
		if rec := c.cluster.last(); rec.ServedBy != record.ServedByDRA {
			t.Fatalf("record servedBy %q", rec.ServedBy)
		}
		no := false
		c.disrupt.converge = &no
		c.cluster.setLabel("all-1g.18gb")
		if oc := c.pass(true, false); oc == outSuccess {
			t.Fatal("success without the slices converging")
		}
		rec := c.cluster.last()
		if !strings.Contains(rec.Reason, "gpu.nvidia.com ResourceSlices did not announce exactly its devices") || rec.ServedBy != record.ServedByDRA {
			t.Fatalf("record %+v", rec)
		}
		if c.cluster.count(record.ReasonResourcesTimeout) != 1 {
			t.Fatalf("events %v", c.cluster.events)
		}
	})
}
