package nvidiadra

import (
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// The stand-in publishes what NVIDIA's plugin publishes, read through NVML
// (the simulator here): the GPU's attributes on a whole GPU and on a MIG
// device, a whole GPU's memory, a MIG device's profile capacities and its
// memory slices.
func TestDetails(t *testing.T) {
	lib, err := nvmlsim.NewSimNVML("h200x2", nvmlsim.Options{StatePath: filepath.Join(t.TempDir(), "state.json")})
	if err != nil {
		t.Fatal(err)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gpu0, _ := lib.DeviceGetHandleByIndex(0)
	gpu1, _ := lib.DeviceGetHandleByIndex(1)
	u0, _ := gpu0.GetUUID()
	u1, _ := gpu1.GetUUID()
	gpu1.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	info, _ := gpu1.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	gi, ret := gpu1.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 4, Size: 4})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ci, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
	gi.CreateComputeInstance(&ci)
	mig, _ := gpu1.GetMigDeviceHandleByIndex(0)
	mu, _ := mig.GetUUID()
	lib.Shutdown()

	devs := []kubetest.NVIDIADevice{{Name: "gpu-0", UUID: u0}, {Name: "gpu-1-mig-3g71gb-9-4", UUID: mu, ParentUUID: u1, Profile: "3g.71gb"}}
	if err := Details(lib, devs); err != nil {
		t.Fatal(err)
	}
	// As the stand-in publishes them (kubetest apiDevices adds type,
	// uuid, parentUUID and profile).
	api := make([]resourcev1.Device, len(devs))
	for i, d := range devs {
		api[i] = resourcev1.Device{Name: d.Name, Attributes: d.Attributes, Capacity: d.Capacity}
	}
	s := func(d resourcev1.Device, a string) string {
		v := d.Attributes[resourcev1.QualifiedName(a)]
		if v.StringValue != nil {
			return *v.StringValue
		}
		if v.VersionValue != nil {
			return *v.VersionValue
		}
		return "<none>"
	}
	c := func(d resourcev1.Device, n string) int64 {
		q, ok := d.Capacity[resourcev1.QualifiedName(n)]
		if !ok {
			return -1
		}
		return q.Value.Value()
	}
	for _, d := range api {
		for a, want := range map[string]string{"productName": "NVIDIA H200", "brand": "Nvidia", "architecture": "Hopper",
			"cudaComputeCapability": "9.0.0", "driverVersion": "580.159.4", "cudaDriverVersion": "13.0.0"} {
			if got := s(d, a); got != want {
				t.Errorf("%s %s = %q, want %q", d.Name, a, got, want)
			}
		}
	}
	if got := s(api[0], "resource.kubernetes.io/pciBusID"); got != "0000:10:00.0" {
		t.Errorf("gpu-0: pciBusID %q", got)
	}
	if got := c(api[0], "memory"); got != 150754820096 {
		t.Errorf("gpu-0 memory %d", got)
	}
	m := api[1]
	if s(m, "resource.kubernetes.io/pciBusID") != "0000:11:00.0" {
		t.Errorf("MIG device attributes %v", m.Attributes)
	}
	for n, want := range map[string]int64{"multiprocessors": int64(info.MultiprocessorCount), "copyEngines": int64(info.CopyEngineCount),
		"decoders": int64(info.DecoderCount), "encoders": int64(info.EncoderCount), "jpegEngines": int64(info.JpegCount),
		"ofaEngines": int64(info.OfaCount), "memory": int64(info.MemorySizeMB) << 20,
		"memorySlice3": -1, "memorySlice4": 1, "memorySlice7": 1, "memorySlice8": -1} {
		if got := c(m, n); got != want {
			t.Errorf("MIG device capacity %s = %d, want %d", n, got, want)
		}
	}
	if info.MultiprocessorCount == 0 {
		t.Error("the simulator gives the 3g profile no multiprocessors")
	}
}
