package nodelease

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// One agent per node across state dirs: a live holder keeps a second
// identity out; its own identity (a restart) takes the Lease back at once;
// an unrenewed Lease is taken over after its duration, and the agent that
// lost it learns so at its next renewal; release frees it for the next.
func TestNodeLease(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	lease := func(id string) *NodeLease {
		return &NodeLease{Client: clientset.Wrap(c), Namespace: "ns", Node: "gpu-1", Identity: id, Holder: "agent " + id,
			Duration: 30 * time.Second, Clock: clk, Log: testsupport.Discard()}
	}
	a, b := lease("a"), lease("b")
	if err := a.Take(ctx); err != nil || !a.held {
		t.Fatalf("first take: %v (held %v)", err, a.held)
	}
	err := b.Take(ctx)
	if !errors.Is(err, journal.ErrAnotherAgent) || !strings.Contains(err.Error(), "agent a") {
		t.Fatalf("second identity: %v, want journal.ErrAnotherAgent naming the holder", err)
	}
	if err := lease("a").Take(ctx); err != nil {
		t.Fatalf("the same identity again (a restart): %v", err)
	}
	clk.Step(31 * time.Second) // a stopped renewing
	if err := b.Take(ctx); err != nil {
		t.Fatalf("an expired Lease not taken over: %v", err)
	}
	if err := a.try(ctx); !errors.Is(err, journal.ErrAnotherAgent) {
		t.Fatalf("the agent that lost its Lease renews without noticing: %v", err)
	}
	b.release(ctx)
	l, err := c.CoordinationV1().Leases("ns").Get(ctx, NodeLeaseName("gpu-1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" {
		t.Fatalf("released Lease held by %q", h)
	}
	if l.Labels[LabelLease] != "node" || l.Labels[record.LabelManagedBy] != "" {
		t.Errorf("node Lease labels %v: the rollout slots' watch must not see it", l.Labels)
	}
	if err := a.Take(ctx); err != nil {
		t.Fatalf("a released Lease not taken: %v", err)
	}
}

// Keep renews until ctx ends and then releases; a Lease taken by another
// agent meanwhile ends Keep with journal.ErrAnotherAgent.
func TestNodeLeaseKeep(t *testing.T) {
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	a := &NodeLease{Client: clientset.Wrap(c), Namespace: "ns", Node: "n", Identity: "a", Duration: 30 * time.Second, Clock: clk, Log: testsupport.Discard()}
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Take(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	c.ClearActions()
	go func() { done <- a.Keep(ctx) }()
	for range 3 { // renewals at a quarter to a third of the duration keep b out
		for !clk.HasWaiters() {
			time.Sleep(time.Millisecond)
		}
		clk.Step(10 * time.Second)
		time.Sleep(20 * time.Millisecond)
	}
	// Each renewal is one request: an update of the Lease as last written.
	// (The watch of the Lease is one list and one watch, not a renewal.)
	var renewals int
	for _, act := range c.Actions() {
		if act.GetVerb() == "list" || act.GetVerb() == "watch" {
			continue
		}
		renewals++
		if act.GetVerb() != "update" {
			t.Errorf("a renewal sent %s %s, want updates only", act.GetVerb(), act.GetResource().Resource)
		}
	}
	if n := renewals; n != 3 {
		t.Errorf("%d requests for 3 renewals", n)
	}
	b := &NodeLease{Client: clientset.Wrap(c), Namespace: "ns", Node: "n", Identity: "b", Duration: 30 * time.Second, Clock: clk, Log: testsupport.Discard()}
	if err := b.Take(context.Background()); !errors.Is(err, journal.ErrAnotherAgent) {
		t.Fatalf("a renewed Lease was taken: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := b.Take(context.Background()); err != nil || !b.held {
		t.Fatalf("the Lease was not released by Keep's end: %v", err)
	}
	// b holds it now; an agent a that starts renewing learns it lost it.
	a2 := &NodeLease{Client: clientset.Wrap(c), Namespace: "ns", Node: "n", Identity: "a", Duration: 30 * time.Second, Clock: clk, Log: testsupport.Discard(), held: true}
	go func() { done <- a2.Keep(context.Background()) }()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case err := <-done:
			if !errors.Is(err, journal.ErrAnotherAgent) {
				t.Fatalf("Keep: %v, want journal.ErrAnotherAgent", err)
			}
			return
		case <-deadline:
			t.Fatal("Keep did not notice another agent holds the node")
		case <-time.After(20 * time.Millisecond):
			clk.Step(time.Second) // b's Lease stays live: 30 s from its take
		}
	}
}

func TestNodeLeaseIdentity(t *testing.T) {
	dir := t.TempDir()
	a, err := NodeLeaseIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The same directory through another path (a bind mount in a pod is
	// the same device and inode) is the same agent; another dir is not.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if b, _ := NodeLeaseIdentity(link); b != a {
		t.Errorf("same dir, other path: %q != %q", b, a)
	}
	if c, _ := NodeLeaseIdentity(t.TempDir()); c == a {
		t.Errorf("another dir has the same identity %q", c)
	}
	if long := NodeLeaseName(strings.Repeat("x", 253)); len(long) > 253 {
		t.Errorf("lease name of %d characters", len(long))
	}
}
