package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/record"
)

// Preflight proves, before anything is evicted or a GPU touched, that the
// agent may write what a change must write: the state label and the record
// annotations (a patch of the Node), the taint when it taints (an update of
// the Node, as drain.AddTaint makes it) and Events. Each write is sent for
// real, with dryRun=All: the API server authenticates, authorizes and runs
// admission (webhooks and admission policies included) as for the real
// write, and persists nothing. A change it cannot record is not made.
// Called by the reconcile pass; an error names the write refused.
func (k *Cluster) Preflight(ctx context.Context, taint bool) error {
	node, err := k.getNode(ctx)
	if err != nil {
		return fmt.Errorf("reading node %s: %w", k.Node, err)
	}
	dry := []string{metav1.DryRunAll}
	rec, _ := json.Marshal(record.ChangeRecord{Result: record.StatePending, GPUsChanged: []int{}, GPUsUntouched: []int{}, EvictedPods: []string{}})
	hist := node.Annotations[record.AnnotationHistory]
	if hist == "" {
		hist = "[" + string(rec) + "]"
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels":      map[string]any{record.LabelState: record.StatePending},
		"annotations": map[string]any{record.AnnotationLastChange: string(rec), record.AnnotationHistory: hist},
	}})
	if err != nil {
		return err
	}
	nodes := k.Client.CoreV1().Nodes()
	if _, err := nodes.Patch(ctx, k.Node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "mig-agent", DryRun: dry}); err != nil {
		return fmt.Errorf("writing the state label and change record on node %s: %w", k.Node, err)
	}
	if taint {
		n, err := nodes.Get(ctx, k.Node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading node %s: %w", k.Node, err)
		}
		// A taint already there (a change resumed after a reboot keeps it)
		// is not added twice: the update alone still proves the right.
		if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == drain.TaintKey && t.Effect == drain.TaintEffect
		}) {
			n.Spec.Taints = append(n.Spec.Taints, drain.Taint())
		}
		if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{FieldManager: "mig-agent", DryRun: dry}); err != nil {
			return fmt.Errorf("tainting node %s %s: %w", k.Node, drain.TaintKey, err)
		}
	}
	now := metav1.NewTime(k.Clock.Now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: k.Node + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: k.Node, UID: node.UID},
		Reason:         record.ReasonStarted, Message: "preflight", Type: corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: k.Component, Host: k.Node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "migagent.io/mig-agent", ReportingInstance: k.Component + "-" + k.Node,
	}
	if _, err := k.Client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{DryRun: dry}); err != nil {
		return fmt.Errorf("posting Events: %w", err)
	}
	return nil
}
