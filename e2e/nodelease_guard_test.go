package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/lease/nodelease"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// Findings 4 and 5 with the real binary. The node Lease deleted (an
// operator cleaning Leases) is taken again by the node's agent within
// moments, so a second agent with another state dir started right after
// is refused (exit 1). A Lease written by another identity with renewTime
// in 2099 does not keep the node's agent from starting.
func TestNodeLeaseDeletedAndFarFuture(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := (&Opts{Node: node, Sim: "h200x1"}).Fill(t)
	a := StartAgent(t, o)
	waitReady(t, a)
	leases := c.CoordinationV1().Leases(o.Namespace)
	name := nodelease.NodeLeaseName(node)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mine := ptr.Deref(l.Spec.HolderIdentity, "")
	if err := leases.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 5*time.Second, "the agent to take its deleted node Lease again", func() bool {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		return err == nil && ptr.Deref(l.Spec.HolderIdentity, "") == mine
	})
	other := *o
	other.StateDir = filepath.Join(t.TempDir(), "other-state")
	b := StartAgent(t, &other)
	if code, exited := b.Wait(10 * time.Second); !exited || code != 1 {
		t.Fatalf("a second agent after the Lease was deleted: exited %v, code %d\n%s", exited, code, b.Log())
	}
	grAlive(t, a, "the first agent")
	if code := a.Stop(); code != 0 {
		t.Fatalf("SIGTERM: exit code %d", code)
	}

	// Another identity's Lease with renewTime in 2099: the agent starts
	// (it does not exit), changes nothing until the Lease is its own.
	l, err = leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	far := metav1.NewMicroTime(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC))
	l.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To("mallory"), RenewTime: &far, LeaseDurationSeconds: ptr.To[int32](1 << 30)}
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a = StartAgent(t, o)
	if code, exited := a.Wait(5 * time.Second); exited {
		t.Fatalf("the node's agent exited %d on a Lease with renewTime in 2099:\n%s", code, a.Log())
	}
	grAlive(t, a, "the agent beside a far-future Lease")
}
