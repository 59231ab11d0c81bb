package drain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/readonce"
)

// listDevicePlugins lists the pods of node restarted after a change (the
// device plugin, GPU Feature Discovery, the validator and the DRA kubelet
// plugin as sels finds them, and what --plugin-selector selects) that are
// not terminating, as "namespace/name/uid". Take the list before the GPUs
// change: those pods enumerated the old geometry. (Comparing creation
// times with the time of the change instead would trust the node's clock
// to agree with the API server's.) A pod a selector selects that is no
// operand (Selectors.Impostors: not a DaemonSet's, or outside the operand
// namespaces) is left out and logged as a warning that names it.
func listDevicePlugins(ctx context.Context, client kclient.Interface, log *slog.Logger, node string, sels *Selectors) ([]string, error) {
	if node == "" {
		return nil, fmt.Errorf("list device plugins: %w", errNoNode)
	}
	pods, err := NodePods(ctx, client, node)
	if err != nil {
		return nil, err
	}
	if bad := sels.Impostors(pods); len(bad) > 0 {
		log.Warn("pods selected as operands are not operands: ignored (not restarted)", "pods", bad)
	}
	var out []string
	for i := range pods {
		p := &pods[i]
		if sels.Restarted(p) && p.DeletionTimestamp == nil {
			out = append(out, p.Namespace+"/"+p.Name+"/"+string(p.UID))
		}
	}
	sort.Strings(out)
	return out, nil
}

// NodePods lists the pods of node (spec.nodeName), of every namespace.
// Within a readonce memo (readonce.With: the agent's look at its node
// before a change) the list is read once and shared by the checks that
// want it: callers must not modify it.
func NodePods(ctx context.Context, client kclient.Interface, node string) ([]corev1.Pod, error) {
	return readonce.Do(ctx, "pods/"+node, func(ctx context.Context) ([]corev1.Pod, error) {
		list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
		})
		if err != nil {
			return nil, fmt.Errorf("list the pods of node %s: %w", node, err)
		}
		return list.Items, nil
	})
}

// ErrOperandBudget: a PodDisruptionBudget refused the eviction of an
// operand the agent restarts after a change (the API server's 429 with the
// cause DisruptionBudget).
var ErrOperandBudget = errors.New("a PodDisruptionBudget refuses the restart of an operand")

// budgetRefused is the message of err's DisruptionBudget cause where err is
// the Eviction API's 429 for a PodDisruptionBudget ("" otherwise: a 429
// without that cause is the API server's throttling, retried as an outage).
func budgetRefused(err error) string {
	if !apierrors.IsTooManyRequests(err) {
		return ""
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) || st.Status().Details == nil {
		return ""
	}
	for _, c := range st.Status().Details.Causes {
		if c.Type == policyv1.DisruptionBudgetCause {
			return cmp.Or(c.Message, st.Status().Message)
		}
	}
	return ""
}

// restartDevicePlugins evicts the pods of listDevicePlugins' list that still
// exist with the same UID, so that their DaemonSets start new ones that read
// the new geometry. A pod that is gone, or was replaced by a new one (a
// paused operand brought back), already reads it and is skipped. Eviction
// (not deletion) keeps the agent's permissions to what it already needs for
// workloads. It returns the pods it evicted ("namespace/name") and does not
// wait for their successors: the caller waits for the node's allocatable.
func restartDevicePlugins(ctx context.Context, client kclient.Interface, log *slog.Logger, pods []string) ([]string, error) {
	var out []string
	for _, ref := range pods {
		parts := strings.SplitN(ref, "/", 3)
		if len(parts) != 3 {
			return out, fmt.Errorf("restart device plugins: bad pod reference %q", ref)
		}
		ns, name, uid := parts[0], parts[1], parts[2]
		ev := &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Name: name, Namespace: ns},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(uid)},
		}
		err := client.PolicyV1().Evictions(ns).Evict(ctx, ev)
		switch {
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			continue // gone, or replaced by a pod that reads the new geometry
		case budgetRefused(err) != "":
			// Not an outage to ride out: the budget's owner said no. The
			// error does not wrap the 429, so no retry loop takes it for
			// one; the change fails now and its retry waits its backoff.
			return out, fmt.Errorf("%w: %s/%s: %s", ErrOperandBudget, ns, name, budgetRefused(err))
		case err != nil:
			return out, fmt.Errorf("evict device plugin pod %s/%s: %w", ns, name, err)
		}
		out = append(out, ns+"/"+name)
	}
	if len(out) > 0 {
		log.Info("device plugin pods restarted to see the new MIG devices", "pods", out)
	}
	return out, nil
}
