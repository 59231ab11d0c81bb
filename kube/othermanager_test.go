package kube

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/internal/kclient/restclient"
	"github.com/migagent/mig-agent/testkit/clientset"
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
	notServed := apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "")
	mm := map[string]string{"app": "nvidia-mig-manager"}
	deployTrue := map[string]string{LabelDeployMigManager: "true"}
	cpForbidden := apierrors.NewForbidden(ClusterPolicyResource.GroupResource(), "", nil)
	tests := []struct {
		name     string
		node     *corev1.Node
		objects  []runtime.Object
		policies []runtime.Object // nil: no ClusterPolicy API (dyn nil)
		failCP   error            // answer of the ClusterPolicy list
		failDRA  map[string]error // answer of the ResourceSlice list, by resource.k8s.io version
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
		// Pre-created MIG devices, as the driver announces them without
		// DynamicMIG: the agent serves them, no conflict.
		{name: "DRA pre-created MIG devices", node: node(nil), objects: []runtime.Object{slice(NVIDIADRADriver, dev("gpu-0", "gpu"), dev("gpu-1-mig-1g18gb-19-0", "mig"))}},
		{name: "DRA whole GPUs only", node: node(nil), objects: []runtime.Object{slice(NVIDIADRADriver, dev("gpu-0", "gpu"), dev("gpu-1", "gpu"))}},
		// DynamicMIG, combined slices (Kubernetes 1.34): counters and devices in one slice.
		{name: "DRA DynamicMIG combined", node: node(nil), objects: []runtime.Object{dynamicMIG(slice(NVIDIADRADriver, dev("gpu-0", "gpu"), dev("gpu-0-mig-1g18gb-19-0", "mig")), true, true)},
			want: "the NVIDIA DRA driver in DynamicMIG mode, which creates and destroys MIG devices itself (ResourceSlice n1-gpu.nvidia.com carries 1 shared counter sets)"},
		// DynamicMIG, split slices (1.35+): the counters alone in slice 0, devices consuming them elsewhere.
		{name: "DRA DynamicMIG split, counters slice", node: node(nil), objects: []runtime.Object{dynamicMIG(slice(NVIDIADRADriver), true, false)}, want: "DynamicMIG"},
		{name: "DRA DynamicMIG split, devices slice", node: node(nil), objects: []runtime.Object{dynamicMIG(slice(NVIDIADRADriver, dev("gpu-0-mig-1g18gb-19-0", "mig")), false, true)},
			want: "device gpu-0-mig-1g18gb-19-0 consumes shared counters"},
		{name: "DRA DynamicMIG, MIG manager disabled", node: node(deployTrue), objects: []runtime.Object{dynamicMIG(slice(NVIDIADRADriver, dev("gpu-0-mig-1g18gb-19-0", "mig")), true, true)},
			policies: []runtime.Object{policy("cluster-policy", off, "ready")}, want: "the NVIDIA DRA driver in DynamicMIG mode"},
		{name: "another DRA driver with counters", node: node(nil), objects: []runtime.Object{dynamicMIG(slice("example.com/gpu", dev("gpu-0-mig-0", "mig")), true, true)}},
		// Older clusters serve v1beta2 or v1beta1 only: each is read.
		{name: "DynamicMIG through v1beta2", node: node(nil), objects: []runtime.Object{v1beta2Counters()},
			failDRA: map[string]error{"v1": notServed}, want: "ResourceSlice b2 carries 1 shared counter sets"},
		{name: "DynamicMIG through v1beta1", node: node(nil), objects: []runtime.Object{v1beta1Consumer()},
			failDRA: map[string]error{"v1": notServed, "v1beta2": notServed}, want: "ResourceSlice b1: device gpu-0-mig-1g18gb-19-0 consumes shared counters"},
		{name: "v1beta2 not served, v1beta1 empty", node: node(nil), objects: []runtime.Object{v1beta2Counters()},
			failDRA: map[string]error{"v1": notServed, "v1beta2": notServed}},
		{name: "no DRA API", node: node(nil), objects: []runtime.Object{v1beta2Counters()},
			failDRA: map[string]error{"v1": notServed, "v1beta2": notServed, "v1beta1": notServed}},
		{name: "no right to list slices", node: node(nil), objects: []runtime.Object{v1beta2Counters()},
			failDRA: map[string]error{"v1": apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "", nil)}},
		{name: "slices unreadable", node: node(nil), failDRA: map[string]error{"v1": apierrors.NewServiceUnavailable("down")}, wantErr: "listing ResourceSlices (resource.k8s.io/v1)"},
		{name: "v1beta2 unreadable", node: node(nil), failDRA: map[string]error{"v1": notServed, "v1beta2": apierrors.NewServiceUnavailable("down")},
			wantErr: "listing ResourceSlices (resource.k8s.io/v1beta2)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(tc.objects...)
			if tc.failDRA != nil {
				c.PrependReactor("list", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
					err := tc.failDRA[a.GetResource().Version]
					return err != nil, nil, err
				})
			}
			var policies ClusterPolicies
			if tc.policies != nil {
				d := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
					map[schema.GroupVersionResource]string{ClusterPolicyResource: "ClusterPolicyList"}, tc.policies...)
				if tc.failCP != nil {
					d.PrependReactor("list", "clusterpolicies", func(k8stesting.Action) (bool, runtime.Object, error) {
						return true, nil, tc.failCP
					})
				}
				policies = d.Resource(ClusterPolicyResource)
			}
			got, err := OtherManager(context.Background(), clientset.Wrap(c), policies, tc.node)
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

// TestRESTClusterPolicies reads ClusterPolicies as an API server serves a
// custom resource (JSON list), and keeps its NotFound when there is no CRD.
func TestRESTClusterPolicies(t *testing.T) {
	crd := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/nvidia.com/v1/clusterpolicies" || !crd {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"apiVersion":"nvidia.com/v1","kind":"ClusterPolicyList","metadata":{},"items":[
			{"apiVersion":"nvidia.com/v1","kind":"ClusterPolicy","metadata":{"name":"cluster-policy"},"spec":{"migManager":{"enabled":true}}}]}`))
	}))
	defer srv.Close()
	c, err := restclient.New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	got, err := operatorMigManagerEnabled(context.Background(), RESTClusterPolicies(c))
	if err != nil || !strings.Contains(got, "ClusterPolicy cluster-policy has spec.migManager.enabled=true") {
		t.Fatalf("got %q, %v", got, err)
	}
	crd = false
	if _, err := RESTClusterPolicies(c).List(context.Background(), metav1.ListOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("no CRD: %v, want NotFound", err)
	}
	if got, err := operatorMigManagerEnabled(context.Background(), RESTClusterPolicies(c)); err != nil || got != "" {
		t.Fatalf("no CRD: %q, %v", got, err)
	}
}

// dynamicMIG gives s the DynamicMIG shape of dra-driver-nvidia-gpu
// (driver.go generateCombinedResourceSlices / generateSplitResourceSlices,
// partitions.go): a counter set "gpu-<minor>-counter-set" (counters
// "memory", "memory-slice-<i>", ...) and/or devices consuming it.
func dynamicMIG(s *resourcev1.ResourceSlice, counters, consumers bool) *resourcev1.ResourceSlice {
	one := map[string]resourcev1.Counter{"memory-slice-0": {Value: resource.MustParse("1")}}
	if counters {
		s.Spec.SharedCounters = []resourcev1.CounterSet{{Name: "gpu-0-counter-set", Counters: one}}
	}
	if consumers {
		for i := range s.Spec.Devices {
			s.Spec.Devices[i].ConsumesCounters = []resourcev1.DeviceCounterConsumption{{CounterSet: "gpu-0-counter-set", Counters: one}}
		}
	}
	return s
}

// v1beta2Counters is a DynamicMIG counters slice as resource.k8s.io/v1beta2 serves it.
func v1beta2Counters() *resourcev1beta2.ResourceSlice {
	return &resourcev1beta2.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "b2"},
		Spec: resourcev1beta2.ResourceSliceSpec{Driver: NVIDIADRADriver, NodeName: ptr.To("n1"), Pool: resourcev1beta2.ResourcePool{Name: "n1"},
			SharedCounters: []resourcev1beta2.CounterSet{{Name: "gpu-0-counter-set",
				Counters: map[string]resourcev1beta2.Counter{"memory": {Value: resource.MustParse("80Gi")}}}}}}
}

// v1beta1Consumer is a DynamicMIG device as resource.k8s.io/v1beta1 serves
// it (under basic).
func v1beta1Consumer() *resourcev1beta1.ResourceSlice {
	return &resourcev1beta1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "b1"},
		Spec: resourcev1beta1.ResourceSliceSpec{Driver: NVIDIADRADriver, NodeName: "n1", Pool: resourcev1beta1.ResourcePool{Name: "n1"},
			Devices: []resourcev1beta1.Device{{Name: "gpu-0-mig-1g18gb-19-0", Basic: &resourcev1beta1.BasicDevice{
				Attributes: map[resourcev1beta1.QualifiedName]resourcev1beta1.DeviceAttribute{"type": {StringValue: ptr.To("mig")}},
				ConsumesCounters: []resourcev1beta1.DeviceCounterConsumption{{CounterSet: "gpu-0-counter-set",
					Counters: map[string]resourcev1beta1.Counter{"memory": {Value: resource.MustParse("10Gi")}}}}}}}}}
}
