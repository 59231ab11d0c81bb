package kube

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// TestOtherManager: one row per kind of other MIG manager, and the look-alikes
// that are not one. (The fake clientset ignores field selectors, so every
// object here is on the node; the e2e tests run the real selectors, and
// e2e/gpuoperator_test.go the GPU Operator's own controller.)
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
	// policy is a ClusterPolicy; enabled nil leaves spec.migManager.enabled unset.
	policy := func(name string, enabled *bool, state string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"migManager": map[string]any{}}}}
		if enabled != nil {
			_ = unstructured.SetNestedField(u.Object, *enabled, "spec", "migManager", "enabled")
		}
		if state != "" {
			_ = unstructured.SetNestedField(u.Object, state, "status", "state")
		}
		return u
	}
	on, off := ptr.To(true), ptr.To(false)
	mm := map[string]string{"app": "nvidia-mig-manager"}
	deployTrue := map[string]string{LabelDeployMigManager: "true"}
	cpForbidden := apierrors.NewForbidden(ClusterPolicyResource.GroupResource(), "", nil)
	tests := []struct {
		name     string
		node     *corev1.Node
		objects  []runtime.Object
		policies []runtime.Object // nil: no ClusterPolicy API (dyn nil)
		failCP   error            // answer of the ClusterPolicy list
		failDRA  error            // answer of the ResourceSlice list
		want     string
		wantErr  string
	}{
		{name: "nothing", node: node(nil)},
		// The operator sets the deploy label on every MIG-capable node,
		// whether or not its MIG manager is enabled: never a conflict alone.
		{name: "deploy label true alone", node: node(deployTrue)},
		{name: "deploy label true, MIG manager disabled", node: node(deployTrue), policies: []runtime.Object{policy("cluster-policy", off, "ready")}},
		{name: "deploy label false", node: node(map[string]string{LabelDeployMigManager: "false"})},
		{name: "deploy label paused", node: node(map[string]string{LabelDeployMigManager: "paused-for-mig-change"})},
		{name: "operator pod running", node: node(nil), objects: []runtime.Object{pod("nvidia-mig-manager-x1", mm, corev1.PodRunning, false)},
			want: "the GPU Operator's MIG manager (pod gpu-operator/nvidia-mig-manager-x1)"},
		{name: "operator pod pending", node: node(nil), objects: []runtime.Object{pod("nvidia-mig-manager-abcde", mm, corev1.PodPending, false)},
			want: "pod gpu-operator/nvidia-mig-manager-abcde"},
		{name: "operator pod, MIG manager disabled since", node: node(deployTrue), objects: []runtime.Object{pod("nvidia-mig-manager-abcde", mm, corev1.PodRunning, false)},
			policies: []runtime.Object{policy("cluster-policy", off, "ready")}, want: "pod gpu-operator/nvidia-mig-manager-abcde"},
		{name: "operator pod finished", node: node(nil), objects: []runtime.Object{pod("nvidia-mig-manager-abcde", mm, corev1.PodSucceeded, false)}},
		{name: "operator pod failed", node: node(nil), objects: []runtime.Object{pod("nvidia-mig-manager-abcde", mm, corev1.PodFailed, false)}},
		// Finding 10: a terminating MIG manager pod may still run its
		// process (grace period): a conflict until it is gone.
		{name: "operator pod terminating", node: node(nil), objects: []runtime.Object{pod("nvidia-mig-manager-abcde", mm, corev1.PodRunning, true)},
			want: "the GPU Operator's MIG manager (pod gpu-operator/nvidia-mig-manager-abcde, terminating: its process may still run until the pod is gone)"},
		{name: "operator pod terminating, its containers ended", node: node(nil), objects: []runtime.Object{pod("nvidia-mig-manager-abcde", mm, corev1.PodSucceeded, true)}},
		{name: "look-alike name without the label", node: node(nil), objects: []runtime.Object{pod("nvidia-mig-manager-debug", nil, corev1.PodRunning, false)}},
		{name: "another operand pod", node: node(deployTrue), objects: []runtime.Object{pod("nvidia-device-plugin-x", map[string]string{"app": "nvidia-device-plugin-daemonset"}, corev1.PodRunning, false)}},
		{name: "MIG manager enabled", node: node(deployTrue), policies: []runtime.Object{policy("cluster-policy", on, "ready")},
			want: "the GPU Operator's MIG manager (ClusterPolicy cluster-policy has spec.migManager.enabled=true)"},
		{name: "MIG manager enabled, node unlabelled yet", node: node(nil), policies: []runtime.Object{policy("cluster-policy", on, "")},
			want: "ClusterPolicy cluster-policy has spec.migManager.enabled=true"},
		{name: "MIG manager enabled, deploy label paused", node: node(map[string]string{LabelDeployMigManager: "paused-for-driver-upgrade"}),
			policies: []runtime.Object{policy("cluster-policy", on, "ready")}, want: "spec.migManager.enabled=true"},
		{name: "MIG manager enabled, node opted out", node: node(map[string]string{LabelDeployMigManager: "false"}),
			policies: []runtime.Object{policy("cluster-policy", on, "ready")}},
		{name: "MIG manager by default", node: node(deployTrue), policies: []runtime.Object{policy("cluster-policy", nil, "ready")},
			want: "ClusterPolicy cluster-policy leaves spec.migManager.enabled unset, which enables it"},
		{name: "ignored ClusterPolicy enables it", node: node(deployTrue),
			policies: []runtime.Object{policy("cluster-policy", off, "ready"), policy("second", on, "ignored")}},
		{name: "no ClusterPolicy", node: node(deployTrue), policies: []runtime.Object{}},
		{name: "no ClusterPolicy CRD", node: node(deployTrue), policies: []runtime.Object{},
			failCP: apierrors.NewNotFound(ClusterPolicyResource.GroupResource(), "")},
		{name: "no right to read ClusterPolicies", node: node(deployTrue), policies: []runtime.Object{}, failCP: cpForbidden},
		{name: "no right to read ClusterPolicies, operator pod", node: node(deployTrue), policies: []runtime.Object{}, failCP: cpForbidden,
			objects: []runtime.Object{pod("nvidia-mig-manager-abcde", mm, corev1.PodRunning, false)}, want: "pod gpu-operator/nvidia-mig-manager-abcde"},
		{name: "ClusterPolicies unreadable", node: node(deployTrue), policies: []runtime.Object{}, failCP: apierrors.NewServiceUnavailable("down"),
			wantErr: "listing the GPU Operator's ClusterPolicies"},
		{name: "DRA MIG device by type", node: node(nil), objects: []runtime.Object{slice(NVIDIADRADriver, dev("gpu-0", "gpu"), dev("gpu-1-part-0", "mig"))},
			want: "the NVIDIA DRA driver (ResourceSlice n1-gpu.nvidia.com advertises MIG device gpu-1-part-0)"},
		{name: "DRA MIG device by name", node: node(nil), objects: []runtime.Object{slice(NVIDIADRADriver, dev("gpu-0-mig-1g-18gb-0", ""))}, want: "MIG device gpu-0-mig-1g-18gb-0"},
		{name: "DRA MIG device, MIG manager disabled", node: node(deployTrue), objects: []runtime.Object{slice(NVIDIADRADriver, dev("gpu-0-mig-1g-18gb-0", ""))},
			policies: []runtime.Object{policy("cluster-policy", off, "ready")}, want: "the NVIDIA DRA driver"},
		{name: "DRA whole GPUs only", node: node(nil), objects: []runtime.Object{slice(NVIDIADRADriver, dev("gpu-0", "gpu"), dev("gpu-1", "gpu"))}},
		{name: "another DRA driver", node: node(nil), objects: []runtime.Object{slice("example.com/gpu", dev("gpu-0-mig-0", "mig"))}},
		{name: "no DRA API", node: node(nil), failDRA: apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "")},
		{name: "no right to list slices", node: node(nil), failDRA: apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "", nil)},
		{name: "slices unreadable", node: node(nil), failDRA: apierrors.NewServiceUnavailable("down"), wantErr: "listing ResourceSlices"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(tc.objects...)
			if tc.failDRA != nil {
				c.PrependReactor("list", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, tc.failDRA
				})
			}
			var dyn dynamic.Interface
			if tc.policies != nil {
				d := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
					map[schema.GroupVersionResource]string{ClusterPolicyResource: "ClusterPolicyList"}, tc.policies...)
				if tc.failCP != nil {
					d.PrependReactor("list", "clusterpolicies", func(k8stesting.Action) (bool, runtime.Object, error) {
						return true, nil, tc.failCP
					})
				}
				dyn = d
			}
			got, err := OtherManager(context.Background(), c, dyn, tc.node)
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
