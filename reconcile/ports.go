package reconcile

import (
	"context"
	"time"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/record"
)

// The core's own types and every way it reaches the world outside the
// GPUs: each a narrow interface owned here, implemented by the Kubernetes
// side (package kube), systemd (package systemd) or the standalone daemon.
// Nothing here names a Kubernetes type: the core and its tests link no
// client-go.

// Node is what the core knows of its Kubernetes Node: a snapshot the
// Cluster builds from the Node as its watch (or a fresh read) shows it.
type Node struct {
	Name string
	UID  string
	// Request is the desired config and who asked for it.
	Request Request
	// Strategy is the device plugin's MIG strategy label ("" when unset).
	Strategy string
	// State is the state label ("" when unset).
	State string
	// History is the change records on the Node, newest first (the
	// history annotation, or the last change alone when it does not
	// decode).
	History []record.ChangeRecord
}

// Event types (Kubernetes' Normal and Warning).
const (
	EventNormal  = "Normal"
	EventWarning = "Warning"
)

// Request is the desired config and who asked for it.
type Request struct {
	Config string
	By     string
	// Via is the field manager of the write that asked, where known.
	Via string
	// Source says where By comes from (record.RequesterSource*).
	Source string
	At     *time.Time
	// Asked is false when nothing is asked (no label, no default); a label
	// set to "" asks, and fails with a reason.
	Asked bool
	// Seq counts the removals of the desired label the watch has seen: a
	// pass that finds it grown since the last pass handles the removal
	// first (a label removed and set again between two passes is two
	// requests, not one).
	Seq uint64
}

// Cluster is the Kubernetes side of the daemon behind one interface: the
// watch of its Node, the state label and change records on the Node,
// Events, the ConfigMap of generated configs and the API server's health.
// kube.Cluster implements it over client-go; standalone.Standalone is the daemon
// without Kubernetes, which has no Node (node nil throughout the core).
type Cluster interface {
	// Watch follows the Node until ctx ends or Stop.
	Watch(ctx context.Context, h WatchHandlers) (*NodeWatch, error)
	// Desired is the config node asks for (standalone: the selected one).
	Desired(node *Node) Request
	// SetState sets the state label (and nothing else); "" removes it.
	SetState(ctx context.Context, state string) error
	// Record writes a change record and the state label together, on the
	// Node as it is now. It does what it can to make the record land (a
	// shorter record when the whole one is refused; the state label alone
	// when no record can be written) and returns an error when the record
	// did not land. state "" leaves the state label as it is (pending when
	// the Node has none).
	Record(ctx context.Context, rec record.ChangeRecord, state string) error
	// Event posts an Event on the Node; failures are for logging only.
	Event(ctx context.Context, node *Node, eventType, reason, msg string) error
	// PublishConfigs writes what the agent publishes of n (Publication) to
	// the node's ConfigMap, where it changed since its last write.
	PublishConfigs(ctx context.Context, n *gpus.Inventory) error
	// Preflight proves the rights a change needs to record itself (and to
	// taint the node, when taint).
	Preflight(ctx context.Context, taint bool) error
	// API is the health of the cluster's side: whether it answers, and
	// which of its errors are worth a retry.
	API() API
}

// API is the health of the Cluster's side (the API server; nothing to be
// away in standalone mode).
type API interface {
	// Probe asks the API server whether it is ready.
	Probe(ctx context.Context) error
	// Reachable is the cheap health check while the API server answers:
	// a TCP connect, nothing sent.
	Reachable(ctx context.Context) error
	// Transient says whether an error of this side is worth a retry of the
	// same call (the API server away, a conflict).
	Transient(err error) bool
}

// WatchHandlers are called by a Cluster's watch of the Node.
type WatchHandlers struct {
	// Changed: the Node appeared, or its desired config or MIG strategy
	// label changed: a pass is due.
	Changed func()
	// Stale: the desired config changed or the Node is gone: the pass in
	// progress acts on a stale value and must stop where it safely can.
	Stale func()
	// Error: the watch could not list or watch the Node.
	Error func(error)
}

// NodeWatch is a running watch of the Node.
type NodeWatch struct {
	// Node is the Node as last seen; seen is false while it has not been
	// seen (Standalone: always seen, and nil).
	Node func() (node *Node, seen bool)
	// Sync waits until the watch holds the Node's current state; false
	// when ctx ended first. Nil when there is nothing to wait for
	// (Standalone): the daemon is ready once its first pass is done.
	Sync func(ctx context.Context) bool
	// Stop ends the watch and waits for it.
	Stop func()
}

// Step runs one step of a change for a port (as gpus.ApplyOptions.Step):
// what names it, do makes it and records in the change what it did, retry
// repeats do while the API server is away. Disruptor takes it written out,
// so that an implementation need not import the core.
type Step func(what string, retry bool, do func() error) error

// Disruptor finds and moves the pods a change disturbs. The daemon calls it
// between journaling the intent and touching a GPU; every method is safe to
// repeat after a crash, and what one needs of another comes as an argument.
type Disruptor interface {
	// Hold taints the node (where taint) and pauses the GPU Operator's
	// operands (where pause), each through step, recording in ch what it
	// did (TaintAdded, Operands) for the core to journal: a crash resumes,
	// and Release undoes, exactly that. The error is the first step's.
	Hold(ctx context.Context, ch *journal.Change, taint, pause bool, step func(what string, retry bool, do func() error) error) error
	// Release undoes what ch says Hold did, each through step (a failed
	// one left in ch), and clears what it undid from ch.
	Release(ctx context.Context, ch *journal.Change, step func(what string, retry bool, do func() error) error)
	// Affected lists the pods holding one of the whole GPUs or MIG devices
	// the change takes away ("namespace/name"), and how they were found.
	Affected(ctx context.Context, gpuUUIDs, migUUIDs []string) (pods []string, how string, err error)
	// Evict evicts those pods through the Eviction API and waits until they
	// are gone; the error names the pods still there.
	Evict(ctx context.Context, pods []string) (evicted []string, err error)
	// DevicePlugins lists the node's device plugin, GPU Feature Discovery
	// and DRA kubelet plugin pods ("namespace/name/uid"): they read the
	// MIG devices only when they start.
	DevicePlugins(ctx context.Context) (pods []string, err error)
	// RestartDevicePlugins evicts those of pods that still run (same UID),
	// so that their DaemonSets start new ones. Safe to repeat.
	RestartDevicePlugins(ctx context.Context, pods []string) (restarted []string, err error)
	// WaitResources waits until the node advertises exactly what the GPUs
	// imply on ch's path (ServedBy): on record.ServedByDRA the DRA
	// driver's devices in its ResourceSlices, else the device plugin's
	// resources under strategy in its allocatable. migMode and migDevices
	// are what the GPUs expose (gpus.Inventory.Exposed). The figures of
	// ch.OldPlugins never count; ch.PluginsRestarted says new plugin pods
	// are on their way. It only reads ch. ok is false on timeout; waited
	// is false when nothing could be expected.
	WaitResources(ctx context.Context, ch *journal.Change, strategy string, migMode map[string]bool, migDevices map[string]string, timeout time.Duration) (waited, ok bool, err error)
	// ServedBy says which allocation path hands the node's GPUs to pods
	// (record.ServedByDevicePlugin, record.ServedByDRA, "" when neither is
	// seen); conflict describes both at once on the node (refused).
	ServedBy(ctx context.Context) (path, conflict string, err error)
}

// StartupTaints removes the taints the node joined with (--startup-taint)
// once its geometry has converged.
type StartupTaints interface {
	// Lift removes exactly those taints from the Node, where its state
	// label says success or nothing; lifted is false, and nothing was
	// written, when the state label says otherwise.
	Lift(ctx context.Context) (lifted bool, err error)
}

// OtherManagers finds another MIG manager at work on the node.
type OtherManagers interface {
	// Check describes the other MIG manager at work on the node, or "".
	Check(ctx context.Context) (string, error)
}

// Slots limits how many nodes of a pool are disrupted at once
// (--max-concurrent).
type Slots interface {
	// Acquire takes a rollout slot, first come, first served.
	Acquire(ctx context.Context) (Slot, error)
	// ExtendForReboot keeps the slot taken by Acquire through a reboot: the
	// next release stops renewing it without freeing it, and the Lease is
	// stretched to cover the reboot. It fails when the slot is not held.
	ExtendForReboot(ctx context.Context) error
}

// Slot is a rollout slot taken by Acquire. Its holder renews it in the
// background; a renewal that fails past the lease duration, or finds the
// slot held by another, loses it.
type Slot interface {
	// Check confirms the slot is still this node's before a disruptive
	// step (an eviction, a GPU change, a reboot): nil while it is, else
	// why it is not. It sends a renewal only when the last one is too old
	// to vouch for the slot (a paused process, a failing API server).
	Check(ctx context.Context) error
	// Guard is ctx, ended too as the holder learns the slot is lost (its
	// watch of the slot Lease, or a renewal, shows another holder): the
	// drain stops at once and fails before its next eviction.
	Guard(ctx context.Context) (context.Context, context.CancelFunc)
	// Release gives the slot back, if it is still held; with keep, it only
	// stops renewing it: a change parked by a shutdown, whose node stays
	// disrupted until the agent, back, takes the slot again and ends it.
	Release(keep bool)
}

// Owner is this agent's claim on its node (one agent per node: the node
// Lease). Confirm is nil while the agent holds its node, else why not; the
// core asks before every GPU-mutating step.
type Owner interface {
	Confirm(ctx context.Context) error
}

// Inhibitor holds off shutdown while NVML is mid-change.
type Inhibitor interface {
	Inhibit(ctx context.Context, why string) (release func() error, err error)
}

// Rebooter reboots the machine (logind, systemctl, sim). Reboot returns
// once the reboot was requested.
type Rebooter interface {
	Reboot(ctx context.Context, reason string) error
}

// CDI refreshes what containers get of the GPUs through the Container
// Device Interface after a change (package cdi); done is false where CDI
// is not in use on the node (nothing was run). The error names the step.
type CDI interface {
	Refresh(ctx context.Context) (done bool, err error)
}

// HostUnits stops and starts the host's GPU client services.
type HostUnits interface {
	StopActive(ctx context.Context, names []string) (stopped []string, err error)
	Start(ctx context.Context, names []string) error
}

// Notifier reports to systemd.
type Notifier interface {
	Ready() error
	Status(format string, args ...any) error
}

// Metrics is what the daemon reports, implemented over Prometheus by the
// agent's wiring: the gauges as one Status reported whole on each change,
// and counts of what happened. No call depends on another coming first.
type Metrics interface {
	Report(s Status)
	// Reconfigured counts a finished change (success or failed).
	Reconfigured(result string, took time.Duration)
	Evicted(pods int)
	Rebooted()
	// Collected reports one attempt to read a source ("nvml",
	// "pod-resources"): failed or not.
	Collected(collector string, failed bool)
}

// Status is what the daemon's gauges show; its zero value is what they
// show before the daemon's first report.
type Status struct {
	State, Desired             string          // the state label's value, the config asked
	AppliedConfig, AppliedHash string          // the geometry the GPUs hold
	GPUs                       *gpus.Inventory // as last read; nil: not yet
	NVMLUp                     bool
	Drift                      bool // the GPUs differ from the applied config
	RebootGuardTripped         bool // a reboot would repeat the one made for the change
	// ResourcesNotConverged: the node did not advertise what the GPUs hold
	// when last awaited.
	ResourcesNotConverged bool
	LastSuccess           time.Time // zero: none yet
	LastFailure           string    // the last failure's reason, "" since a success
}

type nopNotifier struct{}

func (nopNotifier) Ready() error                { return nil }
func (nopNotifier) Status(string, ...any) error { return nil }
