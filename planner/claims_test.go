package planner

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/testkit/clientset"
)

func celSel(exprs ...string) []resourcev1.DeviceSelector {
	var out []resourcev1.DeviceSelector
	for _, e := range exprs {
		out = append(out, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: e}})
	}
	return out
}

func TestSelectorProfile(t *testing.T) {
	cel := func(exprs ...string) []string { return exprs }
	for _, tc := range []struct {
		sel  []string
		want string
	}{
		{cel(`device.attributes["gpu.nvidia.com"].profile == "3g.71gb"`), "3g.71gb"},
		{cel(`device.attributes['gpu.nvidia.com'].profile=='1g.18gb'`), "1g.18gb"},
		{cel(`"2g.35gb" == device.attributes["gpu.nvidia.com"].profile`), "2g.35gb"},
		{cel(`device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200"`, `device.attributes["gpu.nvidia.com"].profile == "3g.71gb"`), "3g.71gb"},
		// Two profiles: the planner cannot tell which.
		{cel(`device.attributes["gpu.nvidia.com"].profile == "3g.71gb" || device.attributes["gpu.nvidia.com"].profile == "4g.71gb"`), ""},
		{cel(`device.attributes["gpu.nvidia.com"].type == "mig"`), ""},
		{cel(`device.attributes["other.example.com"].profile == "3g.71gb"`), ""},
		{nil, ""},
	} {
		if got := SelectorProfile(tc.sel); got != tc.want {
			t.Errorf("SelectorProfile(%v) = %q, want %q", tc.sel, got, tc.want)
		}
	}
}

func migClaim(ns, name, profile string, count int64) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "mig",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: MigDeviceClass, Count: count,
				Selectors: celSel(`device.attributes["gpu.nvidia.com"].profile == "` + profile + `"`)}}}}}}
}

func TestClaimWants(t *testing.T) {
	profile := func(p string) []string { return []string{`device.attributes["gpu.nvidia.com"].profile == "` + p + `"`} }
	two := dra.Claim{Namespace: "ml", Name: "c", Requests: []dra.ClaimRequest{
		{Class: MigDeviceClass, Count: 2, Selectors: profile("3g.71gb")},
		{Class: MigDeviceClass, Selectors: profile("1g.18gb")},
		{Class: "gpu.nvidia.com", Selectors: profile("7g.141gb")},
		{Class: MigDeviceClass, All: true, Selectors: profile("2g.35gb")},
		{Class: MigDeviceClass}}}
	if got := ClaimWants(two); len(got) != 2 || got["3g.71gb"] != 2 || got["1g.18gb"] != 1 {
		t.Errorf("ClaimWants = %v, want 2× 3g.71gb, 1× 1g.18gb", got)
	}
	allocated := dra.Claim{Namespace: "ml", Name: "c", Allocated: true, Requests: two.Requests[:1]}
	if got := ClaimWants(allocated); len(got) != 0 {
		t.Errorf("an allocated claim wants %v", got)
	}
}

// Pending pods that ask through ResourceClaims (a claim of their own, or
// one made from a template and named in their status) are read, with their
// device plugin limits; a pod whose claim asks for no MIG profile is not.
func TestPendingPodsReadsClaims(t *testing.T) {
	unsched := corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable}}}
	direct := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "direct", UID: types.UID("u1")},
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("shared-3g")}}}, Status: unsched}
	fromTemplate := pendingPodObj("templated", "1g.18gb")
	fromTemplate.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("tmpl")}}
	fromTemplate.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("templated-gpu-x7k2p")}}
	notYet := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "not-yet", UID: types.UID("u3")},
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("tmpl")}}}, Status: unsched}
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "other", UID: types.UID("u4")},
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "nic", ResourceClaimName: ptr.To("nic")}}}, Status: unsched}
	nic := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "nic"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "nic",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "rdma.example.com"}}}}}}
	c := clientset.Wrap(fake.NewClientset(direct, fromTemplate, notYet, other,
		migClaim("ml", "shared-3g", "3g.71gb", 1), migClaim("ml", "templated-gpu-x7k2p", "2g.35gb", 1), nic))
	pods, err := PendingPods(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]int{}
	for _, p := range pods {
		got[p.Name] = p.Wants
	}
	if len(got) != 2 || got["direct"]["3g.71gb"] != 1 || len(got["direct"]) != 1 ||
		got["templated"]["1g.18gb"] != 1 || got["templated"]["2g.35gb"] != 1 || len(got["templated"]) != 2 {
		t.Errorf("pending pods' wants: %v", got)
	}
}
