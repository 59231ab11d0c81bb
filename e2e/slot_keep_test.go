package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/internal/kubetest"
	"github.com/migagent/mig-agent/lease"
	"github.com/migagent/mig-agent/record"
)

// A stopping agent keeps what it holds, with the real binary: under
// --max-concurrent 1, A takes the slot, taints its node and evicts a pod
// that takes its time; B, labelled meanwhile, queues on A's slot. A is then
// stopped with SIGTERM (a rolling update of the DaemonSet): it parks its
// change (node tainted, pending) and keeps the slot, instead of handing it
// to B. B stays whole for three lease durations while A is away. A,
// restarted, takes its own slot back, finishes, and hands the slot to B.
// Over both nodes' records, at most one node was ever disrupted.
func TestSlotHolderStoppedMidChange(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	ns, podNS, start := slotPair(t)
	nodeA, nodeB := kubetest.NewName(t, "a"), kubetest.NewName(t, "b")
	a, oa := start(nodeA, true)
	start(nodeB, false)
	SelectConfig(t, c, nodeA, "all-1g.18gb")
	WaitFor(t, 30*time.Second, "A evicting its pod", func() bool {
		p, err := c.CoreV1().Pods(podNS).Get(ctx, "train-"+nodeA, metav1.GetOptions{})
		return err == nil && p.DeletionTimestamp != nil
	})
	SelectConfig(t, c, nodeB, "all-1g.18gb")
	WaitFor(t, 30*time.Second, "B queued on A's slot", func() bool {
		l, err := c.CoordinationV1().Leases(ns).Get(ctx, lease.SlotLeaseName(0), metav1.GetOptions{})
		if err != nil {
			return false
		}
		for k, v := range l.Annotations {
			if strings.HasPrefix(k, lease.QueueKeyPrefix) && strings.HasSuffix(v, " "+nodeB) {
				return true
			}
		}
		return false
	})
	if code := a.Stop(); code != 0 {
		t.Fatalf("A exited %d on SIGTERM\n%s", code, a.Log())
	}
	if n := GetNode(t, c, nodeA); !hasTaint(n.Spec.Taints) || n.Labels[record.LabelState] != record.StatePending {
		t.Fatalf("A, stopped mid-change, did not park it: state %q, taints %v", n.Labels[record.LabelState], n.Spec.Taints)
	}
	time.Sleep(9 * time.Second) // three lease durations
	if n := GetNode(t, c, nodeB); hasTaint(n.Spec.Taints) || n.Labels[record.LabelState] == record.StateSuccess {
		t.Fatalf("B was disrupted while A, stopped, was mid-change: state %q, taints %v\nA's log:\n%s", n.Labels[record.LabelState], n.Spec.Taints, a.Log())
	}
	if l, err := c.CoordinationV1().Leases(ns).Get(ctx, lease.SlotLeaseName(0), metav1.GetOptions{}); err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != nodeA {
		t.Fatalf("slot %v (%v), want still A's", l, err)
	}
	_ = c.CoreV1().Pods(podNS).Delete(ctx, "train-"+nodeA, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	StartAgent(t, oa)
	WaitState(t, c, nodeA, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	WaitState(t, c, nodeB, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	var recs []record.ChangeRecord
	for _, n := range []string{nodeA, nodeB} {
		recs = append(recs, History(t, GetNode(t, c, n))...)
	}
	if most := record.MaxDisrupted(recs); most != 1 {
		t.Fatalf("%d nodes disrupted at once with --max-concurrent 1: %+v", most, recs)
	}
}
