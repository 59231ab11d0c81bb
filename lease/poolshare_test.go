package lease

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/lease/nodelease"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// --max-concurrent P%: the share of the agents whose node Leases are
// unexpired, rounded down, at least 1; slot Leases, expired node Leases and
// node Leases of Nodes that do not exist do not count.
func TestPoolShare(t *testing.T) {
	now := time.Unix(10000, 0)
	clk := clocktesting.NewFakeClock(now)
	c := newFake()
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
		node := fmt.Sprintf("n%d", i)
		if _, err := c.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		lease(nodelease.NodeLeaseName(node), map[string]string{nodelease.LabelLease: "node"}, now.Add(-time.Minute))
	}
	lease(nodelease.NodeLeaseName("gone"), map[string]string{nodelease.LabelLease: "node"}, now.Add(-time.Hour))
	// Node Leases any token of the namespace can make, for nodes that do
	// not exist, renewed until 2099: they do not count.
	for i := range 20 {
		lease(nodelease.NodeLeaseName(fmt.Sprintf("ghost-%d", i)), map[string]string{nodelease.LabelLease: "node"}, time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC))
	}
	lease(SlotLeaseName(0), map[string]string{LabelRolloutSlot: "true"}, now)
	for _, tc := range []struct{ percent, want int }{{10, 1}, {25, 2}, {50, 4}, {100, 9}, {1, 1}} {
		s := &Slots{Client: clientset.Wrap(c), Namespace: "ns", Percent: tc.percent, Clock: clk, Log: testsupport.Discard()}
		n, pool, err := s.PoolShare(context.Background())
		if err != nil || pool != 9 || n != tc.want {
			t.Errorf("%d%%: PoolShare = %d of %d, %v; want %d of 9", tc.percent, n, pool, err, tc.want)
		}
	}
}
