package kube

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/clientset"
)

// Lift removes exactly the startup taints (key, value and effect), keeps
// every other taint, and writes nothing while the state label says
// anything but success (or nothing).
func TestLiftStartupTaints(t *testing.T) {
	ctx := context.Background()
	startup := corev1.Taint{Key: "migagent.io/geometry-pending", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	others := []corev1.Taint{
		{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule},
		{Key: startup.Key, Value: "other", Effect: corev1.TaintEffectNoSchedule},
		{Key: startup.Key, Value: "true", Effect: corev1.TaintEffectNoExecute},
		{Key: "migagent.io/reconfiguring", Value: "true", Effect: corev1.TaintEffectNoSchedule},
	}
	for _, tc := range []struct {
		state      string
		wantLifted bool
	}{
		{record.StateFailed, false}, {record.StatePending, false}, {record.StateRebooting, false},
		{record.StateSuccess, true}, {"", true},
	} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{}},
			Spec: corev1.NodeSpec{Taints: append(slices.Clone(others), startup)}}
		if tc.state != "" {
			node.Labels[record.LabelState] = tc.state
		}
		c := fake.NewClientset(node)
		k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Clock: clocktesting.NewFakeClock(time.Unix(0, 0)),
			StartupTaints: []corev1.Taint{startup}}
		lifted, err := k.Lift(ctx)
		if err != nil || lifted != tc.wantLifted {
			t.Fatalf("state %q: lifted %v, err %v", tc.state, lifted, err)
		}
		n, _ := k.getNode(ctx)
		want := append(slices.Clone(others), startup)
		if tc.wantLifted {
			want = others
		}
		if !slices.Equal(n.Spec.Taints, want) {
			t.Fatalf("state %q: taints %v, want %v", tc.state, n.Spec.Taints, want)
		}
		// Again: nothing left to remove, no write.
		if tc.wantLifted {
			writes := len(c.Actions())
			if lifted, err := k.Lift(ctx); !lifted || err != nil {
				t.Fatalf("second lift: %v %v", lifted, err)
			}
			for _, a := range c.Actions()[writes:] {
				if a.GetVerb() == "update" {
					t.Fatal("a second lift wrote the Node")
				}
			}
		}
	}
}
