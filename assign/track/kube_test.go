package track

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/testkit/clientset"
)

// The Event names the device UUID, profile, GPU index and node, on the
// pod by its UID; a pod that could not be read gets none.
func TestKubePodsEvent(t *testing.T) {
	c := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "p", UID: "u-1"}})
	ctx := context.Background()
	k := &KubePods{Client: clientset.Wrap(c), Node: "gpu-17", Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	uid, err := k.UID(ctx, "ml", "p")
	if err != nil || uid != "u-1" {
		t.Fatalf("UID = %q, %v", uid, err)
	}
	e := assign.Entry{Namespace: "ml", Pod: "p", PodUID: uid, Container: "main", Device: devA}
	if err := k.Assigned(ctx, e); err != nil {
		t.Fatal(err)
	}
	if err := k.Assigned(ctx, assign.Entry{Namespace: "ml", Pod: "gone", Container: "main", Device: devA}); err != nil {
		t.Fatal(err)
	}
	evs, err := c.CoreV1().Events("ml").List(ctx, metav1.ListOptions{})
	if err != nil || len(evs.Items) != 1 {
		t.Fatalf("Events: %+v, %v", evs, err)
	}
	ev := evs.Items[0]
	if ev.Reason != EventReason || ev.InvolvedObject.UID != "u-1" || ev.Type != corev1.EventTypeNormal ||
		ev.Message != "container main got MIG device MIG-a (profile 1g.18gb, GPU 0, placement 0+1) on node gpu-17" {
		t.Errorf("Event %+v", ev)
	}
}
