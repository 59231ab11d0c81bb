package agent

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// TestOtherManager: one row per kind of other MIG manager, and the look-alikes
// that are not one. (The fake clientset ignores field selectors, so every
// object here is on the node; the e2e tests run the real selectors.)
func TestOtherManager(t *testing.T) {
	node := func(labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: labels}}
	}
	pod := func(name string, labels map[string]string, phase corev1.PodPhase, deleting bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "gpu-operator", Name: name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: phase}}
		if deleting {
			now := metav1.Now()
			p.DeletionTimestamp = &now
		}
		return p
	}
	slice := func(driver string, devices ...resourcev1.Device) *resourcev1.ResourceSlice {
		return &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "n1-" + driver},
			Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: ptr.To("n1"), Pool: resourcev1.ResourcePool{Name: "n1"}, Devices: devices}}
	}
	dev := func(name, typ string) resourcev1.Device {
		d := resourcev1.Device{Name: name}
		if typ != "" {
			d.Attributes = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"type": {StringValue: ptr.To(typ)}}
		}
		return d
	}
	mm := map[string]string{"app": "nvidia-mig-manager"}
	tests := []struct {
		name    string
		node    *corev1.Node
		objects []runtime.Object
		failDRA error // answer of the ResourceSlice list
		want    string
		wantErr string
	}{
		{"nothing", node(nil), nil, nil, "", ""},
		{"deploy label true", node(map[string]string{LabelDeployMigManager: "true"}), nil, nil, "node label nvidia.com/gpu.deploy.mig-manager=true", ""},
		{"deploy label false", node(map[string]string{LabelDeployMigManager: "false"}), nil, nil, "", ""},
		{"deploy label paused", node(map[string]string{LabelDeployMigManager: "paused-for-mig-change"}), nil, nil, "", ""},
		{"operator pod by label", node(nil), []runtime.Object{pod("mig-manager-x1", mm, corev1.PodRunning, false)}, nil, "pod gpu-operator/mig-manager-x1", ""},
		{"operator pod by name", node(nil), []runtime.Object{pod("nvidia-mig-manager-abcde", nil, corev1.PodPending, false)}, nil, "pod gpu-operator/nvidia-mig-manager-abcde", ""},
		{"operator pod finished", node(nil), []runtime.Object{pod("nvidia-mig-manager-abcde", mm, corev1.PodSucceeded, false)}, nil, "", ""},
		{"operator pod failed", node(nil), []runtime.Object{pod("nvidia-mig-manager-abcde", mm, corev1.PodFailed, false)}, nil, "", ""},
		{"operator pod terminating", node(nil), []runtime.Object{pod("nvidia-mig-manager-abcde", mm, corev1.PodRunning, true)}, nil, "", ""},
		{"another pod", node(nil), []runtime.Object{pod("nvidia-device-plugin-x", map[string]string{"app": "nvidia-device-plugin-daemonset"}, corev1.PodRunning, false)}, nil, "", ""},
		{"DRA MIG device by type", node(nil), []runtime.Object{slice(NVIDIADRADriver, dev("gpu-0", "gpu"), dev("gpu-1-part-0", "mig"))}, nil,
			"the NVIDIA DRA driver (ResourceSlice n1-gpu.nvidia.com advertises MIG device gpu-1-part-0)", ""},
		{"DRA MIG device by name", node(nil), []runtime.Object{slice(NVIDIADRADriver, dev("gpu-0-mig-1g-18gb-0", ""))}, nil, "MIG device gpu-0-mig-1g-18gb-0", ""},
		{"DRA whole GPUs only", node(nil), []runtime.Object{slice(NVIDIADRADriver, dev("gpu-0", "gpu"), dev("gpu-1", "gpu"))}, nil, "", ""},
		{"another DRA driver", node(nil), []runtime.Object{slice("example.com/gpu", dev("gpu-0-mig-0", "mig"))}, nil, "", ""},
		{"no DRA API", node(nil), nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, ""), "", ""},
		{"no right to list slices", node(nil), nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "", nil), "", ""},
		{"slices unreadable", node(nil), nil, apierrors.NewServiceUnavailable("down"), "", "listing ResourceSlices"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(tc.objects...)
			if tc.failDRA != nil {
				c.PrependReactor("list", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, tc.failDRA
				})
			}
			got, err := OtherManager(context.Background(), c, tc.node)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("OtherManager = %q, want %q", got, tc.want)
			}
		})
	}
}
