package dra

import (
	"reflect"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
)

func TestPartitionableAndAnnounced(t *testing.T) {
	s := []Slice{
		{Name: "a", Driver: NVIDIADRADriver, Pool: "n1", Devices: []SliceDevice{
			{Name: "gpu-1", Type: "gpu", UUID: "GPU-1"}, {Name: "gpu-0-mig-1g18gb-19-0", Type: "mig", UUID: "MIG-a"},
			{Name: "gpu-vfio-2", Type: "vfio", UUID: "GPU-2"}}},
		{Name: "b", Driver: "example.com/gpu", CounterSets: 1, Devices: []SliceDevice{{Name: "x", Type: "mig", UUID: "MIG-x"}}},
	}
	if got := Partitionable(s); got != "" {
		t.Fatalf("Partitionable = %q for pre-created devices", got)
	}
	if got := AnnouncedUUIDs(s); !reflect.DeepEqual(got, []string{"GPU-1", "MIG-a"}) {
		t.Fatalf("AnnouncedUUIDs = %v", got)
	}
	s[0].Devices[1].ConsumesCounters = true
	if got := Partitionable(s); got == "" {
		t.Fatal("Partitionable missed a device consuming counters")
	}
}

// A claim's requests read the same from every version: v1's and v1beta2's
// under exactly, v1beta1's on the request itself; a v1beta1 request of
// alternatives (no class) is not one.
func TestClaimRequestsEveryVersion(t *testing.T) {
	sel := `device.attributes["gpu.nvidia.com"].profile == "3g.71gb"`
	want := []ClaimRequest{{Class: "mig.nvidia.com", Count: 2, Selectors: []string{sel}}, {Class: "mig.nvidia.com", All: true}}
	v1 := claimV1(&resourcev1.ResourceClaim{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
		{Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "mig.nvidia.com", Count: 2,
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: sel}}}}},
		{Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "mig.nvidia.com", AllocationMode: resourcev1.DeviceAllocationModeAll}},
		{FirstAvailable: []resourcev1.DeviceSubRequest{{DeviceClassName: "mig.nvidia.com"}}}}}}})
	v1beta2 := claimV1beta2(&resourcev1beta2.ResourceClaim{Spec: resourcev1beta2.ResourceClaimSpec{Devices: resourcev1beta2.DeviceClaim{Requests: []resourcev1beta2.DeviceRequest{
		{Exactly: &resourcev1beta2.ExactDeviceRequest{DeviceClassName: "mig.nvidia.com", Count: 2,
			Selectors: []resourcev1beta2.DeviceSelector{{CEL: &resourcev1beta2.CELDeviceSelector{Expression: sel}}}}},
		{Exactly: &resourcev1beta2.ExactDeviceRequest{DeviceClassName: "mig.nvidia.com", AllocationMode: resourcev1beta2.DeviceAllocationModeAll}}}}}})
	v1beta1 := claimV1beta1(&resourcev1beta1.ResourceClaim{Spec: resourcev1beta1.ResourceClaimSpec{Devices: resourcev1beta1.DeviceClaim{Requests: []resourcev1beta1.DeviceRequest{
		{DeviceClassName: "mig.nvidia.com", Count: 2, Selectors: []resourcev1beta1.DeviceSelector{{CEL: &resourcev1beta1.CELDeviceSelector{Expression: sel}}}},
		{DeviceClassName: "mig.nvidia.com", AllocationMode: resourcev1beta1.DeviceAllocationModeAll},
		{FirstAvailable: []resourcev1beta1.DeviceSubRequest{{DeviceClassName: "mig.nvidia.com"}}}}}}})
	for name, c := range map[string]Claim{"v1": v1, "v1beta2": v1beta2, "v1beta1": v1beta1} {
		if !reflect.DeepEqual(c.Requests, want) || c.Allocated {
			t.Errorf("%s: requests %+v, allocated %v; want %+v", name, c.Requests, c.Allocated, want)
		}
	}
}

// A v1beta2 slice reads as its v1 twin: the attributes and counters of
// its devices, its version named.
func TestSliceV1beta2ReadsAsV1(t *testing.T) {
	str := func(v string) *string { return &v }
	s := sliceV1beta2(&resourcev1beta2.ResourceSlice{Spec: resourcev1beta2.ResourceSliceSpec{Driver: NVIDIADRADriver,
		Pool: resourcev1beta2.ResourcePool{Name: "n1"}, SharedCounters: []resourcev1beta2.CounterSet{{Name: "gpu-0"}},
		Devices: []resourcev1beta2.Device{{Name: "gpu-0-mig-1g18gb-19-0",
			Attributes: map[resourcev1beta2.QualifiedName]resourcev1beta2.DeviceAttribute{
				draAttrType: {StringValue: str("mig")}, draAttrUUID: {StringValue: str("MIG-a")}, draAttrParentUUID: {StringValue: str("GPU-0")}},
			ConsumesCounters: []resourcev1beta2.DeviceCounterConsumption{{CounterSet: "gpu-0"}}}}}})
	want := Slice{Driver: NVIDIADRADriver, Pool: "n1", Version: "v1beta2", CounterSets: 1, Devices: []SliceDevice{
		{Name: "gpu-0-mig-1g18gb-19-0", Type: "mig", UUID: "MIG-a", ParentUUID: "GPU-0", ConsumesCounters: true}}}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("v1beta2 slice read as %+v, want %+v", s, want)
	}
}
