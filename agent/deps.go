package agent

import (
	"context"

	"encoding/json"
	corev1 "k8s.io/api/core/v1"
	"time"

	"github.com/migagent/mig-agent/metrics"
)

// Disruptor finds and moves the pods a change disturbs. The daemon calls it
// between journaling the intent and touching a GPU; every method is safe to
// repeat after a crash.
type Disruptor interface {
	// Affected lists the pods holding one of the whole GPUs or MIG devices
	// the change takes away ("namespace/name"), and how they were found.
	Affected(ctx context.Context, gpuUUIDs, migUUIDs []string) (pods []string, how string, err error)
	// Evict evicts those pods through the Eviction API and waits until they
	// are gone; the error names the pods still there.
	Evict(ctx context.Context, pods []string) (evicted []string, err error)
	// Taint adds the reconfiguring taint; added is false when it was there.
	Taint(ctx context.Context) (added bool, err error)
	// Untaint removes the reconfiguring taint.
	Untaint(ctx context.Context) error
	// ReadOperands reads the GPU Operator operand labels' values, to be
	// journaled before PauseOperands and restored later.
	ReadOperands(ctx context.Context) (saved json.RawMessage, err error)
	// PauseOperands pauses the operands ReadOperands found and waits
	// (bounded) for their pods to leave.
	PauseOperands(ctx context.Context, saved json.RawMessage) error
	// RestoreOperands restores what PauseOperands saved.
	RestoreOperands(ctx context.Context, saved json.RawMessage) error
	// DevicePlugins lists the node's device plugin and GPU Feature
	// Discovery pods ("namespace/name/uid"): they read the MIG devices only
	// when they start.
	DevicePlugins(ctx context.Context) (pods []string, err error)
	// RestartDevicePlugins evicts those of pods that still run (same UID),
	// so that their DaemonSets start new ones. Safe to repeat.
	RestartDevicePlugins(ctx context.Context, pods []string) (restarted []string, err error)
	// WaitResources waits until the Node's allocatable shows exactly the
	// resources the geometry implies; ok is false on timeout.
	WaitResources(ctx context.Context, want map[corev1.ResourceName]int64, timeout time.Duration) (ok bool, err error)
}

// Rebooter reboots the machine (logind, systemctl, sim). Reboot returns
// once the reboot was requested.
type Rebooter interface {
	Reboot(ctx context.Context, reason string) error
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

// Metrics is what the daemon reports; *metrics.Metrics implements it.
type Metrics interface {
	SetState(state string)
	SetDesiredConfig(name string)
	SetAppliedConfig(name, hash string)
	SetGPUs(gpus []metrics.GPU)
	SetUnusableGPUs(gpus []metrics.UnusableGPU)
	ObserveReconfiguration(result string, d time.Duration)
	AddEvictedPods(n int)
	IncReboots()
	SetLastSuccess(t time.Time)
	SetDrift(drift bool)
	SetNVMLUp(up bool)
	// SetCollectorError reports one attempt to read a source ("nvml",
	// "pod-resources"): failed or not.
	SetCollectorError(collector string, failed bool)
	SetLastFailure(reason string)
	SetRebootGuardTripped(b bool)
	SetResourcesConverged(b bool)
}

var _ Metrics = (*metrics.Metrics)(nil)

type nopNotifier struct{}

func (nopNotifier) Ready() error                { return nil }
func (nopNotifier) Status(string, ...any) error { return nil }
