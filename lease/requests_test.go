package lease

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/testkit/kubefake"
)

// What the rollout costs the API server in Lease requests (#28): the
// checks before each GPU step send none while the watch vouches for the
// node Lease, and a slot is released with one write.

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
	before := kubefake.LeaseRequests(c, name)
	slot.Release(false)
	after := kubefake.LeaseRequests(c, name)
	if after["get"] != before["get"] || after["update"] != before["update"] || after["patch"] != before["patch"]+1 {
		t.Errorf("release: %v then %v, want one patch and nothing else", before, after)
	}
	l, err := c.CoordinationV1().Leases("ns").Get(ctx, name, metav1.GetOptions{})
	if err != nil || ptr.Deref(l.Spec.HolderIdentity, "x") != "" {
		t.Fatalf("after release: %v %v", l, err)
	}
}
