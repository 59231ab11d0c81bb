package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/internal/kevent"
	"github.com/migagent/mig-agent/record"
)

// Preflight proves, before anything is evicted or a GPU touched, that the
// agent may write what a change must write: the state label and the record
// annotations (a patch of the Node), the taint when it taints (an update of
// the Node, as drain.addTaint makes it) and Events. Each write is sent for
// real, with dryRun=All: the API server authenticates, authorizes and runs
// admission (webhooks and admission policies included) as for the real
// write, and persists nothing. Before them, the Node's annotations must
// leave room for a record at its bounds (recordBudget): a dry run of a
// small record proves nothing of the record the change ends with. A change
// it cannot record is not made.
// Called by the reconcile pass; an error names the write refused.
//
// The writes are independent and sent at once; the Node they start from is
// the watch's (CachedNode): the patch and the Event carry no
// resourceVersion, and the taint's update reads the Node afresh only when
// the API server finds the watch's copy stale.
func (k *Cluster) Preflight(ctx context.Context, taint bool) error {
	node, err := k.CachedNode(ctx)
	if err != nil {
		return fmt.Errorf("reading node %s: %w", k.Node, err)
	}
	if err := recordBudget(node); err != nil {
		return err
	}
	checks := []func(context.Context, *corev1.Node) error{k.preflightRecord, k.preflightEvent}
	if taint {
		checks = append(checks, k.preflightTaint)
	}
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, check := range checks {
		wg.Go(func() { errs[i] = check(ctx, node) })
	}
	wg.Wait()
	// The first refusal in the order above is the one named.
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// dryRun is the option of every preflight write: sent, never persisted.
var dryRun = []string{metav1.DryRunAll}

// preflightRecord: the state label and the change record (a patch).
func (k *Cluster) preflightRecord(ctx context.Context, node *corev1.Node) error {
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
	_, err = k.Client.CoreV1().Nodes().Patch(ctx, k.Node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "mig-agent", DryRun: dryRun})
	if err != nil {
		return fmt.Errorf("writing the state label and change record on node %s: %w", k.Node, err)
	}
	return nil
}

// preflightTaint: the taint, an update of the Node as drain.addTaint makes
// it (the patch drain.addTaintFrom sends first is proven by the record's).
// It starts from node, the watch's copy; an update needs the current
// resourceVersion, so a copy the API server finds stale (a conflict) is read
// afresh once.
func (k *Cluster) preflightTaint(ctx context.Context, node *corev1.Node) error {
	nodes := k.Client.CoreV1().Nodes()
	err := k.dryRunTaint(ctx, node)
	if apierrors.IsConflict(err) {
		n, gerr := nodes.Get(ctx, k.Node, metav1.GetOptions{})
		if gerr != nil {
			return fmt.Errorf("reading node %s: %w", k.Node, gerr)
		}
		err = k.dryRunTaint(ctx, n)
	}
	if err != nil {
		return fmt.Errorf("tainting node %s %s: %w", k.Node, drain.TaintKey, err)
	}
	return nil
}

// dryRunTaint sends the update that adds the taint to n, with dryRun=All.
func (k *Cluster) dryRunTaint(ctx context.Context, n *corev1.Node) error {
	n = n.DeepCopy()
	// A taint already there (a change resumed after a reboot keeps it)
	// is not added twice: the update alone still proves the right.
	if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
		return t.Key == drain.TaintKey && t.Effect == drain.TaintEffect
	}) {
		n.Spec.Taints = append(n.Spec.Taints, drain.Taint())
	}
	_, err := k.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{FieldManager: "mig-agent", DryRun: dryRun})
	return err
}

// preflightEvent: an Event about the Node.
func (k *Cluster) preflightEvent(ctx context.Context, node *corev1.Node) error {
	ref := kevent.NodeRef(k.Node, string(node.UID))
	if err := k.poster().Post(ctx, k.Clock.Now(), ref, corev1.EventTypeNormal, record.ReasonStarted, "preflight", true); err != nil {
		return fmt.Errorf("posting Events: %w", err)
	}
	return nil
}

// ErrAnnotationBudget: the Node's annotations leave no room for a change
// record at its bounds, so the change is not made.
var ErrAnnotationBudget = errors.New("no room for the change record in the Node's annotations")

// recordBudget checks that a record at its bounds (record.RecordBudget:
// the last change, the history and the history kept aside at their
// bounds) lands beside the other writers' annotations of node, within
// Kubernetes' limit on them all (record.AnnotationBudget). The other
// annotations are named, largest first, so that whoever reads the Event
// knows what to shrink.
func recordBudget(node *corev1.Node) error {
	need, others, fits := record.RecordBudget(node.Annotations)
	if fits {
		return nil
	}
	keys := make([]string, 0, len(node.Annotations))
	for key := range node.Annotations {
		if !slices.Contains(record.RecordAnnotations, key) {
			keys = append(keys, key)
		}
	}
	size := func(key string) int { return len(key) + len(node.Annotations[key]) }
	slices.SortFunc(keys, func(a, b string) int {
		if c := size(b) - size(a); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	var largest []string
	for _, key := range keys[:min(3, len(keys))] {
		largest = append(largest, fmt.Sprintf("%s (%d bytes)", key, size(key)))
	}
	return fmt.Errorf("%w: the annotations of node %s that are not the agent's records take %d bytes (largest: %s); "+
		"with a change record, its history and what it keeps aside at their bounds they could take %d bytes, "+
		"over Kubernetes' limit of %d bytes on all of a Node's annotations together; "+
		"free at least %d bytes of them and the change is retried",
		ErrAnnotationBudget, node.Name, others, strings.Join(largest, ", "), need, record.AnnotationBudget, need-record.AnnotationBudget)
}
