package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/migagent/mig-agent/internal/apierr"
	"github.com/migagent/mig-agent/record"
)

// The condition MIGConfigReady in the Node's status: what the state label
// says, in the form `kubectl describe node` and every tool that reads Node
// conditions show (status, reason, message), written with the record and
// with every state the agent sets. It is a view of the record: a condition
// that could not be written is logged, and the change goes on.

// Condition builds the MIGConfigReady condition of state for config (rec:
// the record that ends the change, nil while it runs), at now; prev is the
// condition on the Node (nil: none), whose lastTransitionTime stays while
// the status does not change.
func Condition(state, config string, rec *record.ChangeRecord, prev *corev1.NodeCondition, now time.Time) corev1.NodeCondition {
	status, reason := corev1.ConditionFalse, record.ConditionReasonPending
	msg := fmt.Sprintf("MIG config %q is being applied", config)
	switch state {
	case record.StateSuccess:
		status, reason = corev1.ConditionTrue, record.ConditionReasonSuccess
		msg = fmt.Sprintf("MIG config %q is applied", config)
		if rec != nil && len(rec.GPUsChanged) == 0 {
			msg += "; it already was, nothing changed"
		}
	case record.StateRebooting:
		reason = record.ConditionReasonRebooting
		msg = fmt.Sprintf("MIG config %q waits for a reboot of the node to finish", config)
	case "":
		status, reason = corev1.ConditionUnknown, record.ConditionReasonNotRequested
		msg = "no MIG config is requested: the desired config label was removed"
	case record.StateFailed:
		reason = record.ConditionReasonFailed
		msg = fmt.Sprintf("MIG config %q failed", config)
		if rec != nil && rec.Reason != "" {
			msg += ": " + rec.Reason
		}
	}
	if rec != nil && rec.RequestedBy != "" {
		msg += " (" + requestedBy(*rec) + ")"
	}
	c := corev1.NodeCondition{Type: record.ConditionConfigReady, Status: status, Reason: reason,
		Message: record.Truncate(msg, record.MaxConditionMessage), LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}
	if prev != nil && prev.Status == status {
		c.LastTransitionTime = prev.LastTransitionTime
	}
	return c
}

// patchState writes meta (the state label; with a record, its
// annotations too) and the condition MIGConfigReady of state (rec: the
// record that ends the change, nil while it runs) in one strategic merge
// patch of the Node's status subresource, which takes the Node's labels
// and annotations as well (the API server's node status strategy resets
// only the spec: pkg/registry/core/node/strategy.go,
// nodeStatusStrategy.PrepareForUpdate). Whoever sees the label sees the
// condition, and it costs one request. node is the Node as last read (its
// condition, the desired config); nil reads the watch's copy.
//
// The condition is a view of the state, never a reason to stop: where the
// status write is refused (a ClusterRole without nodes/status, a policy
// that refuses it: a permanent answer but NotFound), the metadata goes to
// the Node alone and the condition's failure is logged.
func (k *Cluster) patchState(ctx context.Context, node *corev1.Node, meta map[string]any, state string, rec *record.ChangeRecord) error {
	if node == nil {
		var err error
		if node, err = k.CachedNode(ctx); err != nil {
			return err
		}
	}
	config := k.desired(node).Config
	if rec != nil {
		config = rec.Config
	}
	var prev *corev1.NodeCondition
	for i, c := range node.Status.Conditions {
		if c.Type == record.ConditionConfigReady {
			prev = &node.Status.Conditions[i]
		}
	}
	c := Condition(state, config, rec, prev, k.Clock.Now())
	// Strategic: the conditions merge by type, the kubelet's stay as they are.
	patch, err := json.Marshal(map[string]any{"metadata": meta, "status": map[string]any{"conditions": []corev1.NodeCondition{c}}})
	if err != nil {
		return err
	}
	_, err = k.Client.CoreV1().Nodes().Patch(ctx, k.Node, types.StrategicMergePatchType, patch,
		metav1.PatchOptions{FieldManager: "mig-agent"}, "status")
	if err == nil || !apierr.Permanent(err) || apierrors.IsNotFound(err) {
		if err != nil {
			return fmt.Errorf("patching node %s: %w", k.Node, err)
		}
		return nil
	}
	k.log().Warn("writing the node condition failed; the Node is patched without it",
		"condition", record.ConditionConfigReady, "state", state, "err", err)
	return k.patchNode(ctx, map[string]any{"metadata": meta})
}
