package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/drain"
)

// KubeDisruptor is the Disruptor over the drain package.
type KubeDisruptor struct {
	Client kubernetes.Interface
	Log    *slog.Logger
	Node   string
	S      *Settings
	// OperandWait bounds the wait for paused operand pods to leave.
	OperandWait time.Duration
}

var _ Disruptor = (*KubeDisruptor)(nil)

// Affected implements Disruptor.
func (k *KubeDisruptor) Affected(ctx context.Context, gpuUUIDs, migUUIDs []string) ([]string, string, error) {
	a, err := drain.FindAffected(ctx, k.Client, k.Log, k.Node, k.S.PodResourcesSocket, drain.Change{GPUs: gpuUUIDs, MIGDevices: migUUIDs})
	if err != nil {
		return nil, "", err
	}
	if a.FellBack() {
		k.Log.Warn("PodResources unreadable: every GPU pod on the node counts as affected", "how", a.How)
	}
	return a.Names(), a.How, nil
}

// Evict implements Disruptor; pods already gone count as evicted.
func (k *KubeDisruptor) Evict(ctx context.Context, names []string) ([]string, error) {
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

// Taint implements Disruptor.
func (k *KubeDisruptor) Taint(ctx context.Context) (bool, error) {
	return drain.AddTaint(ctx, k.Client, k.Node)
}

// Untaint implements Disruptor.
func (k *KubeDisruptor) Untaint(ctx context.Context) error {
	_, err := drain.RemoveTaint(ctx, k.Client, k.Node)
	return err
}

// ReadOperands implements Disruptor.
func (k *KubeDisruptor) ReadOperands(ctx context.Context) (json.RawMessage, error) {
	saved, err := drain.ReadOperands(ctx, k.Client, k.Node)
	if err != nil {
		return nil, err
	}
	return json.Marshal(saved)
}

// PauseOperands implements Disruptor.
func (k *KubeDisruptor) PauseOperands(ctx context.Context, raw json.RawMessage) error {
	var saved drain.Saved
	if err := json.Unmarshal(raw, &saved); err != nil {
		return fmt.Errorf("operand labels: %w", err)
	}
	return drain.PauseOperands(ctx, k.Client, k.Log, k.Node, saved, k.OperandWait)
}

// RestoreOperands implements Disruptor.
func (k *KubeDisruptor) RestoreOperands(ctx context.Context, raw json.RawMessage) error {
	var saved drain.Saved
	if err := json.Unmarshal(raw, &saved); err != nil {
		return fmt.Errorf("journaled operand labels: %w", err)
	}
	return drain.RestoreOperands(ctx, k.Client, k.Log, k.Node, saved)
}

// DevicePlugins implements Disruptor.
func (k *KubeDisruptor) DevicePlugins(ctx context.Context) ([]string, error) {
	return drain.ListDevicePlugins(ctx, k.Client, k.Node)
}

// RestartDevicePlugins implements Disruptor.
func (k *KubeDisruptor) RestartDevicePlugins(ctx context.Context, pods []string) ([]string, error) {
	return drain.RestartDevicePlugins(ctx, k.Client, k.Log, pods)
}

// WaitResources implements Disruptor.
func (k *KubeDisruptor) WaitResources(ctx context.Context, want map[corev1.ResourceName]int64, timeout time.Duration) (bool, error) {
	return drain.WaitAllocatable(ctx, k.Client, k.Node, want, timeout)
}

// ExpectedResources is what the device plugin advertises for the node's
// geometry under its MIG strategy (the node's nvidia.com/mig.strategy; empty
// is the device plugin's default, none).
func ExpectedResources(strategy string, n *Inventory) (map[corev1.ResourceName]int64, error) {
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
