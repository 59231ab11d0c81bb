package nodelease

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/testkit/kubefake"
)

// What the node Lease costs the API server (#28): the checks before each
// GPU step send none while the watch vouches for it.

// takenNodeLease is agent "a" holding its node Lease, with watch started
// (Keep, or only Keep's watch) and showing the agent's own write.
func takenNodeLease(t *testing.T, watch func(ctx context.Context, a *NodeLease)) (context.Context, *fake.Clientset, *clocktesting.FakeClock, *NodeLease) {
	t.Helper()
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(100000, 0))
	a := newNodeLease(c, clk, "a")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := a.Take(ctx); err != nil {
		t.Fatal(err)
	}
	watch(ctx, a)
	waitUntil(t, "the watch of the node Lease never showed the agent's own write", a.confirmedByWatch)
	return ctx, c, clk, a
}

func TestNodeLeaseConfirmFromWatch(t *testing.T) {
	ctx, c, clk, a := takenNodeLease(t, func(ctx context.Context, a *NodeLease) { go func() { _ = a.Keep(ctx) }() })
	name := NodeLeaseName("n")
	before := kubefake.LeaseRequests(c, name)
	for range 40 { // one change of eight GPUs: about 40 GPU steps
		if err := a.Confirm(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if after := kubefake.LeaseRequests(c, name); after["get"] != before["get"] || after["update"] != before["update"] {
		t.Errorf("40 confirmations with the watch showing the agent's write sent requests: %v then %v", before, after)
	}

	// Another identity writes it: the copy differs, Confirm reads and
	// refuses (or Keep, poked by the watch, found it first).
	l, err := c.CoordinationV1().Leases("ns").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.NewMicroTime(clk.Now())
	l.Spec.HolderIdentity, l.Spec.RenewTime = ptr.To("b"), &now
	if _, err := c.CoordinationV1().Leases("ns").Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the watch kept vouching for a Lease another identity wrote", func() bool { return !a.confirmedByWatch() })
	if err := a.Confirm(ctx); !errors.Is(err, journal.ErrAnotherAgent) {
		t.Fatalf("Confirm after another identity took the Lease: %v", err)
	}
}

// Half the lease duration without a renewal: the watch no longer vouches,
// and Confirm reads the Lease.
func TestNodeLeaseConfirmStaleWatchReads(t *testing.T) {
	ctx, c, clk, a := takenNodeLease(t, func(ctx context.Context, a *NodeLease) {
		if err := a.watch(ctx, make(chan struct{}, 1)); err != nil { // Keep's watch, without its renewals
			t.Fatal(err)
		}
	})
	name := NodeLeaseName("n")
	clk.Step(16 * time.Second)
	if a.confirmedByWatch() {
		t.Error("a write older than half the lease duration still vouches")
	}
	before := kubefake.LeaseRequests(c, name)["get"]
	if err := a.Confirm(ctx); err != nil {
		t.Fatal(err)
	}
	if got := kubefake.LeaseRequests(c, name)["get"]; got != before+1 {
		t.Errorf("a stale watch copy: %d GETs, want %d", got, before+1)
	}
}

// waitUntil waits (real time, up to 5 s) for cond, or fails with what.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
	}
}
