package nvmlsim_test

import (
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
)

// TestDRAPluginStartSequence runs, over NewSimNVML alone, the NVML calls
// NVIDIA's DRA kubelet plugin makes when it starts, in its order, on a node
// with one GPU in MIG mode (a 3g and a 1g device) and one without:
//
//  1. its enumeration (github.com/NVIDIA/k8s-dra-driver-gpu
//     cmd/gpu-kubelet-plugin/nvlib.go: GetPerGpuAllocatableDevices,
//     getGpuInfo, getMigDevices, walkMigDevices);
//  2. the CDI spec cache warm-up for every full GPU it announces
//     (device_state.go: cdi.WarmupDevSpecCache(fullGPUuuids); cdi.go:
//     GetDeviceSpecsByUUIDCached → nvcdi GetDeviceSpecsByID of
//     github.com/NVIDIA/nvidia-container-toolkit pkg/nvcdi: lib-nvml.go
//     getDeviceSpecGeneratorsForIDs, newDeviceSpecGeneratorFromNVMLDevice;
//     full-gpu-nvml.go newFullGPUDeviceSpecGeneratorFromNVMLDevice, which
//     calls Device.GetIndex; GetDeviceSpecs through go-nvlib NewDeviceByUUID
//     and internal/platform-support/dgpu/nvml.go, the minor number and the
//     PCI bus id), inside nvcdi's Init and Shutdown;
//  3. a MIG device's CDI spec at prepare time (nvcdi mig-device-nvml.go:
//     the parent's index and the MIG device's, Device.GetIndex on both).
//
// A call the simulator lacks panics (its handles embed a nil nvml.Device):
// the real plugin did, on Device.GetIndex.
func TestDRAPluginStartSequence(t *testing.T) {
	lib, err := nvmlsim.NewSimNVML("h200x2", nvmlsim.Options{StatePath: filepath.Join(t.TempDir(), "state.json")})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(what string, ret nvml.Return) {
		t.Helper()
		if ret != nvml.SUCCESS {
			t.Fatalf("%s: %s", what, nvmlreturn.Name(ret))
		}
	}
	// The node: GPU 1 in MIG mode with a 3g and a 1g device (as mig-agent
	// leaves it), GPU 0 whole.
	ok("Init", lib.Init())
	gpu1, ret := lib.DeviceGetHandleByIndex(1)
	ok("DeviceGetHandleByIndex", ret)
	_, ret = gpu1.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	ok("SetMigMode", ret)
	for _, p := range [][2]int{{nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE}, {nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE}} {
		info, ret := gpu1.GetGpuInstanceProfileInfo(p[0])
		ok("GetGpuInstanceProfileInfo", ret)
		gi, ret := gpu1.CreateGpuInstance(&info)
		ok("CreateGpuInstance", ret)
		ci, ret := gi.GetComputeInstanceProfileInfo(p[1], nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		ok("GetComputeInstanceProfileInfo", ret)
		_, ret = gi.CreateComputeInstance(&ci)
		ok("CreateComputeInstance", ret)
	}
	ok("Shutdown", lib.Shutdown())

	// 1. The enumeration (nvlib.go), inside ensureNVML.
	ok("InitWithFlags", lib.InitWithFlags(nvml.INIT_FLAG_NO_GPUS))
	n, ret := lib.DeviceGetCount()
	ok("DeviceGetCount", ret)
	var fullGPUs []string
	migDevices := map[string]nvml.Device{}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		ok("DeviceGetHandleByIndex", ret)
		_, ret = d.GetMinorNumber()
		ok("GetMinorNumber", ret)
		uuid, ret := d.GetUUID()
		ok("GetUUID", ret)
		cur, _, ret := d.GetMigMode()
		ok("GetMigMode", ret)
		_, ret = d.GetMemoryInfo()
		ok("GetMemoryInfo", ret)
		_, ret = d.GetName()
		ok("GetName", ret)
		_, ret = d.GetArchitecture()
		ok("GetArchitecture", ret)
		_, ret = d.GetBrand()
		ok("GetBrand", ret)
		_, _, ret = d.GetCudaComputeCapability()
		ok("GetCudaComputeCapability", ret)
		_, ret = lib.SystemGetDriverVersion()
		ok("SystemGetDriverVersion", ret)
		_, ret = lib.SystemGetCudaDriverVersion()
		ok("SystemGetCudaDriverVersion", ret)
		_, ret = d.GetPciInfo()
		ok("GetPciInfo", ret)
		_, _ = d.GetAddressingMode() // NOT_SUPPORTED is taken as "none"
		for p := range nvml.GPU_INSTANCE_PROFILE_COUNT {
			info, ret := d.GetGpuInstanceProfileInfo(p)
			if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
				continue
			}
			ok("GetGpuInstanceProfileInfo", ret)
			if _, ret := d.GetGpuInstancePossiblePlacements(&info); ret != nvml.ERROR_NOT_SUPPORTED && ret != nvml.ERROR_INVALID_ARGUMENT {
				ok("GetGpuInstancePossiblePlacements", ret)
			}
		}
		if cur != nvml.DEVICE_MIG_ENABLE {
			fullGPUs = append(fullGPUs, uuid)
			continue
		}
		// getMigDevices, walkMigDevices.
		byUUID, ret := lib.DeviceGetHandleByUUID(uuid)
		ok("DeviceGetHandleByUUID", ret)
		maxDevs, ret := byUUID.GetMaxMigDeviceCount()
		ok("GetMaxMigDeviceCount", ret)
		for k := range maxDevs {
			mig, ret := byUUID.GetMigDeviceHandleByIndex(k)
			if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
				continue
			}
			ok("GetMigDeviceHandleByIndex", ret)
			giID, ret := mig.GetGpuInstanceId()
			ok("GetGpuInstanceId", ret)
			gi, ret := byUUID.GetGpuInstanceById(giID)
			ok("GetGpuInstanceById", ret)
			giInfo, ret := gi.GetInfo()
			ok("GpuInstance.GetInfo", ret)
			ciID, ret := mig.GetComputeInstanceId()
			ok("GetComputeInstanceId", ret)
			ci, ret := gi.GetComputeInstanceById(ciID)
			ok("GetComputeInstanceById", ret)
			ciInfo, ret := ci.GetInfo()
			ok("ComputeInstance.GetInfo", ret)
			migUUID, ret := mig.GetUUID()
			ok("GetUUID (MIG)", ret)
			// getMigDevices: the plugin's profile (GI profile index, CI
			// profile index) whose infos carry these ids.
			found := false
			for p := range nvml.GPU_INSTANCE_PROFILE_COUNT {
				gip, ret := byUUID.GetGpuInstanceProfileInfo(p)
				if ret != nvml.SUCCESS || gip.Id != giInfo.ProfileId {
					continue
				}
				for c := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
					cip, ret := gi.GetComputeInstanceProfileInfo(c, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
					if ret == nvml.SUCCESS && cip.Id == ciInfo.ProfileId {
						found = true
					}
				}
			}
			if !found {
				t.Fatalf("MIG device %s: no profile with GI profile %d and CI profile %d", migUUID, giInfo.ProfileId, ciInfo.ProfileId)
			}
			migDevices[migUUID] = mig
		}
	}
	ok("Shutdown", lib.Shutdown())
	if len(fullGPUs) != 1 || len(migDevices) != 2 {
		t.Fatalf("enumerated %d full GPUs and %d MIG devices, want 1 and 2", len(fullGPUs), len(migDevices))
	}

	// 2. The CDI warm-up of every full GPU (nvcdi GetDeviceSpecsByID).
	for _, uuid := range fullGPUs {
		ok("Init (nvcdi)", lib.Init())
		d, ret := lib.DeviceGetHandleByUUID(uuid)
		ok("DeviceGetHandleByUUID", ret)
		isMig, ret := d.IsMigDeviceHandle()
		ok("IsMigDeviceHandle", ret)
		if isMig {
			t.Fatalf("GPU %s is a MIG device handle", uuid)
		}
		index, ret := d.GetIndex()
		ok("GetIndex (full-gpu-nvml.go)", ret)
		byIndex, ret := lib.DeviceGetHandleByIndex(index)
		ok("DeviceGetHandleByIndex", ret)
		if u, _ := byIndex.GetUUID(); u != uuid {
			t.Errorf("GetIndex %d is GPU %s, want %s", index, u, uuid)
		}
		d, ret = lib.DeviceGetHandleByUUID(uuid) // go-nvlib NewDeviceByUUID
		ok("DeviceGetHandleByUUID", ret)
		_, ret = d.GetMinorNumber()
		ok("GetMinorNumber (dgpu)", ret)
		_, ret = d.GetPciInfo()
		ok("GetPciInfo (dgpu)", ret)
		ok("Shutdown (nvcdi)", lib.Shutdown())
	}

	// 3. A MIG device's CDI spec (nvcdi mig-device-nvml.go).
	ok("Init (nvcdi)", lib.Init())
	for uuid, mig := range migDevices {
		parent, ret := mig.GetDeviceHandleFromMigDeviceHandle()
		ok("GetDeviceHandleFromMigDeviceHandle", ret)
		pi, ret := parent.GetIndex()
		ok("GetIndex (parent)", ret)
		mi, ret := mig.GetIndex()
		ok("GetIndex (MIG device)", ret)
		again, ret := parent.GetMigDeviceHandleByIndex(mi)
		ok("GetMigDeviceHandleByIndex", ret)
		if u, _ := again.GetUUID(); pi != 1 || u != uuid {
			t.Errorf("MIG device %s: parent index %d, index %d names %s", uuid, pi, mi, u)
		}
		_, ret = parent.GetMinorNumber()
		ok("GetMinorNumber (parent)", ret)
	}
	ok("Shutdown", lib.Shutdown())
}
