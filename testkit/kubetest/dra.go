package kubetest

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"
)

// The kubelet's DRA side, as far as PodResources shows it: before a pod's
// containers start, the kubelet prepares the ResourceClaims they use with
// their drivers (NodePrepareResources) and caches what each driver answered;
// PodResources List and Get report that cache per container as
// dynamic_resources.

// nvidiaDRADriver is the NVIDIA DRA driver (DriverName in
// dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/main.go).
const nvidiaDRADriver = "gpu.nvidia.com"

// preparedClaim is one claim of a container as the kubelet's claim-info
// cache holds it after NodePrepareResources.
type preparedClaim struct {
	name, namespace string
	drivers         []preparedDriver
}

// preparedDriver is one driver's answer for a claim: its devices in the
// order of the claim's allocation results.
type preparedDriver struct {
	driver  string
	devices []preparedDevice
}

type preparedDevice struct {
	pool, device string
	cdi          []string
}

// PrepareClaims prepares pod's ResourceClaims as the kubelet does before
// starting its containers, and registers them in PodResources. For each
// container, only the pod claims it names in resources.claims count
// (kubernetes pkg/kubelet/cm/dra/manager.go GetContainerClaimInfos); a
// claim's name is spec.resourceClaims[].resourceClaimName, or for a
// template the name the ResourceClaim controller wrote in
// status.resourceClaimStatuses (k8s.io/dynamic-resource-allocation
// resourceclaim.Name). The claim must be allocated and reserved for the pod
// (manager.go prepareResources refuses otherwise: "pod ... is not allowed
// to use resource claim"). Each driver's devices are its allocation results
// (the NVIDIA driver answers with result.Pool and result.Device and CDI
// device "k8s.gpu.nvidia.com/claim=<claim UID>-<device>",
// cmd/gpu-kubelet-plugin/device_state.go and cdi.go).
func (k *Kubelet) PrepareClaims(t TB, pod *corev1.Pod) {
	t.Helper()
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	prepared := map[string]preparedClaim{} // by pod claim name
	for _, pc := range pod.Spec.ResourceClaims {
		name, err := claimName(pod, pc)
		if err != nil {
			t.Fatalf("PrepareClaims %s: %v", key, err)
		}
		claim, err := k.client.ResourceV1().ResourceClaims(pod.Namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("PrepareClaims %s: unable to get ResourceClaim %s: %v", key, name, err)
		}
		if claim.Status.Allocation == nil || !slices.ContainsFunc(claim.Status.ReservedFor, func(r resourcev1.ResourceClaimConsumerReference) bool {
			return r.Resource == "pods" && r.UID == pod.UID
		}) {
			t.Fatalf("PrepareClaims: pod %s (%s) is not allowed to use resource claim %s", key, pod.UID, name)
		}
		prepared[pc.Name] = prepareClaim(claim)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.claims[key] == nil {
		k.claims[key] = map[string][]preparedClaim{}
	}
	for _, c := range pod.Spec.Containers {
		if k.pods[key] == nil {
			k.pods[key] = map[string]map[string][]string{}
		}
		if k.pods[key][c.Name] == nil {
			k.pods[key][c.Name] = map[string][]string{}
		}
		for _, rc := range c.Resources.Claims {
			if p, ok := prepared[rc.Name]; ok {
				k.claims[key][c.Name] = append(k.claims[key][c.Name], p)
			}
		}
	}
}

// claimName resolves a pod's claim to its ResourceClaim's name.
func claimName(pod *corev1.Pod, pc corev1.PodResourceClaim) (string, error) {
	if pc.ResourceClaimName != nil {
		return *pc.ResourceClaimName, nil
	}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.Name == pc.Name && st.ResourceClaimName != nil {
			return *st.ResourceClaimName, nil
		}
	}
	return "", fmt.Errorf("pod claim %s: no ResourceClaim created for it yet", pc.Name)
}

// prepareClaim groups a claim's allocation results by driver, as the
// kubelet calls each driver with its part.
func prepareClaim(claim *resourcev1.ResourceClaim) preparedClaim {
	out := preparedClaim{name: claim.Name, namespace: claim.Namespace}
	for _, r := range claim.Status.Allocation.Devices.Results {
		i := slices.IndexFunc(out.drivers, func(d preparedDriver) bool { return d.driver == r.Driver })
		if i < 0 {
			out.drivers = append(out.drivers, preparedDriver{driver: r.Driver})
			i = len(out.drivers) - 1
		}
		dev := preparedDevice{pool: r.Pool, device: r.Device}
		if r.Driver == nvidiaDRADriver {
			dev.cdi = []string{"k8s." + nvidiaDRADriver + "/claim=" + string(claim.UID) + "-" + r.Device}
		}
		out.drivers[i].devices = append(out.drivers[i].devices, dev)
	}
	return out
}

// dynamicResourcesOf builds PodResources dynamic_resources as the kubelet's
// GetDynamicResources does (kubernetes
// pkg/kubelet/cm/container_manager_linux.go): one DynamicResource per
// claim, one ClaimResource per device of each driver. Its CDI list is
// declared per driver, not per device, so a driver's later devices also
// list the earlier devices' CDI names: kept here as the kubelet does it.
func dynamicResourcesOf(claims []preparedClaim) []*podresourcesv1.DynamicResource {
	var out []*podresourcesv1.DynamicResource
	for _, c := range claims {
		dr := &podresourcesv1.DynamicResource{ClaimName: c.name, ClaimNamespace: c.namespace}
		for _, d := range c.drivers {
			var cdi []*podresourcesv1.CDIDevice
			for _, dev := range d.devices {
				for _, id := range dev.cdi {
					cdi = append(cdi, &podresourcesv1.CDIDevice{Name: id})
				}
				dr.ClaimResources = append(dr.ClaimResources, &podresourcesv1.ClaimResource{
					CdiDevices: slices.Clone(cdi), DriverName: d.driver, PoolName: dev.pool, DeviceName: dev.device})
			}
		}
		out = append(out, dr)
	}
	return out
}

// AllocatedDevice is one device of a claim's allocation.
type AllocatedDevice struct{ Driver, Pool, Device string }

// AllocateClaim creates ResourceClaim ns/name (one exact request "r" for
// deviceClass) and writes its status as the scheduler's DynamicResources
// plugin does when it binds pod: status.allocation.devices.results with
// the devices, status.reservedFor the pod (kubernetes
// pkg/scheduler/framework/plugins/dynamicresources, PreBind). Then the
// kubelet may prepare it (PrepareClaims).
func AllocateClaim(t TB, client kubernetes.Interface, ns, name, deviceClass string, pod *corev1.Pod, devices ...AllocatedDevice) *resourcev1.ResourceClaim {
	t.Helper()
	ctx := context.Background()
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "r", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: deviceClass, Count: int64(len(devices))}}}}}}
	created, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("AllocateClaim %s/%s: %v", ns, name, err)
	}
	created.Status.Allocation = &resourcev1.AllocationResult{}
	for _, d := range devices {
		created.Status.Allocation.Devices.Results = append(created.Status.Allocation.Devices.Results,
			resourcev1.DeviceRequestAllocationResult{Request: "r", Driver: d.Driver, Pool: d.Pool, Device: d.Device})
	}
	created.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	out, err := client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("AllocateClaim %s/%s: status: %v", ns, name, err)
	}
	return out
}

// NVIDIADevice is one device as the NVIDIA DRA driver announces it without
// DynamicMIG: its canonical name ("gpu-<minor>" or
// "gpu-<minor>-mig-<profile>-<profile id>-<placement start>") and UUID.
// Attributes and Capacity, when set (nvidiadra.Details), are published
// besides the type, uuid, parentUUID and profile attributes.
type NVIDIADevice struct {
	Name, UUID, ParentUUID, Profile string
	Attributes                      map[resourcev1.QualifiedName]resourcev1.DeviceAttribute
	Capacity                        map[resourcev1.QualifiedName]resourcev1.DeviceCapacity
}

// PublishNVIDIASlice creates the one ResourceSlice the NVIDIA DRA driver
// publishes for node without DynamicMIG (dra-driver-nvidia-gpu
// cmd/gpu-kubelet-plugin/driver.go publishResources, through
// k8s.io/dynamic-resource-allocation resourceslice with a Node owner: pool
// and spec.nodeName named after the node, generated name
// "00000-gpu.nvidia.com-<node>-"), with the type, uuid, parentUUID and
// profile attributes of deviceinfo.go. It is deleted when the test ends.
func PublishNVIDIASlice(t TB, client kubernetes.Interface, node string, devices ...NVIDIADevice) *resourcev1.ResourceSlice {
	t.Helper()
	ctx := context.Background()
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("PublishNVIDIASlice: %v", err)
	}
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "00000-" + nvidiaDRADriver + "-" + node + "-",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: n.UID, Controller: ptr.To(true)}}},
		Spec: resourcev1.ResourceSliceSpec{Driver: nvidiaDRADriver, NodeName: ptr.To(node),
			Pool: resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1}},
	}
	s.Spec.Devices = apiDevices(devices)
	out, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("PublishNVIDIASlice: %v", err)
	}
	t.Cleanup(func() {
		_ = client.ResourceV1().ResourceSlices().Delete(context.Background(), out.Name, metav1.DeleteOptions{})
	})
	return out
}

// DynamicMIGSlices are the ResourceSlices of node as the NVIDIA DRA driver
// publishes them with its DynamicMIG feature gate on, for one GPU, in the
// split form it uses on Kubernetes 1.35 and later (driver.go
// generateSplitResourceSlices; the API server refuses counters and devices
// in one slice): slice 0 holds only the counter set "gpu-0-counter-set"
// (partitions.go: the GPU's memory slices), slice 1 the whole GPU and a MIG
// device that may be made on it, both consuming those counters, neither with
// a uuid (a DynamicMIG device does not exist until allocated). Their names
// are name-0 and name-1.
func DynamicMIGSlices(node, name string) []*resourcev1.ResourceSlice {
	counters := func(slices ...int) map[string]resourcev1.Counter {
		m := map[string]resourcev1.Counter{}
		for _, i := range slices {
			m[fmt.Sprintf("memory-slice-%d", i)] = resourcev1.Counter{Value: resource.MustParse("1")}
		}
		return m
	}
	all := counters(0, 1, 2, 3, 4, 5, 6, 7)
	str := func(v string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: ptr.To(v)} }
	pool := resourcev1.ResourcePool{Name: node, ResourceSliceCount: 2}
	return []*resourcev1.ResourceSlice{
		{ObjectMeta: metav1.ObjectMeta{Name: name + "-0"}, Spec: resourcev1.ResourceSliceSpec{
			Driver: nvidiaDRADriver, NodeName: ptr.To(node), Pool: pool,
			SharedCounters: []resourcev1.CounterSet{{Name: "gpu-0-counter-set", Counters: all}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: name + "-1"}, Spec: resourcev1.ResourceSliceSpec{
			Driver: nvidiaDRADriver, NodeName: ptr.To(node), Pool: pool,
			Devices: []resourcev1.Device{
				{Name: "gpu-0", Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"type": str("gpu")},
					ConsumesCounters: []resourcev1.DeviceCounterConsumption{{CounterSet: "gpu-0-counter-set", Counters: all}}},
				{Name: "gpu-0-mig-1g18gb-19-0", Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"type": str("mig"), "profile": str("1g.18gb")},
					ConsumesCounters: []resourcev1.DeviceCounterConsumption{{CounterSet: "gpu-0-counter-set", Counters: counters(0)}}},
			}}},
	}
}

// CreateSlices creates slices (deleted when the test ends) and returns them
// as created.
func CreateSlices(t TB, client kubernetes.Interface, slices ...*resourcev1.ResourceSlice) []*resourcev1.ResourceSlice {
	t.Helper()
	var out []*resourcev1.ResourceSlice
	for _, s := range slices {
		c, err := client.ResourceV1().ResourceSlices().Create(context.Background(), s, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create ResourceSlice %s: %v", s.Name, err)
		}
		t.Cleanup(func() {
			_ = client.ResourceV1().ResourceSlices().Delete(context.Background(), c.Name, metav1.DeleteOptions{})
		})
		out = append(out, c)
	}
	return out
}
