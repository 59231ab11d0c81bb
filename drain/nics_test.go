package drain

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/migagent/mig-agent/drain/podresources"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// networkOperator is what NVIDIA's Network Operator advertises on a GPU
// node beside the GPUs, under the same nvidia.com/ prefix: the host-device
// plugin's nvidia.com/hostdev, the RDMA shared device plugin's
// rdma_shared_device_a, SR-IOV pools (the operator's default resourceName
// sriov_resource, per rail with multirail).
var networkOperator = corev1.ResourceList{
	"nvidia.com/hostdev":               resource.MustParse("8"),
	"nvidia.com/rdma_shared_device_a":  resource.MustParse("63"),
	"nvidia.com/sriov_resource":        resource.MustParse("16"),
	"nvidia.com/sriov_resource_rail_0": resource.MustParse("8"),
}

// Only the device plugin's GPU resources count: nvidia.com/gpu,
// nvidia.com/mig-<profile>, and their .shared forms.
func TestIsGPUResource(t *testing.T) {
	for name, want := range map[string]bool{
		"nvidia.com/gpu": true, "nvidia.com/gpu.shared": true, "nvidia.com/mig-1g.18gb": true,
		"nvidia.com/mig-1g.18gb.shared": true, "nvidia.com/mig-1g.18gb+me": true,
		"nvidia.com/hostdev": false, "nvidia.com/rdma_shared_device_a": false, "nvidia.com/sriov_resource": false,
		"nvidia.com/gpu-rail": false, "nvidia.com/mig-": false, "nvidia.com/": false, "amd.com/gpu": false, "nvidia.com/gpus": false,
	} {
		if got := podresources.IsGPUResource(name); got != want {
			t.Errorf("IsGPUResource(%q) = %v, want %v", name, got, want)
		}
	}
}

// A node the DRA driver serves, with the Network Operator's resources in
// its allocatable, is served by DRA: no conflict with the device plugin.
// A node with the NICs alone advertises no GPU resource, so the
// allocatable wait has nothing to wait for; and beside MIG resources the
// NICs are no leftover GPU resource.
func TestNetworkOperatorResourcesAreNoGPUs(t *testing.T) {
	slice := staticSlice("n1", map[string]string{"gpu-0-mig-1g18gb-19-0": "MIG-a"})
	k := &Disruptor{Client: clientset.Wrap(fake.NewClientset(gpuNode(networkOperator), slice)), Log: testsupport.Discard(),
		Node: "n1", Settings: &settings.Settings{}}
	path, conflict, err := k.ServedBy(context.Background())
	if err != nil || path != record.ServedByDRA || conflict != "" {
		t.Fatalf("ServedBy = %q, %q, %v; want dra, no conflict", path, conflict, err)
	}
	k = &Disruptor{Client: clientset.Wrap(fake.NewClientset(gpuNode(networkOperator))), Log: testsupport.Discard(),
		Node: "n1", Settings: &settings.Settings{}}
	if path, _, _ := k.ServedBy(context.Background()); path != "" {
		t.Errorf("a node with NICs alone is served by %q", path)
	}
	node := gpuNode(networkOperator)
	node.Status.Capacity = networkOperator
	if advertisesGPU(node) {
		t.Error("the Network Operator's resources count as a device plugin's GPU resources")
	}
	have := networkOperator.DeepCopy()
	have["nvidia.com/mig-1g.18gb"] = resource.MustParse("7")
	want := map[corev1.ResourceName]int64{"nvidia.com/mig-1g.18gb": 7}
	if miss := missingResources(have, want); len(miss) != 0 {
		t.Errorf("missingResources = %v", miss)
	}
	if miss := matchShared(have, want, nil); len(miss) != 0 {
		t.Errorf("matchShared = %v", miss)
	}
	// A pod on the NICs alone requests no GPU, and holds no GPU device.
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{"nvidia.com/hostdev": resource.MustParse("1"), "nvidia.com/rdma_shared_device_a": resource.MustParse("1")}}}}}}
	if podresources.RequestsGPU(pod) {
		t.Error("a pod on the NICs requests a GPU")
	}
	pr := podresources.Pod{Namespace: "ml", Name: "p", Containers: []podresources.Container{{Name: "c", Devices: map[string][]string{
		"nvidia.com/hostdev": {"0000:17:00.1"}, "nvidia.com/mig-1g.18gb": {"MIG-a"}}}}}
	if ids := pr.GPUDeviceIDs(); strings.Join(ids, ",") != "MIG-a" {
		t.Errorf("GPUDeviceIDs = %v", ids)
	}
}
