package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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

// setCondition writes MIGConfigReady for state (rec: the record that ends
// the change, nil while it runs) to the Node's status, retried through an
// API server outage; a failure is logged.
func (k *Cluster) setCondition(ctx context.Context, state string, rec *record.ChangeRecord) {
	err := k.retry(ctx, func() error {
		// The watch's copy: the patch carries no resourceVersion.
		node, err := k.CachedNode(ctx)
		if err != nil {
			return err
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
		// A strategic merge patch: the conditions merge by type, the
		// kubelet's stay as they are.
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{c}}})
		if err != nil {
			return err
		}
		_, err = k.Client.CoreV1().Nodes().Patch(ctx, k.Node, types.StrategicMergePatchType, patch,
			metav1.PatchOptions{FieldManager: "mig-agent"}, "status")
		return err
	})
	if err != nil {
		k.log().Warn("writing the node condition failed", "condition", record.ConditionConfigReady, "state", state, "err", err)
	}
}
