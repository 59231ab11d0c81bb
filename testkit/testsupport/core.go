package testsupport

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
)

// Fakes of the reconcile core's ports, in memory: what a test of the core
// drives it with instead of an API server, a kubelet, systemd or
// Prometheus. Their fields are what the core did; tests read them between
// passes.

// FakeCluster is a reconcile.Cluster holding one Node in memory.
type FakeCluster struct {
	mu   sync.Mutex
	node *reconcile.Node
	// Records are the change records written, in order.
	Records []record.ChangeRecord
	// Events are the reasons of the Events posted, in order.
	Events []string
	// PreflightFunc, when set, answers Preflight (nil: the rights are
	// there).
	PreflightFunc func() error
	// States are the state labels written, in order.
	States []string
	// SlowState is how long a pending write takes (real time).
	SlowState time.Duration
}

var _ reconcile.Cluster = (*FakeCluster)(nil)

// NewFakeCluster is a Cluster whose Node node-1 (UID uid-1) asks for
// config ("" asks nothing), requested by "test".
func NewFakeCluster(config string) *FakeCluster {
	n := &reconcile.Node{Name: "node-1", UID: "uid-1"}
	if config != "" {
		n.Request = reconcile.Request{Config: config, By: "test", Asked: true}
	}
	return &FakeCluster{node: n}
}

// SetLabel sets the desired config, requested by "test".
func (f *FakeCluster) SetLabel(config string) {
	f.Update(func(n *reconcile.Node) { n.Request = reconcile.Request{Config: config, By: "test", Asked: true} })
}

// Update changes the Node as a watch would see it change: change edits a
// copy, which the watch shows from then on.
func (f *FakeCluster) Update(change func(*reconcile.Node)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.node = copyNode(f.node)
	change(f.node)
}

// Seen is the Node as the watch shows it.
func (f *FakeCluster) Seen() *reconcile.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copyNode(f.node)
}

// Watch implements reconcile.Cluster: the Node as Seen, always synced.
func (f *FakeCluster) Watch(context.Context, reconcile.WatchHandlers) (*reconcile.NodeWatch, error) {
	return &reconcile.NodeWatch{Node: func() (*reconcile.Node, bool) { return f.Seen(), true },
		Sync: func(context.Context) bool { return true }, Stop: func() {}}, nil
}

// Desired implements reconcile.Cluster.
func (f *FakeCluster) Desired(node *reconcile.Node) reconcile.Request {
	return node.Request
}

// SetState implements reconcile.Cluster: "" keeps the state (pending when
// the Node has none).
func (f *FakeCluster) SetState(_ context.Context, state string) error {
	if state == record.StatePending {
		time.Sleep(f.SlowState)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.States = append(f.States, state)
	f.node = copyNode(f.node)
	if state != "" {
		f.node.State = state
	} else if f.node.State == "" {
		f.node.State = record.StatePending
	}
	return nil
}

// Record implements reconcile.Cluster: the record at the head of the
// Node's history, with the state.
func (f *FakeCluster) Record(ctx context.Context, rec record.ChangeRecord, state string) error {
	f.mu.Lock()
	f.Records = append(f.Records, rec)
	f.node = copyNode(f.node)
	f.node.History = append([]record.ChangeRecord{rec}, f.node.History...)
	f.mu.Unlock()
	return f.SetState(ctx, state)
}

// Event implements reconcile.Cluster: the reason is kept.
func (f *FakeCluster) Event(_ context.Context, _ *reconcile.Node, _, reason, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Events = append(f.Events, reason)
	return nil
}

// PublishConfigs implements reconcile.Cluster: nothing to publish to.
func (f *FakeCluster) PublishConfigs(context.Context, *gpus.Inventory) error { return nil }

// Preflight implements reconcile.Cluster: f.PreflightFunc answers.
func (f *FakeCluster) Preflight(context.Context, bool) error {
	if f.PreflightFunc != nil {
		return f.PreflightFunc()
	}
	return nil
}

// Probe implements reconcile.API: always ready.
func (f *FakeCluster) Probe(context.Context) error { return nil }

// Reachable implements reconcile.API: always reachable.
func (f *FakeCluster) Reachable(context.Context) error { return nil }

// Transient implements reconcile.API: nothing is retried.
func (f *FakeCluster) Transient(error) bool { return false }

// API implements reconcile.Cluster: the fake itself.
func (f *FakeCluster) API() reconcile.API { return f }

// Last is the last record written (the zero record when none was).
func (f *FakeCluster) Last() record.ChangeRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.Records) == 0 {
		return record.ChangeRecord{}
	}
	return f.Records[len(f.Records)-1]
}

// Count is how many Events of reason were posted.
func (f *FakeCluster) Count(reason string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.Events {
		if r == reason {
			n++
		}
	}
	return n
}

// copyNode is a copy of the snapshot a watch would hand out.
func copyNode(n *reconcile.Node) *reconcile.Node {
	c := *n
	c.History = slices.Clone(n.History)
	return &c
}

// FakeDisruptor is a reconcile.Disruptor holding pods on MIG devices (by
// UUID), as PodResources reports them, and evicting them at once.
type FakeDisruptor struct {
	mu sync.Mutex
	// Pods maps "ns/name" to the UUID of its MIG device.
	Pods map[string]string
	// AffectedCalls counts the Affected calls.
	AffectedCalls int
	Evicted       []string
	Tainted       bool
	// Plugins is what DevicePlugins lists.
	Plugins []string
	// Restarted are the RestartDevicePlugins calls; RestartedTainted,
	// whether the node was tainted at each of them.
	Restarted        [][]string
	RestartedTainted []bool
	// NotReplaced: a restart leaves no plugin pod (the DaemonSet makes
	// none), so DevicePlugins lists none after it.
	NotReplaced bool
	// Path and Conflict are what ServedBy answers; Converge is what
	// WaitResources answers (nil: true).
	Path, Conflict string
	Converge       *bool
	// Waits are the changes WaitResources was given, as they were then.
	Waits []journal.Change
	// DuringEvict runs inside Evict before the pods go (once).
	DuringEvict func()
}

var _ reconcile.Disruptor = (*FakeDisruptor)(nil)

// NewFakeDisruptor is a Disruptor with no pods.
func NewFakeDisruptor() *FakeDisruptor { return &FakeDisruptor{Pods: map[string]string{}} }

// Affected implements reconcile.Disruptor: the pods on the devices, sorted.
func (f *FakeDisruptor) Affected(_ context.Context, gpuUUIDs, migUUIDs []string) ([]string, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.AffectedCalls++
	var out []string
	for name, uuid := range f.Pods {
		if slices.Contains(migUUIDs, uuid) || slices.Contains(gpuUUIDs, uuid) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, record.AffectedByPodResources, nil
}

// Evict implements reconcile.Disruptor: the pods go at once.
func (f *FakeDisruptor) Evict(ctx context.Context, names []string) ([]string, error) {
	f.mu.Lock()
	hook := f.DuringEvict
	f.DuringEvict = nil
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	if ctx.Err() != nil {
		return nil, ctx.Err() // as drain's Evict: the wait ends with the context
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range names {
		delete(f.Pods, n)
		f.Evicted = append(f.Evicted, n)
	}
	return names, nil
}

// Hold implements reconcile.Disruptor: the taint, through step; no
// operands.
func (f *FakeDisruptor) Hold(_ context.Context, ch *journal.Change, taint, pause bool, step func(string, bool, func() error) error) error {
	if taint && !ch.TaintAdded {
		if err := step("tainting the node", true, func() error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.Tainted, ch.TaintAdded = true, true
			return nil
		}); err != nil {
			return err
		}
	}
	if pause && len(ch.Operands) == 0 {
		return step("reading GPU Operator operand labels", false, func() error { return nil })
	}
	return nil
}

// Release implements reconcile.Disruptor: the taint lifted, through step.
func (f *FakeDisruptor) Release(_ context.Context, ch *journal.Change, step func(string, bool, func() error) error) {
	if ch.TaintAdded {
		_ = step("removing the reconfiguring taint", true, func() error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.Tainted, ch.TaintAdded = false, false
			return nil
		})
	}
}

// DevicePlugins implements reconcile.Disruptor: f.Plugins.
func (f *FakeDisruptor) DevicePlugins(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.Plugins), nil
}

// RestartDevicePlugins implements reconcile.Disruptor: the call is kept.
func (f *FakeDisruptor) RestartDevicePlugins(_ context.Context, pods []string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Restarted = append(f.Restarted, slices.Clone(pods))
	f.RestartedTainted = append(f.RestartedTainted, f.Tainted)
	if f.NotReplaced {
		f.Plugins = nil
	}
	return pods, nil
}

// WaitResources implements reconcile.Disruptor: f.Converge answers; the
// change is kept (Waits).
func (f *FakeDisruptor) WaitResources(_ context.Context, ch *journal.Change, _ string, _ map[string]bool, _ map[string]string, _ time.Duration) (bool, bool, error) {
	f.mu.Lock()
	c := *ch
	c.OldPlugins, c.StalePlugins = slices.Clone(ch.OldPlugins), slices.Clone(ch.StalePlugins)
	f.Waits = append(f.Waits, c)
	f.mu.Unlock()
	if f.Converge != nil && !*f.Converge {
		return true, false, errors.New("announced [MIG-old], want [MIG-new]")
	}
	return true, true, nil
}

// ServedBy implements reconcile.Disruptor: f.Path and f.Conflict.
func (f *FakeDisruptor) ServedBy(context.Context) (string, string, error) {
	return f.Path, f.Conflict, nil
}

// FakeRebooter is a reconcile.Rebooter that counts reboot requests.
type FakeRebooter struct{ Calls int }

var _ reconcile.Rebooter = (*FakeRebooter)(nil)

// Reboot implements reconcile.Rebooter.
func (f *FakeRebooter) Reboot(context.Context, string) error { f.Calls++; return nil }

// FakeOthers is reconcile.OtherManagers: another MIG manager at work
// (Other) or none ("").
type FakeOthers struct{ Other string }

var _ reconcile.OtherManagers = FakeOthers{}

// Check implements reconcile.OtherManagers.
func (o FakeOthers) Check(context.Context) (string, error) { return o.Other, nil }

// FakeCDI is a reconcile.CDI that counts its calls; Fail fails them.
type FakeCDI struct {
	Calls int
	Fail  error
}

var _ reconcile.CDI = (*FakeCDI)(nil)

// Refresh implements reconcile.CDI.
func (f *FakeCDI) Refresh(context.Context) (bool, error) {
	f.Calls++
	return true, f.Fail
}

// Processes is what FakeUnits ends a unit's process on: the simulated GPUs.
type Processes interface {
	RemoveProcess(gpu int, pid uint32) error
}

// FakeUnits is reconcile.HostUnits playing systemd for host GPU client
// units: stopping a unit ends its process on GPU 0 (as stopping
// nvidia-dcgm ends nv-hostengine).
type FakeUnits struct {
	GPUs Processes
	// PID maps a unit to its process, on GPU 0.
	PID              map[string]uint32
	Stopped, Started []string
}

var _ reconcile.HostUnits = (*FakeUnits)(nil)

// StopActive implements reconcile.HostUnits.
func (f *FakeUnits) StopActive(_ context.Context, names []string) ([]string, error) {
	for _, n := range names {
		if pid, ok := f.PID[n]; ok {
			if err := f.GPUs.RemoveProcess(0, pid); err != nil {
				return f.Stopped, err
			}
			f.Stopped = append(f.Stopped, n)
		}
	}
	return f.Stopped, nil
}

// Start implements reconcile.HostUnits.
func (f *FakeUnits) Start(_ context.Context, names []string) error {
	f.Started = append(f.Started, names...)
	return nil
}

// FakeSlots is reconcile.Slots handing out one slot; the slot answers
// Check with nil for its first OKChecks calls, then with Lost. AcquireErr
// fails Acquire, ExtendErr ExtendForReboot.
type FakeSlots struct {
	mu         sync.Mutex
	OKChecks   int
	Lost       error
	AcquireErr error
	ExtendErr  error
	// Acquired, Checks, Released, Kept (released with keep) and Extended
	// count the calls.
	Acquired, Checks, Released, Kept, Extended int
	// OnRelease, when set, is called at each Release, before it counts:
	// a test sees there what was done before the slot went.
	OnRelease func(keep bool)
	// Gone is what each slot's Lost returns (nil: never lost); a test
	// closes it to say the slot was lost.
	Gone chan struct{}
}

var _ reconcile.Slots = (*FakeSlots)(nil)

// Acquire implements reconcile.Slots.
func (f *FakeSlots) Acquire(context.Context) (reconcile.Slot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.AcquireErr != nil {
		return nil, f.AcquireErr
	}
	f.Acquired++
	return fakeSlot{f}, nil
}

// ExtendForReboot implements reconcile.Slots.
func (f *FakeSlots) ExtendForReboot(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Extended++
	return f.ExtendErr
}

// fakeSlot is the slot FakeSlots hands out.
type fakeSlot struct{ f *FakeSlots }

var _ reconcile.Slot = fakeSlot{}

func (s fakeSlot) Check(context.Context) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.Checks++
	select {
	case <-s.f.Gone:
		return s.f.Lost
	default:
	}
	if s.f.Checks > s.f.OKChecks {
		return s.f.Lost
	}
	return nil
}

// Guard implements reconcile.Slot: ctx, ended too as FakeSlots.Gone
// closes (nil: never).
func (s fakeSlot) Guard(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.f.Gone:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (s fakeSlot) Release(keep bool) {
	if s.f.OnRelease != nil {
		s.f.OnRelease(keep)
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if keep {
		s.f.Kept++
		return
	}
	s.f.Released++
}

// FakeOwner is a reconcile.Owner answering Confirm with Err after OK calls.
type FakeOwner struct {
	OK, Calls int
	Err       error
}

var _ reconcile.Owner = (*FakeOwner)(nil)

// Confirm implements reconcile.Owner.
func (o *FakeOwner) Confirm(context.Context) error {
	o.Calls++
	if o.Calls > o.OK {
		return o.Err
	}
	return nil
}

// FakeMetrics is a reconcile.Metrics that shows nothing.
type FakeMetrics struct{}

var _ reconcile.Metrics = FakeMetrics{}

func (FakeMetrics) Report(reconcile.Status)            {}
func (FakeMetrics) Reconfigured(string, time.Duration) {}
func (FakeMetrics) Evicted(int)                        {}
func (FakeMetrics) Rebooted()                          {}
func (FakeMetrics) Collected(string, bool)             {}
