package drain

import (
	"context"
	"slices"
	"testing"

	"github.com/migagent/mig-agent/testkit/clientset"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// selectedPods: the selector's pods on this node, not terminating.
func TestSelectedPods(t *testing.T) {
	pod := func(ns, name, node string, labels map[string]string, deleting bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Spec: corev1.PodSpec{NodeName: node}}
		if deleting {
			p.DeletionTimestamp = &metav1.Time{}
			p.Finalizers = []string{"x"}
		}
		return p
	}
	mon := map[string]string{"gpu-client": "true"}
	c := fake.NewClientset(
		pod("monitoring", "agent-a", "n1", mon, false),
		pod("ml", "sidecar", "n1", map[string]string{"gpu-client": "true", "app": "x"}, false),
		pod("monitoring", "agent-b", "n2", mon, false),
		pod("monitoring", "going", "n1", mon, true),
		pod("ml", "other", "n1", nil, false),
	)
	got, err := selectedPods(context.Background(), clientset.Wrap(c), "n1", "gpu-client=true")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ml/sidecar", "monitoring/agent-a"}; !slices.Equal(got, want) {
		t.Errorf("SelectedPods = %v, want %v", got, want)
	}
	if _, err := selectedPods(context.Background(), clientset.Wrap(c), "", "a=b"); err == nil {
		t.Error("no node: no error")
	}
}
