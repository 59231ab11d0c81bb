package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// The taints a node joins with in the e2e startup scenarios: the startup
// taint, as a Karpenter NodePool's startupTaints writes it, and a taint of
// someone else's that must stay.
var (
	startupTaint = corev1.Taint{Key: "migagent.io/geometry-pending", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	foreignTaint = corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
)

// joinTainted creates node as an autoscaled node joins: with labels, the
// startup taint and another taint. It returns the Node's resourceVersion.
func joinTainted(t *testing.T, c kubernetes.Interface, node string, labels map[string]string) string {
	t.Helper()
	n := kubetest.CreateNode(t, node, labels)
	n.Spec.Taints = []corev1.Taint{foreignTaint, startupTaint}
	n, err := c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.ResourceVersion
}

// watchStartup records every version of node after rv, as (state label,
// startup taint still there), until the test ends.
func watchStartup(t *testing.T, c kubernetes.Interface, node, rv string) func() []string {
	t.Helper()
	w, err := c.CoreV1().Nodes().Watch(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String(), ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	seen := make(chan []string, 1)
	seen <- nil
	go func() {
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			tainted := slices.Contains(n.Spec.Taints, startupTaint)
			s := <-seen
			seen <- append(s, n.Labels[record.LabelState]+map[bool]string{true: "+tainted", false: "+untainted"}[tainted])
		}
	}()
	return func() []string { s := <-seen; seen <- s; return slices.Clone(s) }
}

func hasStartupTaint(t *testing.T, c kubernetes.Interface, node string, taint corev1.Taint) bool {
	return slices.Contains(GetNode(t, c, node).Spec.Taints, taint)
}

// A node that joins with a startup taint and a default config loses that
// taint only once the default config is applied with success: every
// version of the Node without it says success. The other taint stays.
func TestStartupTaintLiftedAfterSuccess(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	rv := joinTainted(t, c, node, nil)
	versions := watchStartup(t, c, node, rv)
	a := flStart(t, &Opts{Node: node, Sim: "h200x2", Extra: []string{"--default-config", "all-1g.18gb",
		"--startup-taint", "migagent.io/geometry-pending=true:NoSchedule"}})
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	if len(rec.GPUsChanged) != 2 {
		t.Fatalf("the default config changed GPUs %v", rec.GPUsChanged)
	}
	WaitFor(t, 20*time.Second, "the startup taint removed", func() bool { return !hasStartupTaint(t, c, node, startupTaint) })
	if !hasStartupTaint(t, c, node, foreignTaint) {
		t.Fatalf("another taint was removed: %v", GetNode(t, c, node).Spec.Taints)
	}
	WaitFor(t, 10*time.Second, "the watch to see the untainted Node", func() bool {
		return slices.ContainsFunc(versions(), func(v string) bool { return strings.HasSuffix(v, "+untainted") })
	})
	seen := versions()
	first := slices.IndexFunc(seen, func(v string) bool { return strings.HasSuffix(v, "+untainted") })
	if seen[first] != record.StateSuccess+"+untainted" || !slices.Contains(seen[:first], record.StatePending+"+tainted") {
		t.Fatalf("the Node's versions (state+taint): %v; the taint must stay through pending and go only with success", seen)
	}
	WaitFor(t, 10*time.Second, "the "+record.ReasonStartupTaintsRemoved+" Event", func() bool {
		return len(flEvents(t, c, node, record.ReasonStartupTaintsRemoved)) > 0
	})
	if len(flEvents(t, c, node, record.ReasonStartupTaintsRemoved)) != 1 {
		t.Errorf("no %s Event", record.ReasonStartupTaintsRemoved)
	}
	if !strings.Contains(a.Log(), "startup taints removed") {
		t.Errorf("the log does not say the startup taints were removed")
	}
}

// A node whose config fails keeps its startup taint, through the retries
// and the passes that follow; the config that then succeeds lifts it.
func TestStartupTaintKeptOnFailed(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	joinTainted(t, c, node, map[string]string{record.LabelConfig: "no-such-config"})
	flStart(t, &Opts{Node: node, Sim: "h200x2", Extra: []string{"--default-config", "all-1g.18gb",
		"--startup-taint", "migagent.io/geometry-pending=true:NoSchedule"}})
	WaitState(t, c, node, record.StateFailed, "no-such-config", 60*time.Second)
	time.Sleep(3 * time.Second) // drift ticks (1 s) and passes after the failure
	if !hasStartupTaint(t, c, node, startupTaint) || !hasStartupTaint(t, c, node, foreignTaint) {
		t.Fatalf("after failed: taints %v", GetNode(t, c, node).Spec.Taints)
	}
	SetLabel(t, c, node, record.LabelConfig, "all-balanced", "pool-admin")
	WaitState(t, c, node, record.StateSuccess, "all-balanced", 60*time.Second)
	WaitFor(t, 20*time.Second, "the startup taint removed", func() bool { return !hasStartupTaint(t, c, node, startupTaint) })
	if !hasStartupTaint(t, c, node, foreignTaint) {
		t.Fatalf("another taint was removed: %v", GetNode(t, c, node).Spec.Taints)
	}
}
