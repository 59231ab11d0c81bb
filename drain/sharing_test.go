package drain

import (
	"context"
	"errors"
	"github.com/migagent/mig-agent/drain/sharing"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/testkit/clientset"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func list(kv map[string]int64) corev1.ResourceList {
	out := corev1.ResourceList{}
	for k, v := range kv {
		out[corev1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	return out
}

func TestMatchSharedKnown(t *testing.T) {
	want := map[corev1.ResourceName]int64{"nvidia.com/mig-1g.18gb": 7}
	replicas := &sharing.Config{Resources: map[corev1.ResourceName]sharing.Replicated{"nvidia.com/mig-1g.18gb": {Replicas: 4, As: "nvidia.com/mig-1g.18gb"}}}
	renamed := &sharing.Config{Resources: map[corev1.ResourceName]sharing.Replicated{"nvidia.com/mig-1g.18gb": {Replicas: 4, As: "nvidia.com/mig-1g.18gb.shared"}}}
	for _, tc := range []struct {
		name    string
		sharing *sharing.Config
		have    map[string]int64
		miss    string // "" is a match
	}{
		{"replicas", replicas, map[string]int64{"nvidia.com/mig-1g.18gb": 28, "nvidia.com/gpu": 0}, ""},
		{"replicas, plain count", replicas, map[string]int64{"nvidia.com/mig-1g.18gb": 7}, "nvidia.com/mig-1g.18gb: have 7, want 28"},
		{"replicas, another multiple", replicas, map[string]int64{"nvidia.com/mig-1g.18gb": 14}, "have 14, want 28"},
		{"renamed", renamed, map[string]int64{"nvidia.com/mig-1g.18gb.shared": 28, "nvidia.com/mig-1g.18gb": 0}, ""},
		{"renamed, old name left", renamed, map[string]int64{"nvidia.com/mig-1g.18gb.shared": 28, "nvidia.com/mig-1g.18gb": 7}, "nvidia.com/mig-1g.18gb: have 7, want 0"},
		{"none, plain", sharing.None, map[string]int64{"nvidia.com/mig-1g.18gb": 7}, ""},
		{"none, shared leftover", sharing.None, map[string]int64{"nvidia.com/mig-1g.18gb": 7, "nvidia.com/gpu.shared": 2}, "nvidia.com/gpu.shared: have 2, want 0"},
	} {
		got := strings.Join(matchShared(list(tc.have), want, tc.sharing), "; ")
		if (tc.miss == "") != (got == "") || !strings.Contains(got, tc.miss) {
			t.Errorf("%s: MatchShared = %q, want %q", tc.name, got, tc.miss)
		}
	}
}

func TestMatchSharedDocumentedForms(t *testing.T) {
	want := map[corev1.ResourceName]int64{"nvidia.com/mig-1g.18gb": 7, "nvidia.com/mig-2g.35gb": 2}
	for _, tc := range []struct {
		name string
		have map[string]int64
		miss string
	}{
		{"plain counts", map[string]int64{"nvidia.com/mig-1g.18gb": 7, "nvidia.com/mig-2g.35gb": 2}, ""},
		{"replicas per resource", map[string]int64{"nvidia.com/mig-1g.18gb": 28, "nvidia.com/mig-2g.35gb": 2}, ""},
		{"renamed", map[string]int64{"nvidia.com/mig-1g.18gb.shared": 28, "nvidia.com/mig-2g.35gb.shared": 6}, ""},
		{"not a multiple", map[string]int64{"nvidia.com/mig-1g.18gb": 30, "nvidia.com/mig-2g.35gb": 2}, "nvidia.com/mig-1g.18gb: have 30, want 7 or a whole multiple"},
		{"renamed, not a multiple", map[string]int64{"nvidia.com/mig-1g.18gb.shared": 27, "nvidia.com/mig-2g.35gb": 2}, "nvidia.com/mig-1g.18gb.shared: have 27"},
		{"both names", map[string]int64{"nvidia.com/mig-1g.18gb": 7, "nvidia.com/mig-1g.18gb.shared": 28, "nvidia.com/mig-2g.35gb": 2}, "want only one of them"},
		{"missing", map[string]int64{"nvidia.com/mig-2g.35gb": 2}, "nvidia.com/mig-1g.18gb: have 0, want 7"},
		{"a resource too many", map[string]int64{"nvidia.com/mig-1g.18gb": 7, "nvidia.com/mig-2g.35gb": 2, "nvidia.com/mig-3g.71gb": 1}, "nvidia.com/mig-3g.71gb: have 1, want 0"},
		{"a shared resource too many", map[string]int64{"nvidia.com/mig-1g.18gb": 7, "nvidia.com/mig-2g.35gb": 2, "nvidia.com/gpu.shared": 4}, "nvidia.com/gpu.shared: have 4, want 0"},
		{"another vendor", map[string]int64{"nvidia.com/mig-1g.18gb": 7, "nvidia.com/mig-2g.35gb": 2, "example.com/fpga": 3}, ""},
	} {
		got := strings.Join(matchShared(list(tc.have), want, nil), "; ")
		if (tc.miss == "") != (got == "") || !strings.Contains(got, tc.miss) {
			t.Errorf("%s: MatchShared = %q, want %q", tc.name, got, tc.miss)
		}
	}
}

// waitAdvertised converges on a replicated count the plain wait refuses.
func TestWaitAdvertisedShared(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{
		Allocatable: list(map[string]int64{"nvidia.com/mig-1g.18gb.shared": 28})}}
	c := fake.NewClientset(n)
	want := map[corev1.ResourceName]int64{"nvidia.com/mig-1g.18gb": 7}
	if ok, err := waitAllocatable(context.Background(), clientset.Wrap(c), "n1", want, 0); ok || !errors.Is(err, errResourcesTimeout) {
		t.Errorf("WaitAllocatable = %v, %v, want a timeout", ok, err)
	}
	if ok, err := waitAdvertised(context.Background(), clientset.Wrap(c), "n1", want, nil, 0); !ok || err != nil {
		t.Errorf("WaitAdvertised(documented forms) = %v, %v", ok, err)
	}
	renamed := &sharing.Config{Resources: map[corev1.ResourceName]sharing.Replicated{"nvidia.com/mig-1g.18gb": {Replicas: 4, As: "nvidia.com/mig-1g.18gb.shared"}}}
	if ok, err := waitAdvertised(context.Background(), clientset.Wrap(c), "n1", want, renamed, time.Second); !ok || err != nil {
		t.Errorf("WaitAdvertised(renamed) = %v, %v", ok, err)
	}
}
