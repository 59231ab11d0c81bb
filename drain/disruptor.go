package drain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/migagent/mig-agent/drain/fresh"
	"github.com/migagent/mig-agent/drain/sharing"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
)

// Disruptor is the agent's reconcile.Disruptor: which pods a change evicts
// and their eviction (affected.go, evict.go), the reconfiguring taint, the
// GPU Operator's operands, the device plugin's restart and the wait for the
// node to advertise the new devices (servedby.go on the DRA path).
type Disruptor struct {
	Client kclient.Interface
	Log    *slog.Logger
	Node   string
	// Settings are the daemon's: the PodResources socket, the
	// --gpu-client-selector, the drain timeout and eviction retry delay,
	// whether pods with no controller may be evicted.
	Settings *settings.Settings
	// OperandWait bounds the wait for paused operand pods to leave.
	OperandWait time.Duration
	// ReadNode reads the Node (nil: a GET); the agent passes the watch's
	// cache (Cluster.CachedNode), which already holds its allocatable.
	ReadNode func(ctx context.Context) (*corev1.Node, error)

	// PluginSettle is fresh.Proof's Settle (0: DefaultPluginSettle).
	PluginSettle time.Duration

	// selOnce parses the operand selectors of Settings once (sels,
	// selErr); loadSettings has checked them at start.
	selOnce sync.Once
	sels    *Selectors
	selErr  error
}

// selectors are the operand selectors (--operand-selector,
// --plugin-selector), parsed once.
func (d *Disruptor) selectors() (*Selectors, error) {
	d.selOnce.Do(func() {
		d.sels, d.selErr = ParseSelectors(d.Settings.OperandSelectors, d.Settings.PluginSelectors)
		if d.selErr == nil {
			d.sels.Within(OperandNamespaces(d.Settings.OperandNamespaces, d.Settings.Namespace))
		}
	})
	return d.sels, d.selErr
}

// cachedNode is the Node as the agent's watch holds it (nil without one):
// the taint, the operand labels and the device plugin's config label are
// read from it instead of a GET each.
func (d *Disruptor) cachedNode(ctx context.Context) *corev1.Node {
	if d.ReadNode == nil {
		return nil
	}
	n, err := d.ReadNode(ctx)
	if err != nil || n == nil || n.Name != d.Node {
		return nil
	}
	return n
}

// Hold implements reconcile.Disruptor: the taint (one patch from the
// watched Node, or, when that Node is stale or already shows a taint, a
// read and an update) and the operands paused, their labels read first
// (from the watched Node) for the core to journal, each through step.
func (d *Disruptor) Hold(ctx context.Context, ch *journal.Change, taint, pause bool, step func(what string, retry bool, do func() error) error) error {
	if taint && !ch.TaintAdded {
		// The taint key is the agent's own: one already there was left by an
		// attempt that could not lift it (a crash between tainting and the
		// journal, an API outage), so this change lifts it too.
		if err := step("tainting the node", true, func() error {
			err := d.taint(ctx)
			ch.TaintAdded = err == nil
			return err
		}); err != nil {
			return err
		}
	}
	if !pause {
		return nil
	}
	if len(ch.Operands) == 0 { // journaled before pausing: a crash restores from there
		if err := step("reading GPU Operator operand labels", false, func() error {
			saved, err := d.operandLabels(ctx)
			if err == nil {
				ch.Operands, err = json.Marshal(saved)
			}
			return err
		}); err != nil {
			return err
		}
	}
	return step("pausing GPU Operator operands", false, func() error {
		var saved savedLabels
		if err := json.Unmarshal(ch.Operands, &saved); err != nil {
			return fmt.Errorf("operand labels: %w", err)
		}
		sels, err := d.selectors()
		if err != nil {
			return err
		}
		return pauseOperands(ctx, d.Client, d.Log, d.Node, saved, sels, d.OperandWait)
	})
}

// Release implements reconcile.Disruptor: the operands restored to the
// labels Hold journaled, and the taint lifted (as Hold added it), each
// through step, the second also when the first failed.
func (d *Disruptor) Release(ctx context.Context, ch *journal.Change, step func(what string, retry bool, do func() error) error) {
	if len(ch.Operands) > 0 {
		_ = step("restoring GPU Operator operand labels", true, func() error {
			var saved savedLabels
			if err := json.Unmarshal(ch.Operands, &saved); err != nil {
				return fmt.Errorf("journaled operand labels: %w", err)
			}
			err := restoreOperands(ctx, d.Client, d.Log, d.Node, saved)
			if err == nil {
				ch.Operands = nil
			}
			return err
		})
	}
	if ch.TaintAdded {
		_ = step("removing the reconfiguring taint", true, func() error {
			err := d.untaint(ctx)
			if err == nil {
				ch.TaintAdded = false
			}
			return err
		})
	}
}

func (d *Disruptor) taint(ctx context.Context) error {
	if n := d.cachedNode(ctx); n != nil {
		if _, done, err := addTaintFrom(ctx, d.Client, n); done {
			return err
		}
	}
	_, err := addTaint(ctx, d.Client, d.Node)
	return err
}

func (d *Disruptor) untaint(ctx context.Context) error {
	if n := d.cachedNode(ctx); n != nil {
		if _, done, err := removeTaintFrom(ctx, d.Client, n); done {
			return err
		}
	}
	_, err := removeTaint(ctx, d.Client, d.Node)
	return err
}

// operandLabels are the GPU Operator operand labels' values now.
func (d *Disruptor) operandLabels(ctx context.Context) (savedLabels, error) {
	if n := d.cachedNode(ctx); n != nil {
		return operandsOf(n), nil
	}
	return readOperands(ctx, d.Client, d.Node)
}

// DevicePlugins implements reconcile.Disruptor. The pods it lists are
// old: they read the GPUs before the change, or did not advertise them
// (the core notes them in the change, journal.Change.NotePlugins).
func (d *Disruptor) DevicePlugins(ctx context.Context) ([]string, error) {
	sels, err := d.selectors()
	if err != nil {
		return nil, err
	}
	return listDevicePlugins(ctx, d.Client, d.Log, d.Node, sels)
}

// oldUIDs are the UIDs of pods ("namespace/name/uid").
func oldUIDs(pods []string) map[types.UID]bool {
	old := make(map[types.UID]bool, len(pods))
	for _, ref := range pods {
		if parts := strings.SplitN(ref, "/", 3); len(parts) == 3 {
			old[types.UID(parts[2])] = true
		}
	}
	return old
}

// DefaultPluginSettle: how long the Node's allocatable must show the new
// geometry, unchanged, after a new device plugin pod is Ready, when nothing
// else proves the new plugin wrote it (fresh.Proof): longer than the
// kubelet's status sync (nodeStatusUpdateFrequency, 10 s, jittered by 4 %).
const DefaultPluginSettle = 12 * time.Second

// proof is what the wait asks of a plugin's figures, isPlugin picking the
// plugin's own pods, those of old never counting.
func (d *Disruptor) proof(isPlugin func(*corev1.Pod) bool, old map[types.UID]bool) *fresh.Proof {
	settle := d.PluginSettle
	if settle <= 0 {
		settle = DefaultPluginSettle
	}
	return &fresh.Proof{
		Pods:     func(ctx context.Context) ([]corev1.Pod, error) { return NodePods(ctx, d.Client, d.Node) },
		IsPlugin: isPlugin, IsFigure: isGPUResource, Old: old, Settle: settle, Now: time.Now,
	}
}

// RestartDevicePlugins implements reconcile.Disruptor.
func (d *Disruptor) RestartDevicePlugins(ctx context.Context, pods []string) ([]string, error) {
	return restartDevicePlugins(ctx, d.Client, d.Log, pods)
}

// WaitResources implements reconcile.Disruptor. On the DRA path
// (ch.ServedBy: record.ServedByDRA, as ServedBy found it) the node's gpu.nvidia.com ResourceSlices must announce
// exactly the GPUs with MIG off and the MIG devices (announced); otherwise
// the Node's allocatable must show exactly what the device plugin
// advertises for them under strategy (expectedResources). Either way the
// figures count only once the plugin that announces the devices (the DRA
// kubelet plugin, or the device plugin; not GFD or the validator) was
// restarted (fresh.Proof).
func (d *Disruptor) WaitResources(ctx context.Context, ch *journal.Change, strategy string, migMode map[string]bool, migDevices map[string]string, timeout time.Duration) (waited, ok bool, err error) {
	sels, err := d.selectors()
	if err != nil {
		return false, false, err
	}
	old := oldUIDs(ch.OldPlugins) // NotePlugins keeps every listed pod there, the stale ones too
	if ch.ServedBy == record.ServedByDRA {
		ok, err = d.waitSlices(ctx, announced(migMode, migDevices), d.proof(sels.Is(OperandDRAPlugin), old), timeout)
		return true, ok, err
	}
	want, err := expectedResources(strategy, migMode, migDevices)
	if err != nil {
		return false, false, err
	}
	isPlugin := sels.Is(OperandDevicePlugin)
	shared, err := d.readSharing(ctx, ch.PluginsRestarted, isPlugin)
	if err != nil {
		return true, false, err
	}
	ok, err = waitFresh(ctx, d.Client, d.Node, want, shared, d.proof(isPlugin, old), timeout)
	return true, ok, err
}

// Reading the device plugin's sharing config while its pods are restarted:
// a few tries, this far apart, for a pod to read it from.
const (
	sharingReadTries = 5
	sharingReadDelay = time.Second
)

// readSharing reads the device plugin's sharing config (sharing.ReadNode); nil
// where it cannot be known, so that the plugin's documented forms are
// accepted. When this change restarted plugin pods (restarted), no plugin
// pod at all is retried briefly: the restart removed the old pod, and its
// DaemonSet has not made the new one yet. A node that had no plugin pod
// before the change has none to wait for. A config whose replicas are out
// of bounds is an error (sharing.ErrReplicas): what the plugin advertises
// under it cannot be checked.
func (d *Disruptor) readSharing(ctx context.Context, restarted bool, isPlugin func(*corev1.Pod) bool) (*sharing.Config, error) {
	var err error
	for try := 0; try < sharingReadTries; try++ {
		var s *sharing.Config
		if n := d.cachedNode(ctx); n != nil {
			s, err = sharing.Read(ctx, d.Client, n, NodePods, isPlugin)
		} else {
			s, err = sharing.ReadNode(ctx, d.Client, d.Node, NodePods, isPlugin)
		}
		if err == nil {
			d.Log.Debug("device plugin sharing config", "source", s.Source)
			return s, nil
		}
		if errors.Is(err, sharing.ErrReplicas) {
			return nil, err
		}
		if !restarted || !errors.Is(err, sharing.ErrNoPluginPod) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(sharingReadDelay):
		}
	}
	d.Log.Info("the device plugin's sharing config is not known; accepting its documented sharing forms", "err", err)
	return nil, nil
}
