package kube

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
)

// Startup taints (--startup-taint): a node that joins with them (Karpenter's
// NodePool startupTaints, a kubelet --register-with-taints) takes no pod
// that does not tolerate them until the agent removes them, once its
// geometry has converged. Only those taints, exactly (key, value, effect),
// are removed; the agent never adds them, so a taint someone sets again
// later stays.

var _ reconcile.StartupTaints = (*Cluster)(nil)

// Lift implements reconcile.StartupTaints: the startup taints off the Node,
// where its state label says success or nothing (no request); any other
// state keeps them and lifted is false. A Node that carries none of them is
// lifted with no write.
func (k *Cluster) Lift(ctx context.Context) (lifted bool, err error) {
	var removed []corev1.Taint
	var uid string
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lifted, removed = false, nil
		n, err := k.getNode(ctx)
		if err != nil {
			return err
		}
		if st := n.Labels[record.LabelState]; st != "" && st != record.StateSuccess {
			k.log().Info("startup taints kept: the node's state is not success", "state", st)
			return nil
		}
		var kept []corev1.Taint
		kept, removed = withoutTaints(n.Spec.Taints, k.StartupTaints)
		if len(removed) == 0 {
			lifted = true
			return nil
		}
		n.Spec.Taints, uid = kept, string(n.UID)
		if _, err := k.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{FieldManager: "mig-agent"}); err != nil {
			return err
		}
		lifted = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("removing the startup taints from node %s: %w", k.Node, err)
	}
	if len(removed) > 0 {
		names := taintNames(removed)
		k.log().Info("startup taints removed: the node's geometry has converged", "taints", names)
		if err := k.event(context.WithoutCancel(ctx), uid, corev1.EventTypeNormal, record.ReasonStartupTaintsRemoved,
			"the node's MIG geometry has converged; startup taints removed: "+strings.Join(names, ", ")); err != nil {
			k.log().Warn("posting an event failed", "reason", record.ReasonStartupTaintsRemoved, "err", err)
		}
	}
	return lifted, nil
}

// withoutTaints is taints without those of drop (exactly key, value and
// effect; never nil, so that an update writes an empty list), and the ones
// dropped.
func withoutTaints(taints, drop []corev1.Taint) (kept, removed []corev1.Taint) {
	kept = []corev1.Taint{}
	for _, t := range taints {
		match := false
		for _, d := range drop {
			match = match || t.Key == d.Key && t.Value == d.Value && t.Effect == d.Effect
		}
		if match {
			removed = append(removed, t)
		} else {
			kept = append(kept, t)
		}
	}
	return kept, removed
}

// taintNames writes taints as key[=value]:effect.
func taintNames(taints []corev1.Taint) []string {
	out := make([]string, 0, len(taints))
	for _, t := range taints {
		kv := t.Key
		if t.Value != "" {
			kv += "=" + t.Value
		}
		out = append(out, kv+":"+string(t.Effect))
	}
	return out
}
