package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/lease/nodelease"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// How a change that does not finish ends, with the real binary: its label
// removed, a newer label, its node Lease taken by another agent. Each
// starts as slotPair's node A does: --max-concurrent 1, A holds the slot,
// has tainted its node and evicts a pod that takes its time.

// changeEndStart labels A and waits until its change is draining.
func changeEndStart(t *testing.T, podNS, nodeA string) {
	t.Helper()
	c := kubetest.Client(t)
	SelectConfig(t, c, nodeA, "all-1g.18gb")
	waitEvicting(t, podNS, nodeA)
	WaitFor(t, 10*time.Second, "A's taint", func() bool { return hasTaint(GetNode(t, c, nodeA).Spec.Taints) })
}

// abandonedRecord is the newest record of config whose reason starts with
// "abandoned".
func abandonedRecord(recs []record.ChangeRecord, config string) *record.ChangeRecord {
	for i := range recs {
		if recs[i].Config == config && strings.HasPrefix(recs[i].Reason, "abandoned") {
			return &recs[i]
		}
	}
	return nil
}

// The label removed mid-change: the change stops, its taint is lifted, a
// record says it was abandoned (the pod it evicted stays in the trail), a
// Normal Event MigConfigAbandoned says so, and the state label is removed:
// nothing is asked, so neither pending nor failed is true. No GPU changed.
func TestLabelRemovedMidChange(t *testing.T) {
	c := kubetest.Client(t)
	_, podNS, start := slotPair(t)
	nodeA := kubetest.NewName(t, "a")
	_, oa := start(nodeA, true)
	changeEndStart(t, podNS, nodeA)
	SelectConfig(t, c, nodeA, "") // removes the label
	var n *corev1.Node
	WaitFor(t, 20*time.Second, "the abandoned change's record", func() bool {
		n = GetNode(t, c, nodeA)
		return abandonedRecord(History(t, n), "all-1g.18gb") != nil
	})
	WaitFor(t, 10*time.Second, "the state label removed and the taint lifted", func() bool {
		n = GetNode(t, c, nodeA)
		_, has := n.Labels[record.LabelState]
		return !has && !hasTaint(n.Spec.Taints)
	})
	rec := abandonedRecord(History(t, n), "all-1g.18gb")
	if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "label was removed") || len(rec.GPUsChanged) != 0 || rec.DisruptedAt == nil {
		t.Errorf("abandoned record %+v", rec)
	}
	WaitFor(t, 10*time.Second, "a MigConfigAbandoned Event", func() bool {
		evs := nodeEvents(t, c, nodeA, record.ReasonAbandoned)
		return len(evs) == 1 && evs[0].Type == corev1.EventTypeNormal
	})
	for _, g := range disProfiles(t, oa.Sim, oa.SimState) {
		if g.MigMode.Current || len(g.Instances) > 0 {
			t.Errorf("GPU %d changed by an abandoned request: %+v", g.Index, g)
		}
	}
	// Stays so: nothing sets a state again while no label asks.
	time.Sleep(2 * time.Second)
	if st, has := GetNode(t, c, nodeA).Labels[record.LabelState]; has {
		t.Errorf("state label %q came back with no label set", st)
	}
}

// A newer label supersedes A's change while B waits in the slot's queue:
// A's change is ended (taint lifted, record written) before the slot goes
// to B, so A's record finishes no later than B's disruption begins, and at
// most one node was ever disrupted by the records.
func TestSupersededChangeEndsBeforeHandOff(t *testing.T) {
	c := kubetest.Client(t)
	ns, podNS, start := slotPair(t)
	nodeA, nodeB := kubetest.NewName(t, "a"), kubetest.NewName(t, "b")
	a, _ := start(nodeA, true)
	start(nodeB, false)
	changeEndStart(t, podNS, nodeA)
	SelectConfig(t, c, nodeB, "all-1g.18gb")
	waitQueued(t, ns, nodeB)
	SelectConfig(t, c, nodeA, "all-disabled") // what the GPUs hold: no disruption, no slot
	recB := WaitState(t, c, nodeB, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	WaitState(t, c, nodeA, record.StateSuccess, "all-disabled", 30*time.Second)
	histA := History(t, GetNode(t, c, nodeA))
	recA := abandonedRecord(histA, "all-1g.18gb")
	if recA == nil || recA.DisruptedAt == nil || recB.DisruptedAt == nil {
		t.Fatalf("records: A %+v, B %+v\nA's log:\n%s", histA, recB, a.Log())
	}
	if recA.FinishedAt.After(*recB.DisruptedAt) {
		t.Errorf("A's abandoned change finished at %s, %s after B began its disruption at %s: two nodes disrupted under --max-concurrent 1",
			recA.FinishedAt.Format(time.RFC3339Nano), recA.FinishedAt.Sub(*recB.DisruptedAt), recB.DisruptedAt.Format(time.RFC3339Nano))
	}
	t.Logf("A's abandoned change finished %s before B began its disruption", recB.DisruptedAt.Sub(recA.FinishedAt))
	if most := record.MaxDisrupted(append(histA, History(t, GetNode(t, c, nodeB))...)); most != 1 {
		t.Errorf("%d nodes disrupted at once with --max-concurrent 1", most)
	}
}

// The node Lease written by another identity while A drains (a second
// install, or someone with the agent's token): A stops before any GPU
// step and exits 1, and it says so: a failed record naming the loss and a
// Warning Event MigNodeLeaseLost. The node is the new holder's: the taint
// and the state label stay for its change, which takes the taint as its
// own. No GPU changed.
func TestNodeLeaseTakenMidDrain(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	ns, podNS, start := slotPair(t)
	nodeA := kubetest.NewName(t, "a")
	a, oa := start(nodeA, true)
	changeEndStart(t, podNS, nodeA)
	leases := c.CoordinationV1().Leases(ns)
	l, err := leases.Get(ctx, nodelease.NodeLeaseName(nodeA), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.NewMicroTime(time.Now())
	l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = ptr.To("state-dir-other"), &now, &now
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, exited := a.Wait(20 * time.Second); !exited || code != 1 {
		t.Fatalf("A, its node Lease taken: exited %v, code %d\n%s", exited, code, a.Log())
	}
	n := GetNode(t, c, nodeA)
	rec := LastChange(t, n)
	if rec.Config != "all-1g.18gb" || rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "no longer holds its node") ||
		len(rec.GPUsChanged) != 0 || rec.DisruptedAt == nil {
		t.Errorf("last record %+v, want the failed change naming the lost node Lease\n%s", rec, a.Log())
	}
	evs := nodeEvents(t, c, nodeA, record.ReasonNodeLost)
	if len(evs) != 1 || evs[0].Type != corev1.EventTypeWarning {
		t.Errorf("MigNodeLeaseLost Events %+v, want one Warning", evs)
	}
	if !hasTaint(n.Spec.Taints) || n.Labels[record.LabelState] != record.StatePending {
		t.Errorf("taints %v, state %q: want the taint and the pending state left to the new holder", n.Spec.Taints, n.Labels[record.LabelState])
	}
	for _, g := range disProfiles(t, oa.Sim, oa.SimState) {
		if g.MigMode.Current || len(g.Instances) > 0 {
			t.Errorf("GPU %d changed after the node Lease was lost: %+v", g.Index, g)
		}
	}
}
