package drain

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/migagent/mig-agent/internal/kclient"
)

// The taint that keeps new pods off the node while a change runs:
// migagent.io/reconfiguring=true:NoSchedule.
const (
	TaintKey    = "migagent.io/reconfiguring"
	taintValue  = "true"
	TaintEffect = corev1.TaintEffectNoSchedule
)

// Taint returns the reconfiguring taint.
func Taint() corev1.Taint {
	return corev1.Taint{Key: TaintKey, Value: taintValue, Effect: TaintEffect}
}

// addTaint adds the reconfiguring taint to node. When the node already has a
// NoSchedule taint with TaintKey (someone else's, whatever its value), it is
// left alone and added is false: the caller must then not remove it. Journal
// added before acting on it.
func addTaint(ctx context.Context, client kclient.Interface, node string) (added bool, err error) {
	if node == "" {
		return false, fmt.Errorf("add taint: %w", errNoNode)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		added = false
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if hasTaintKey(n.Spec.Taints) {
			return nil
		}
		n.Spec.Taints = append(n.Spec.Taints, Taint())
		if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return err
		}
		added = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("add taint %s to node %s: %w", TaintKey, node, err)
	}
	return added, nil
}

// removeTaint removes the reconfiguring taint (exactly key, value and
// effect) from node; call it only when addTaint reported added. It reports
// whether a taint was removed; a missing taint is no error, so it is safe to
// repeat.
func removeTaint(ctx context.Context, client kclient.Interface, node string) (removed bool, err error) {
	if node == "" {
		return false, fmt.Errorf("remove taint: %w", errNoNode)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		removed = false
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var kept []corev1.Taint
		if kept, removed = withoutTaint(n.Spec.Taints); !removed {
			return nil
		}
		n.Spec.Taints = kept
		_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		if err != nil {
			removed = false
		}
		return err
	})
	if err != nil {
		return false, fmt.Errorf("remove taint %s from node %s: %w", TaintKey, node, err)
	}
	return removed, nil
}

// addTaintFrom adds the taint with one request, from cached (the agent's
// watch of its Node): a merge patch of the taints that carries cached's
// resourceVersion, which the API server refuses (a conflict) if the Node
// changed since. done is false, and nothing was written, when cached
// already shows the taint (it may be stale: only a read tells whose it is)
// or the Node changed since it was cached: the caller then uses addTaint.
func addTaintFrom(ctx context.Context, client kclient.Interface, cached *corev1.Node) (added, done bool, err error) {
	if hasTaintKey(cached.Spec.Taints) {
		return false, false, nil
	}
	taints := append(append([]corev1.Taint{}, cached.Spec.Taints...), Taint())
	return patchTaints(ctx, client, cached, taints)
}

// removeTaintFrom removes the taint with one request, from cached, as
// addTaintFrom adds it; done is false, and nothing was written, when cached
// does not show the taint or the Node changed since it was cached: the
// caller then uses removeTaint.
func removeTaintFrom(ctx context.Context, client kclient.Interface, cached *corev1.Node) (removed, done bool, err error) {
	kept, ours := withoutTaint(cached.Spec.Taints)
	if !ours {
		return false, false, nil
	}
	return patchTaints(ctx, client, cached, kept)
}

// hasTaintKey: a NoSchedule taint with TaintKey is there, the agent's or
// someone else's (whatever its value).
func hasTaintKey(taints []corev1.Taint) bool {
	return slices.ContainsFunc(taints, func(t corev1.Taint) bool { return t.Key == TaintKey && t.Effect == TaintEffect })
}

// withoutTaint is taints without the agent's own taint (exactly key, value
// and effect; never nil, so that a patch writes an empty list), and whether
// it was there.
func withoutTaint(taints []corev1.Taint) (kept []corev1.Taint, removed bool) {
	want := Taint()
	kept = []corev1.Taint{}
	for _, t := range taints {
		if t.Key == want.Key && t.Value == want.Value && t.Effect == want.Effect {
			removed = true
			continue
		}
		kept = append(kept, t)
	}
	return kept, removed
}

// patchTaints sets the Node's taints to taints if it is still at cached's
// resourceVersion: ok and done, or not done (a conflict: it changed), or an
// error.
func patchTaints(ctx context.Context, client kclient.Interface, cached *corev1.Node, taints []corev1.Taint) (ok, done bool, err error) {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": cached.ResourceVersion},
		"spec":     map[string]any{"taints": taints},
	})
	if err != nil {
		return false, false, err
	}
	_, err = client.CoreV1().Nodes().Patch(ctx, cached.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "mig-agent"})
	switch {
	case err == nil:
		return true, true, nil
	case apierrors.IsConflict(err):
		return false, false, nil
	default:
		return false, true, fmt.Errorf("node %s taints: %w", cached.Name, err)
	}
}
