// Package fresh tells whether the figures a node advertises after a MIG
// change come from a plugin that started after it.
package fresh

import (
	"context"
	"maps"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// After a change the node's figures count only when a plugin that started
// after the change wrote them: the figures of the plugin that read the old
// geometry may already match the new one (two GPUs swapping roles, MIG off
// and 7 MIG devices; or, with the sharing config unknown, 4 old devices read
// as 2 new ones × 2 replicas).
//
// NVIDIA's device plugin registers with the kubelet once it has enumerated
// the devices (k8s-device-plugin cmd/nvidia-device-plugin/main.go
// startPlugins, internal/plugin/server.go Start → Register); the kubelet's
// device manager then holds its devices (ListAndWatch), and the kubelet
// writes them into the Node's status on its next status sync
// (nodeStatusUpdateFrequency, 10 s: kubelet_node_status.go syncNodeStatus),
// and only when the status changed (tryUpdateNodeStatus,
// nodeStatusHasChanged). When the old plugin's pod ends, the device manager
// marks its devices unhealthy at once (PluginDisconnected →
// markResourceUnhealthy): allocatable 0 from the next status write on.
//
// So the Node's allocatable is taken as the new plugin's when a plugin pod
// the change did not see before the GPUs changed (its UID) runs and is
// Ready, no plugin pod of before is left on the node, the allocatable shows
// the new geometry, and it was written after the old plugin left:
//   - its figures differ from those at the start of the wait (which the
//     old plugin's restart began), or
//   - a read during the wait did not show the new geometry, and a later one
//     does (the figures moved: the old plugin's devices went, new ones
//     came), or
//   - settle has passed since the new pod became Ready with the old ones
//     gone: longer than the kubelet's status sync, after which figures the
//     new plugin did not advertise would have been replaced (a restart
//     faster than one sync, with the same figures, leaves the kubelet
//     nothing to write). Ready is when the agent saw it, or the pod's Ready
//     condition's transition where that is earlier (a retry's wait that
//     finds the plugin up already).

// Proof is the state of that proof during one wait.
type Proof struct {
	// Pods reads the node's pods.
	Pods func(ctx context.Context) ([]corev1.Pod, error)
	// IsPlugin picks the plugin's own pods (not GFD's or the validator's).
	IsPlugin func(*corev1.Pod) bool
	// IsFigure picks the resources the plugin advertises.
	IsFigure func(corev1.ResourceName) bool
	// Old: the UIDs of the pods that ran before the GPUs changed.
	Old    map[types.UID]bool
	Settle time.Duration
	Now    func() time.Time

	// readyAt: when a new plugin pod was first seen Ready with the old
	// ones gone (zero: not yet); newPod names it.
	readyAt time.Time
	newPod  string
	// waiting says what the pods lack, for the timeout's reason.
	waiting string

	// The Node's figures as the wait saw them.
	started     bool
	start       map[corev1.ResourceName]int64 // at the first read
	sawMismatch bool                          // a read did not show the geometry
	moved       bool                          // the current figures came after such a read
	matching    bool                          // the last read showed the geometry
}

// CheckPods reads the node's pods and notes a new plugin pod Ready.
func (f *Proof) CheckPods(ctx context.Context) error {
	if !f.readyAt.IsZero() {
		return nil
	}
	pods, err := f.Pods(ctx)
	if err != nil {
		return err
	}
	var oldLeft, notReady []string
	var ready string
	var readySince time.Time
	for i := range pods {
		p := &pods[i]
		if !f.IsPlugin(p) {
			continue
		}
		name := p.Namespace + "/" + p.Name
		switch {
		case f.Old[p.UID]:
			oldLeft = append(oldLeft, name)
		case p.DeletionTimestamp != nil:
			oldLeft = append(oldLeft, name+" (terminating)")
		case !podReady(p):
			notReady = append(notReady, name)
		case ready == "":
			ready, readySince = name, readyTransition(p)
		}
	}
	switch {
	case ready != "" && len(oldLeft) == 0:
		f.readyAt, f.newPod, f.waiting = f.Now(), ready, ""
		// Ready before this wait saw it (a retry's wait; the kubelet's
		// clock is the agent's own on its node): counted from then.
		if !readySince.IsZero() && readySince.Before(f.readyAt) {
			f.readyAt = readySince
		}
	case len(oldLeft) > 0:
		sort.Strings(oldLeft)
		f.waiting = "a device plugin pod that read the GPUs before the change still runs: " + strings.Join(oldLeft, ", ")
	case len(notReady) > 0:
		sort.Strings(notReady)
		f.waiting = "no device plugin pod started after the change is Running and Ready (" + strings.Join(notReady, ", ") + " not yet)"
	default:
		f.waiting = "no device plugin pod started after the change is Running and Ready (none on the node)"
	}
	return nil
}

// readyTransition is when p's Ready condition turned true, rounded up to
// the next second (the API keeps whole seconds); zero when not known.
func readyTransition(p *corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && !c.LastTransitionTime.IsZero() {
			return c.LastTransitionTime.Add(time.Second)
		}
	}
	return time.Time{}
}

// podReady: Running and Ready.
func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Observe notes one read of the Node's figures, matching the new geometry
// or not.
func (f *Proof) Observe(n *corev1.Node, match bool) {
	figures := f.figures(n.Status.Allocatable)
	if !f.started {
		f.started, f.start = true, figures
	}
	switch {
	case !match:
		f.sawMismatch, f.moved, f.matching = true, false, false
	case !f.matching:
		f.moved, f.matching = f.sawMismatch, true
	}
	if match && !maps.Equal(figures, f.start) {
		f.moved = true
	}
}

// Proven says whether the figures last observed (matching) are the new
// plugin's, and else what is missing.
func (f *Proof) Proven() (bool, string) {
	if f.readyAt.IsZero() {
		return false, f.waiting
	}
	if f.moved || f.Now().Sub(f.readyAt) >= f.Settle {
		return true, ""
	}
	return false, "the Node's allocatable shows the figures it showed before the device plugin's restart; waiting " + f.Settle.String() +
		" after " + f.newPod + " became Ready for the kubelet to write what the new plugin advertises"
}

// Ready says whether a new plugin pod was seen Ready with the old ones gone.
func (f *Proof) Ready() bool { return !f.readyAt.IsZero() }

// Waiting says what the pods lack ("" when nothing).
func (f *Proof) Waiting() string { return f.waiting }

// figures is the plugin's part of a resource list (IsFigure), zeros left out.
func (f *Proof) figures(l corev1.ResourceList) map[corev1.ResourceName]int64 {
	out := map[corev1.ResourceName]int64{}
	for r, q := range l {
		if f.IsFigure(r) && q.Value() != 0 {
			out[r] = q.Value()
		}
	}
	return out
}
