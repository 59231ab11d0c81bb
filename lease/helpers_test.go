package lease

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// waitUntil waits (real time, up to 5 s) for cond, or fails with what.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
	}
}

// newFake is a fake clientset in which every Node exists but those named
// "ghost…": a Node the tracker does not hold is read as a whole one (a
// hand-off reads its successor's Node; the holder's verdict on a whole Node
// and on one not found is the same: not disrupted).
func newFake(objs ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objs...)
	c.PrependReactor("get", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		name := a.(k8stesting.GetAction).GetName()
		if _, err := c.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", name); err == nil || strings.HasPrefix(name, "ghost") {
			return false, nil, nil
		}
		return true, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, nil
	})
	return c
}
