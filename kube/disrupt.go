package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
)

// Disruptor is the reconcile.Disruptor over the drain package.
type Disruptor struct {
	Client kclient.Interface
	Log    *slog.Logger
	Node   string
	S      *settings.Settings
	// OperandWait bounds the wait for paused operand pods to leave.
	OperandWait time.Duration
	// ReadNode reads the Node (nil: a GET); the agent passes the watch's
	// cache (Cluster.CachedNode), which already holds its allocatable.
	ReadNode func(ctx context.Context) (*corev1.Node, error)

	// path is what ServedBy found last (record.ServedBy*).
	path string
	// restarted: RestartDevicePlugins restarted a pod since the last
	// WaitResources, so a new plugin pod is on its way (readSharing waits
	// briefly for it).
	restarted bool
}

var _ reconcile.Disruptor = (*Disruptor)(nil)

// Affected implements reconcile.Disruptor.
func (k *Disruptor) Affected(ctx context.Context, gpuUUIDs, migUUIDs []string) ([]string, string, error) {
	a, err := drain.FindAffected(ctx, k.Client, k.Log, k.Node, k.S.PodResourcesSocket, drain.Change{GPUs: gpuUUIDs, MIGDevices: migUUIDs})
	if err != nil {
		return nil, "", err
	}
	if a.FellBack() {
		k.Log.Warn("PodResources unreadable: every GPU pod on the node counts as affected", "how", a.How)
	}
	names := a.Names()
	if k.S.GPUClientSelector != "" && (len(gpuUUIDs) > 0 || len(migUUIDs) > 0) {
		clients, err := drain.SelectedPods(ctx, k.Client, k.Node, k.S.GPUClientSelector)
		if err != nil {
			return nil, "", err
		}
		for _, c := range clients {
			if !slices.Contains(names, c) {
				names = append(names, c)
			}
		}
		sort.Strings(names)
	}
	return names, a.How, nil
}

// Evict implements reconcile.Disruptor; pods already gone count as evicted.
func (k *Disruptor) Evict(ctx context.Context, names []string) ([]string, error) {
	var pods []corev1.Pod
	for _, n := range names {
		ns, name, _ := strings.Cut(n, "/")
		p, err := k.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && p.Spec.NodeName != k.Node) {
			continue // gone (or a new pod of that name elsewhere)
		}
		if err != nil {
			return nil, err
		}
		pods = append(pods, *p)
	}
	evicted, err := drain.Evict(ctx, k.Client, k.Log, pods, drain.EvictOptions{
		Timeout: k.S.DrainTimeout, RetryDelay: k.S.EvictionRetryDelay, RefuseUnmanaged: !k.S.EvictUnmanagedPods,
	})
	return evicted, err
}

// cachedNode is the Node as the agent's watch holds it (nil without one):
// the taint, the operand labels and the device plugin's config label are
// read from it instead of a GET each.
func (k *Disruptor) cachedNode(ctx context.Context) *corev1.Node {
	if k.ReadNode == nil {
		return nil
	}
	n, err := k.ReadNode(ctx)
	if err != nil || n == nil || n.Name != k.Node {
		return nil
	}
	return n
}

// Taint implements reconcile.Disruptor: one patch from the watched Node, or,
// when that Node is stale or already shows a taint, a read and an update.
func (k *Disruptor) Taint(ctx context.Context) (bool, error) {
	if n := k.cachedNode(ctx); n != nil {
		if added, done, err := drain.AddTaintFrom(ctx, k.Client, n); done {
			return added, err
		}
	}
	return drain.AddTaint(ctx, k.Client, k.Node)
}

// Untaint implements reconcile.Disruptor, as Taint.
func (k *Disruptor) Untaint(ctx context.Context) error {
	if n := k.cachedNode(ctx); n != nil {
		if _, done, err := drain.RemoveTaintFrom(ctx, k.Client, n); done {
			return err
		}
	}
	_, err := drain.RemoveTaint(ctx, k.Client, k.Node)
	return err
}

// ReadOperands implements reconcile.Disruptor, from the watched Node.
func (k *Disruptor) ReadOperands(ctx context.Context) (json.RawMessage, error) {
	var saved drain.Saved
	if n := k.cachedNode(ctx); n != nil {
		saved = drain.OperandsOf(n)
	} else {
		var err error
		if saved, err = drain.ReadOperands(ctx, k.Client, k.Node); err != nil {
			return nil, err
		}
	}
	return json.Marshal(saved)
}

// PauseOperands implements reconcile.Disruptor.
func (k *Disruptor) PauseOperands(ctx context.Context, raw json.RawMessage) error {
	var saved drain.Saved
	if err := json.Unmarshal(raw, &saved); err != nil {
		return fmt.Errorf("operand labels: %w", err)
	}
	return drain.PauseOperands(ctx, k.Client, k.Log, k.Node, saved, k.OperandWait)
}

// RestoreOperands implements reconcile.Disruptor.
func (k *Disruptor) RestoreOperands(ctx context.Context, raw json.RawMessage) error {
	var saved drain.Saved
	if err := json.Unmarshal(raw, &saved); err != nil {
		return fmt.Errorf("journaled operand labels: %w", err)
	}
	return drain.RestoreOperands(ctx, k.Client, k.Log, k.Node, saved)
}

// DevicePlugins implements reconcile.Disruptor.
func (k *Disruptor) DevicePlugins(ctx context.Context) ([]string, error) {
	return drain.ListDevicePlugins(ctx, k.Client, k.Node)
}

// RestartDevicePlugins implements reconcile.Disruptor.
func (k *Disruptor) RestartDevicePlugins(ctx context.Context, pods []string) ([]string, error) {
	restarted, err := drain.RestartDevicePlugins(ctx, k.Client, k.Log, pods)
	if len(restarted) > 0 {
		k.restarted = true
	}
	return restarted, err
}

// WaitResources implements reconcile.Disruptor. On the DRA path (as
// ServedBy found it) the node's gpu.nvidia.com ResourceSlices must announce
// exactly the GPUs and MIG devices of n (ExpectedDRAUUIDs); otherwise the
// Node's allocatable must show exactly what the device plugin advertises
// for n's geometry under strategy.
func (k *Disruptor) WaitResources(ctx context.Context, strategy string, n *gpus.Inventory, timeout time.Duration) (waited, ok bool, err error) {
	if k.path == record.ServedByDRA {
		ok, err = k.waitSlices(ctx, ExpectedDRAUUIDs(n), timeout)
		return true, ok, err
	}
	want, err := ExpectedResources(strategy, n)
	if err != nil {
		return false, false, err
	}
	sharing := k.readSharing(ctx, k.restarted)
	k.restarted = false
	ok, err = drain.WaitAdvertised(ctx, k.Client, k.Node, want, sharing, timeout)
	return true, ok, err
}

// Reading the device plugin's sharing config while its pods are restarted:
// a few tries, this far apart, for a pod to read it from.
const (
	sharingReadTries = 5
	sharingReadDelay = time.Second
)

// readSharing reads the device plugin's sharing config (drain.ReadSharing);
// nil where it cannot be known, so that the plugin's documented forms are
// accepted. When this change restarted plugin pods (restarted), no plugin
// pod at all is retried briefly: the restart removed the old pod, and its
// DaemonSet has not made the new one yet. A node that had no plugin pod
// before the change has none to wait for.
func (k *Disruptor) readSharing(ctx context.Context, restarted bool) *drain.Sharing {
	var err error
	for try := 0; try < sharingReadTries; try++ {
		var s *drain.Sharing
		if n := k.cachedNode(ctx); n != nil {
			s, err = drain.ReadSharingOf(ctx, k.Client, n)
		} else {
			s, err = drain.ReadSharing(ctx, k.Client, k.Node)
		}
		if err == nil {
			k.Log.Debug("device plugin sharing config", "source", s.Source)
			return s
		}
		if !restarted || !errors.Is(err, drain.ErrNoPluginPod) {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(sharingReadDelay):
		}
	}
	k.Log.Info("the device plugin's sharing config is not known; accepting its documented sharing forms", "err", err)
	return nil
}

// ExpectedResources is what the device plugin advertises for the node's
// geometry under its MIG strategy (the node's nvidia.com/mig.strategy; empty
// is the device plugin's default, none).
func ExpectedResources(strategy string, n *gpus.Inventory) (map[corev1.ResourceName]int64, error) {
	var gpus []drain.GPUGeometry
	for i, dev := range n.Devices {
		g := drain.GPUGeometry{MigEnabled: dev.MigCapable && dev.MigMode.Current}
		for _, gi := range n.Instances[i] {
			for _, ci := range gi.ComputeInstances {
				g.Devices = append(g.Devices, ci.Profile)
			}
		}
		gpus = append(gpus, g)
	}
	return drain.ExpectedResources(strategy, gpus)
}
