package drain

import (
	"context"
	"reflect"
	"testing"

	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// staticSlice is the one ResourceSlice the NVIDIA DRA driver publishes for
// node without DynamicMIG (publishResources in dra-driver-nvidia-gpu
// cmd/gpu-kubelet-plugin/driver.go: pool named after the node), with the
// type and uuid attributes of deviceinfo.go. devs: name → uuid.
func staticSlice(node string, devs map[string]string) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "00000-gpu.nvidia.com-" + node + "-x"},
		Spec: resourcev1.ResourceSliceSpec{Driver: dra.NVIDIADRADriver, NodeName: ptr.To(node),
			Pool: resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1}}}
	for name, uuid := range devs {
		typ := dra.DRATypeMIG
		if uuid[:4] == "GPU-" {
			typ = dra.DRATypeGPU
		}
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: name, Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"type": {StringValue: ptr.To(typ)}, "uuid": {StringValue: ptr.To(uuid)}}})
	}
	return s
}

// allocated is a ResourceClaim as the scheduler leaves it: status.allocation
// with the devices, status.reservedFor the pod.
func allocated(ns, name, pod, pool string, devices ...string) *resourcev1.ResourceClaim {
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	c.Status.Allocation = &resourcev1.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourcev1.DeviceRequestAllocationResult{Request: "mig", Driver: dra.NVIDIADRADriver, Pool: pool, Device: d})
	}
	if pod != "" {
		c.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: types.UID(pod)}}
	}
	return c
}

func runningPod(ns, name, node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name)},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

// TestFindAffectedClaimsWithoutPodResources: PodResources unreadable, the
// pods reserved by claims on devices that go count, the others do not.
func TestFindAffectedClaimsWithoutPodResources(t *testing.T) {
	objs := []runtime.Object{
		staticSlice("n1", map[string]string{"gpu-0-mig-1g18gb-19-0": "MIG-gone", "gpu-0-mig-1g18gb-19-1": "MIG-stays", "gpu-1": "GPU-1"}),
		runningPod("w", "on-gone", "n1"), allocated("w", "c1", "on-gone", "n1", "gpu-0-mig-1g18gb-19-0"),
		runningPod("w", "on-stays", "n1"), allocated("w", "c2", "on-stays", "n1", "gpu-0-mig-1g18gb-19-1"),
		runningPod("w", "whole", "n1"), allocated("w", "c3", "whole", "n1", "gpu-1"),
		// A device the slices do not know: taken away, to be safe.
		runningPod("w", "unknown", "n1"), allocated("w", "c4", "unknown", "n1", "gpu-0-mig-3g71gb-9-4"),
		// Another node's pool, and a pod elsewhere.
		runningPod("w", "elsewhere", "n2"), allocated("w", "c5", "elsewhere", "n2", "gpu-0-mig-1g18gb-19-0"),
		// Allocated, not reserved: no pod holds it.
		allocated("w", "c6", "", "n1", "gpu-0-mig-1g18gb-19-0"),
		// Reserved for a pod that finished.
		func() *corev1.Pod { p := runningPod("w", "done", "n1"); p.Status.Phase = corev1.PodSucceeded; return p }(),
		allocated("w", "c7", "done", "n1", "gpu-0-mig-1g18gb-19-0"),
	}
	for _, tc := range []struct {
		name   string
		change deviceChange
		want   []string
	}{
		{"MIG device goes", deviceChange{MIGDevices: []string{"MIG-gone"}}, []string{"w/on-gone", "w/unknown"}},
		{"whole GPU changes", deviceChange{GPUs: []string{"GPU-1"}}, []string{"w/unknown", "w/whole"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(objs...)
			a, err := findAffected(context.Background(), clientset.Wrap(c), testsupport.Discard(), "n1", "", tc.change)
			if err != nil {
				t.Fatal(err)
			}
			if !a.FellBack() || !reflect.DeepEqual(a.Names(), tc.want) {
				t.Fatalf("FindAffected = %v by %q, want %v by the fallback", a.Names(), a.How, tc.want)
			}
		})
	}
}

// TestFindAffectedClaimsOlderAPI: a cluster serving only
// resource.k8s.io/v1beta1 (Kubernetes 1.32, 1.33) is read the same way.
func TestFindAffectedClaimsOlderAPI(t *testing.T) {
	slice := &resourcev1beta1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Spec: resourcev1beta1.ResourceSliceSpec{Driver: dra.NVIDIADRADriver, NodeName: "n1", Pool: resourcev1beta1.ResourcePool{Name: "n1"},
			Devices: []resourcev1beta1.Device{{Name: "gpu-0-mig-1g18gb-19-0", Basic: &resourcev1beta1.BasicDevice{
				Attributes: map[resourcev1beta1.QualifiedName]resourcev1beta1.DeviceAttribute{
					"type": {StringValue: ptr.To("mig")}, "uuid": {StringValue: ptr.To("MIG-gone")}}}}}}}
	claim := &resourcev1beta1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "w", Name: "c"},
		Status: resourcev1beta1.ResourceClaimStatus{
			Allocation: &resourcev1beta1.AllocationResult{Devices: resourcev1beta1.DeviceAllocationResult{
				Results: []resourcev1beta1.DeviceRequestAllocationResult{{Request: "r", Driver: dra.NVIDIADRADriver, Pool: "n1", Device: "gpu-0-mig-1g18gb-19-0"}}}},
			ReservedFor: []resourcev1beta1.ResourceClaimConsumerReference{{Resource: "pods", Name: "p"}}}}
	c := fake.NewClientset(slice, claim, runningPod("w", "p", "n1"))
	notServed := func(a k8stesting.Action) (bool, runtime.Object, error) {
		if v := a.GetResource().Version; v == "v1" || v == "v1beta2" {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: a.GetResource().Resource}, "")
		}
		return false, nil, nil
	}
	c.PrependReactor("list", "resourceslices", notServed)
	c.PrependReactor("list", "resourceclaims", notServed)
	a, err := findAffected(context.Background(), clientset.Wrap(c), testsupport.Discard(), "n1", "", deviceChange{MIGDevices: []string{"MIG-gone"}})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Names(), []string{"w/p"}) {
		t.Fatalf("FindAffected = %v, want [w/p]", a.Names())
	}
	a, err = findAffected(context.Background(), clientset.Wrap(c), testsupport.Discard(), "n1", "", deviceChange{MIGDevices: []string{"MIG-other"}})
	if err != nil || len(a.Pods) != 0 {
		t.Fatalf("FindAffected = %v, %v; want none", a.Names(), err)
	}
}

// TestFindAffectedClaimsUnreadable: an API error reading claims fails the
// search (the caller retries) instead of leaving claim holders out.
func TestFindAffectedClaimsUnreadable(t *testing.T) {
	c := fake.NewClientset()
	c.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("down")
	})
	if _, err := findAffected(context.Background(), clientset.Wrap(c), testsupport.Discard(), "n1", "", deviceChange{MIGDevices: []string{"MIG-x"}}); err == nil {
		t.Fatal("FindAffected succeeded without the claims")
	}
}
