package lease

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// What the rollout costs the API server in Lease requests (#28): the
// checks before each GPU step send none while the watch vouches for the
// node Lease, and a slot is released with one write.

// leaseRequests counts the requests on Leases named name, by verb, from
// the fake clientset's action log (watches and lists excluded: they name
// no object).
func leaseRequests(c *fake.Clientset, name string) map[string]int {
	n := map[string]int{}
	for _, a := range c.Actions() {
		if a.GetResource().Resource != "leases" {
			continue
		}
		switch x := a.(type) {
		case k8stesting.PatchAction: // before GetAction: it has GetName too
			if x.GetName() == name {
				n[a.GetVerb()]++
			}
		case k8stesting.GetAction:
			if x.GetName() == name {
				n[a.GetVerb()]++
			}
		case k8stesting.UpdateAction: // creates too: the same methods
			if x.GetObject().(metav1.Object).GetName() == name {
				n[a.GetVerb()]++
			}
		}
	}
	return n
}

func TestSlotReleaseIsOneWrite(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := newFake()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	slot, err := acquireStepping(t, clk, newSlots(c, clk, "a"))
	if err != nil {
		t.Fatal(err)
	}
	name := SlotLeaseName(0)
	before := leaseRequests(c, name)
	slot.Release(false)
	after := leaseRequests(c, name)
	if after["get"] != before["get"] || after["update"] != before["update"] || after["patch"] != before["patch"]+1 {
		t.Errorf("release: %v then %v, want one patch and nothing else", before, after)
	}
	l, err := c.CoordinationV1().Leases("ns").Get(ctx, name, metav1.GetOptions{})
	if err != nil || ptr.Deref(l.Spec.HolderIdentity, "x") != "" {
		t.Fatalf("after release: %v %v", l, err)
	}
}
