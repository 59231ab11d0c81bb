package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/lease"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
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
	waitEvicting(t, podNS, nodeA)
	SelectConfig(t, c, nodeB, "all-1g.18gb")
	waitQueued(t, ns, nodeB)
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

// An operator deletes the slot Leases mid-change (`kubectl delete lease -l
// migagent.io/rollout-slot=true`, to unstick a rollout), with the real
// binary: A holds the slot and evicts a pod that takes its time, B waits in
// A's queue. The deleted slot is made again for A, not taken by B: B stays
// whole for three lease durations, and the slot is A's. Then A finishes
// and B goes; at most one node was ever disrupted. The same after the
// holder record is cleared by another writer: A stops before its next step
// (its slot lost), and B waits until A's node is whole.
func TestSlotDeletedMidChange(t *testing.T) {
	for _, how := range []string{"deleted", "cleared"} {
		t.Run(how, func(t *testing.T) {
			c := kubetest.Client(t)
			ctx := context.Background()
			ns, podNS, start := slotPair(t)
			nodeA, nodeB := kubetest.NewName(t, "a"), kubetest.NewName(t, "b")
			a, _ := start(nodeA, true)
			start(nodeB, false)
			SelectConfig(t, c, nodeA, "all-1g.18gb")
			waitEvicting(t, podNS, nodeA)
			SelectConfig(t, c, nodeB, "all-1g.18gb")
			waitQueued(t, ns, nodeB)
			leases := c.CoordinationV1().Leases(ns)
			if how == "deleted" {
				if err := leases.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: lease.LabelRolloutSlot + "=true"}); err != nil {
					t.Fatal(err)
				}
			} else {
				patch := []byte(`{"spec":{"holderIdentity":""}}`)
				if _, err := leases.Patch(ctx, lease.SlotLeaseName(0), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			deadline := time.Now().Add(9 * time.Second) // three lease durations
			for time.Now().Before(deadline) {
				if n := GetNode(t, c, nodeB); hasTaint(n.Spec.Taints) && hasTaint(GetNode(t, c, nodeA).Spec.Taints) {
					t.Fatalf("B disrupted while A was still mid-change (slot %s)\nA's log:\n%s", how, a.Log())
				}
				time.Sleep(100 * time.Millisecond)
			}
			if how == "deleted" {
				if l, err := leases.Get(ctx, lease.SlotLeaseName(0), metav1.GetOptions{}); err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != nodeA {
					t.Fatalf("slot %v (%v), want made again for A", l, err)
				}
			}
			_ = c.CoreV1().Pods(podNS).Delete(ctx, "train-"+nodeA, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			WaitState(t, c, nodeA, record.StateSuccess, "all-1g.18gb", 90*time.Second)
			WaitState(t, c, nodeB, record.StateSuccess, "all-1g.18gb", 90*time.Second)
			var recs []record.ChangeRecord
			for _, n := range []string{nodeA, nodeB} {
				recs = append(recs, History(t, GetNode(t, c, n))...)
			}
			if most := record.MaxDisrupted(recs); most != 1 {
				t.Fatalf("%d nodes disrupted at once with --max-concurrent 1: %+v", most, recs)
			}
		})
	}
}

// waitQueued waits until node stands in the queue of slot 0.
func waitQueued(t *testing.T, ns, node string) {
	t.Helper()
	c := kubetest.Client(t)
	WaitFor(t, 30*time.Second, node+" queued on slot 0", func() bool {
		l, err := c.CoordinationV1().Leases(ns).Get(context.Background(), lease.SlotLeaseName(0), metav1.GetOptions{})
		if err != nil {
			return false
		}
		for k, v := range l.Annotations {
			if strings.HasPrefix(k, lease.QueueKeyPrefix) && strings.HasSuffix(v, " "+node) {
				return true
			}
		}
		return false
	})
}
