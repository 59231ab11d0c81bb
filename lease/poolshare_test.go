package lease

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/internal/kclient/clientset"
	"github.com/migagent/mig-agent/internal/testsupport"
	"github.com/migagent/mig-agent/lease/nodelease"
)

// --max-concurrent P%: the share of the agents whose node Leases are
// unexpired, rounded down, at least 1; slot Leases and expired node Leases
// do not count.
func TestPoolShare(t *testing.T) {
	now := time.Unix(10000, 0)
	clk := clocktesting.NewFakeClock(now)
	c := fake.NewClientset()
	lease := func(name string, labels map[string]string, renewed time.Time) {
		t.Helper()
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](600),
				RenewTime: &metav1.MicroTime{Time: renewed}}}
		if _, err := c.CoordinationV1().Leases("ns").Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 9 {
		lease(fmt.Sprintf("mig-agent-node-n%d", i), map[string]string{nodelease.LabelLease: "node"}, now.Add(-time.Minute))
	}
	lease("mig-agent-node-gone", map[string]string{nodelease.LabelLease: "node"}, now.Add(-time.Hour))
	lease(SlotLeaseName(0), map[string]string{LabelRolloutSlot: "true"}, now)
	for _, tc := range []struct{ percent, want int }{{10, 1}, {25, 2}, {50, 4}, {100, 9}, {1, 1}} {
		s := &Slots{Client: clientset.Wrap(c), Namespace: "ns", Percent: tc.percent, Clock: clk, Log: testsupport.Discard()}
		n, pool, err := s.PoolShare(context.Background())
		if err != nil || pool != 9 || n != tc.want {
			t.Errorf("%d%%: PoolShare = %d of %d, %v; want %d of 9", tc.percent, n, pool, err, tc.want)
		}
	}
}
