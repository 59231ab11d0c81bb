package nodelease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/journal"
)

// One agent per node under attack (findings 4, 5).

func newNodeLease(c *fake.Clientset, clk *clocktesting.FakeClock, id string) *NodeLease {
	return &NodeLease{Client: clientset.Wrap(c), Namespace: "ns", Node: "n", Identity: id, Holder: "agent " + id, Duration: 30 * time.Second, Clock: clk, Log: testsupport.Discard()}
}

// Finding 4: the node Lease deleted mid-change is taken again within
// moments (the watch, no renewal due), so a second agent starting then is
// refused; a Lease taken by another identity ends Keep at once and
// Confirm fails, before the next GPU step.
func TestNodeLeaseDeletedOrStolen(t *testing.T) {
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(100000, 0))
	a := newNodeLease(c, clk, "a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := a.Take(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Keep(ctx) }()
	leases := c.CoordinationV1().Leases("ns")
	name := NodeLeaseName("n")
	time.Sleep(100 * time.Millisecond) // the watch starts
	if err := leases.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	back := func() bool {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		return err == nil && ptr.Deref(l.Spec.HolderIdentity, "") == "a"
	}
	for deadline := time.Now().Add(5 * time.Second); !back(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a deleted node Lease was not taken again (no fake time passed: the watch must notice)")
		}
	}
	if err := newNodeLease(c, clk, "b").Take(ctx); !errors.Is(err, journal.ErrAnotherAgent) {
		t.Fatalf("a second agent after the deletion: %v, want refused", err)
	}
	if err := a.Confirm(ctx); err != nil {
		t.Fatalf("Confirm while held: %v", err)
	}
	// Stolen: another identity writes it.
	l, _ := leases.Get(ctx, name, metav1.GetOptions{})
	l.Spec.HolderIdentity = ptr.To("b")
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, journal.ErrAnotherAgent) {
			t.Fatalf("Keep: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a stolen node Lease went unnoticed (no fake time passed: the watch must notice)")
	}
	if err := a.Confirm(ctx); !errors.Is(err, journal.ErrAnotherAgent) {
		t.Fatalf("Confirm after the Lease was taken: %v", err)
	}
}

// Confirm reads the Lease before a GPU step: taken by another (noticed by
// nothing else yet) is refused; deleted is taken again.
func TestNodeLeaseConfirm(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(100000, 0))
	a := newNodeLease(c, clk, "a")
	if err := a.Take(ctx); err != nil {
		t.Fatal(err)
	}
	leases := c.CoordinationV1().Leases("ns")
	name := NodeLeaseName("n")
	if err := leases.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Confirm(ctx); err != nil {
		t.Fatalf("a deleted Lease: %v, want taken again", err)
	}
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != "a" {
		t.Fatalf("after Confirm: %v %v", l, err)
	}
	l.Spec.HolderIdentity = ptr.To("b")
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Confirm(ctx); !errors.Is(err, journal.ErrAnotherAgent) {
		t.Fatalf("Confirm of a Lease another holds: %v", err)
	}
	// Not taken at all (API server away at start): nothing confirmed.
	awayClient := fake.NewClientset()
	away := newNodeLease(awayClient, clk, "c")
	awayClient.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	if err := away.Take(ctx); err != nil {
		t.Fatal(err)
	}
	if err := away.Confirm(ctx); err == nil {
		t.Fatal("an agent that never held its node Lease confirmed it")
	}
}

// Finding 5: a Lease written by another identity with renewTime in 2099
// does not lock the node's agent out: Take does not refuse (and Confirm
// does: nothing is changed meanwhile); after the Lease stayed unchanged
// for its duration, the agent takes it.
func TestNodeLeaseImplausibleRenewTime(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(100000, 0))
	far := metav1.NewMicroTime(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC))
	if _, err := c.CoordinationV1().Leases("ns").Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: NodeLeaseName("n"), Namespace: "ns"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("mallory"), RenewTime: &far, LeaseDurationSeconds: ptr.To[int32](1 << 30)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := newNodeLease(c, clk, "a")
	if err := a.Take(ctx); err != nil {
		t.Fatalf("Take: %v, want no refusal", err)
	}
	if err := a.Confirm(ctx); err == nil {
		t.Fatal("confirmed a node Lease held by another")
	}
	clk.Step(NodeLeaseDuration + time.Second) // the longest duration honoured
	if err := a.write(ctx, false); err != nil {
		t.Fatalf("taking over the unchanged Lease: %v", err)
	}
	if err := a.Confirm(ctx); err != nil {
		t.Fatalf("Confirm after the takeover: %v", err)
	}
}
