package nvmlsim_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// TestNewSimNVML drives the library NewSimNVML gives as an external tool
// does (NVIDIA's mig-parted with its nvml.New pointed here): only
// nvml.Interface calls, from Init to Shutdown, on a state file a mig-agent
// shares.
func TestNewSimNVML(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	var lib nvml.Interface
	lib, err := nvmlsim.NewSimNVML("h200x2", nvmlsim.Options{StatePath: path})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(what string, ret nvml.Return) {
		t.Helper()
		if ret != nvml.SUCCESS {
			t.Fatalf("%s: %s", what, nvmlreturn.Name(ret))
		}
	}
	// Like libnvidia-ml, it is not initialized until Init.
	if _, ret := lib.DeviceGetCount(); ret != nvml.ERROR_UNINITIALIZED {
		t.Fatalf("DeviceGetCount before Init: %s, want ERROR_UNINITIALIZED", nvmlreturn.Name(ret))
	}
	ok("Init", lib.Init())
	v, ret := lib.SystemGetDriverVersion()
	ok("SystemGetDriverVersion", ret)
	if v != nvmlsim.DriverVersion {
		t.Errorf("driver %q, want %q", v, nvmlsim.DriverVersion)
	}
	n, ret := lib.DeviceGetCount()
	ok("DeviceGetCount", ret)
	if n != 2 {
		t.Fatalf("%d GPUs, want 2", n)
	}
	dev, ret := lib.DeviceGetHandleByIndex(1)
	ok("DeviceGetHandleByIndex", ret)
	uuid, ret := dev.GetUUID()
	ok("GetUUID", ret)
	if !strings.HasPrefix(uuid, "GPU-") {
		t.Errorf("UUID %q", uuid)
	}
	byUUID, ret := lib.DeviceGetHandleByUUID(uuid)
	ok("DeviceGetHandleByUUID", ret)
	if u, _ := byUUID.GetUUID(); u != uuid {
		t.Errorf("handle by UUID is GPU %s, want %s", u, uuid)
	}
	if cur, pend, ret := dev.GetMigMode(); ret != nvml.SUCCESS || cur != nvml.DEVICE_MIG_DISABLE || pend != nvml.DEVICE_MIG_DISABLE {
		t.Fatalf("MIG mode at start: %d/%d %s", cur, pend, nvmlreturn.Name(ret))
	}
	act, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	ok("SetMigMode", ret)
	ok("SetMigMode activation (Hopper: at once)", act)
	if cur, pend, _ := dev.GetMigMode(); cur != nvml.DEVICE_MIG_ENABLE || pend != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("MIG mode after enable: %d/%d", cur, pend)
	}

	// A 3g GPU instance placed by the driver, then its full compute instance.
	info, ret := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	ok("GetGpuInstanceProfileInfo", ret)
	gi, ret := dev.CreateGpuInstance(&info)
	ok("CreateGpuInstance", ret)
	giInfo, ret := gi.GetInfo()
	ok("GpuInstance.GetInfo", ret)
	if giInfo.ProfileId != info.Id || giInfo.Placement.Size != 4 {
		t.Errorf("GPU instance %+v, want profile %d on 4 slices", giInfo, info.Id)
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	ok("GetComputeInstanceProfileInfo", ret)
	ci, ret := gi.CreateComputeInstance(&ciInfo)
	ok("CreateComputeInstance", ret)
	if _, ret := ci.GetInfo(); ret != nvml.SUCCESS {
		t.Errorf("ComputeInstance.GetInfo: %s", nvmlreturn.Name(ret))
	}
	gis, ret := dev.GetGpuInstances(&info)
	ok("GetGpuInstances", ret)
	if len(gis) != 1 {
		t.Errorf("%d GPU instances of the profile, want 1", len(gis))
	}
	// The MIG device the compute instance is, as the DRA plugin walks it.
	mig, ret := dev.GetMigDeviceHandleByIndex(0)
	ok("GetMigDeviceHandleByIndex", ret)
	migUUID, ret := mig.GetUUID()
	ok("MIG GetUUID", ret)
	if !strings.HasPrefix(migUUID, "MIG-") {
		t.Errorf("MIG device UUID %q", migUUID)
	}
	ok("Shutdown", lib.Shutdown())

	// A mig-agent on the same state sees what the tool made.
	s := testsupport.NewSim(t, "h200x2", nvmlsim.Options{StatePath: path})
	insts, err := s.Instances(1)
	if err != nil {
		t.Fatal(err)
	}
	if len(insts) != 1 || insts[0].Profile != "3g.71gb" || len(insts[0].ComputeInstances) != 1 ||
		insts[0].ComputeInstances[0].UUID != migUUID {
		t.Errorf("mig-agent sees %+v, want the tool's 3g.71gb with MIG device %s", insts, migUUID)
	}
	if m := s.Mutations(); len(m) != 0 {
		t.Errorf("the mig-agent's own mutations %v, want none", m)
	}
}
