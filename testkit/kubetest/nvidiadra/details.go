// Package nvidiadra reads, through NVML, what NVIDIA's DRA driver publishes
// about each device besides its name and UUID: the attributes and
// capacities of the kubetest DRA stand-in (kubetest.StartDRAPlugin).
package nvidiadra

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/testkit/kubetest"
)

// Details fills in devs the attributes and capacities NVIDIA's DRA
// driver publishes for them without DynamicMIG, read through lib (the
// simulator, or NVML) the way its kubelet plugin reads them
// (github.com/NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin):
//
//   - every device (deviceinfo.go GpuInfo.Attributes; mig.go
//     CommonAttributesMig for a MIG device, from its parent): productName
//     (GetName), brand and architecture (go-nvlib GetBrandAsString,
//     GetArchitectureAsString), cudaComputeCapability, driverVersion and
//     cudaDriverVersion as versions (Masterminds semver, leading zeros
//     coerced: "580.159.04" is 580.159.4), and resource.kubernetes.io/pciBusID
//     (k8s.io/dynamic-resource-allocation deviceattribute
//     GetPCIBusIDAttribute; go-nvlib GetPCIBusID: lower case, the 8-digit
//     domain cut to 4). No pcieRoot (sysfs, absent here: the plugin goes on
//     without it) and no addressingMode (NOT_SUPPORTED on these GPUs);
//   - a whole GPU's capacity memory, its total bytes (partitions.go
//     fullGpuCapacity);
//   - a MIG device's capacities from its GPU instance profile (mig.go
//     CommonCapacitiesMig: multiprocessors, copyEngines, decoders, encoders,
//     jpegEngines, ofaEngines, memory in bytes of MiB) and memorySliceN, 1
//     for each memory slice of its placement (deviceinfo.go
//     MigDeviceInfo.GetDevice).
func Details(lib nvml.Interface, devs []kubetest.NVIDIADevice) error {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml Init: %v", ret)
	}
	defer lib.Shutdown()
	driver, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("SystemGetDriverVersion: %v", ret)
	}
	cuda, ret := lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("SystemGetCudaDriverVersion: %v", ret)
	}
	for i := range devs {
		d := &devs[i]
		gpuUUID := d.UUID
		if d.ParentUUID != "" {
			gpuUUID = d.ParentUUID
		}
		gpu, ret := lib.DeviceGetHandleByUUID(gpuUUID)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("DeviceGetHandleByUUID %s: %v", gpuUUID, ret)
		}
		attrs, err := gpuAttributes(gpu, driver, fmt.Sprintf("%d.%d", cuda/1000, cuda%1000/10))
		if err != nil {
			return fmt.Errorf("GPU %s: %w", gpuUUID, err)
		}
		d.Attributes, d.Capacity = attrs, map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{}
		if d.ParentUUID == "" {
			mem, ret := gpu.GetMemoryInfo()
			if ret != nvml.SUCCESS {
				return fmt.Errorf("GetMemoryInfo %s: %v", gpuUUID, ret)
			}
			d.Capacity["memory"] = quantity(int64(mem.Total))
			continue
		}
		if err := migCapacity(gpu, d); err != nil {
			return fmt.Errorf("MIG device %s: %w", d.UUID, err)
		}
	}
	return nil
}

// gpuAttributes are the attributes of a GPU and of its MIG devices.
func gpuAttributes(gpu nvml.Device, driver, cuda string) (map[resourcev1.QualifiedName]resourcev1.DeviceAttribute, error) {
	name, ret := gpu.GetName()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GetName: %v", ret)
	}
	arch, ret := gpu.GetArchitecture()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GetArchitecture: %v", ret)
	}
	brand, ret := gpu.GetBrand()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GetBrand: %v", ret)
	}
	major, minor, ret := gpu.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GetCudaComputeCapability: %v", ret)
	}
	pci, ret := gpu.GetPciInfo()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GetPciInfo: %v", ret)
	}
	var bus []byte
	for _, c := range pci.BusId {
		if c == 0 {
			break
		}
		bus = append(bus, byte(c))
	}
	busID := strings.ToLower(string(bus))
	if len(busID) == len("00000000:00:00.0") && strings.HasPrefix(busID, "0000") {
		busID = strings.TrimPrefix(busID, "0000")
	}
	str := func(v string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: ptr.To(v)} }
	ver := func(v string) resourcev1.DeviceAttribute {
		return resourcev1.DeviceAttribute{VersionValue: ptr.To(semver(v))}
	}
	return map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		"productName":                     str(name),
		"brand":                           str(brandNames[brand]),
		"architecture":                    str(archNames[arch]),
		"cudaComputeCapability":           ver(fmt.Sprintf("%d.%d", major, minor)),
		"driverVersion":                   ver(driver),
		"cudaDriverVersion":               ver(cuda),
		"resource.kubernetes.io/pciBusID": str(busID),
	}, nil
}

// migCapacity sets d's capacities from its GPU instance, found among gpu's
// MIG devices by UUID.
func migCapacity(gpu nvml.Device, d *kubetest.NVIDIADevice) error {
	n, ret := gpu.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GetMaxMigDeviceCount: %v", ret)
	}
	for k := range n {
		mig, ret := gpu.GetMigDeviceHandleByIndex(k)
		if ret != nvml.SUCCESS {
			continue
		}
		if u, _ := mig.GetUUID(); u != d.UUID {
			continue
		}
		giID, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GetGpuInstanceId: %v", ret)
		}
		gi, ret := gpu.GetGpuInstanceById(giID)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GetGpuInstanceById: %v", ret)
		}
		info, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GpuInstance.GetInfo: %v", ret)
		}
		for idx := range nvml.GPU_INSTANCE_PROFILE_COUNT {
			p, ret := gpu.GetGpuInstanceProfileInfo(idx)
			if ret != nvml.SUCCESS || p.Id != info.ProfileId {
				continue
			}
			for name, v := range map[resourcev1.QualifiedName]int64{
				"multiprocessors": int64(p.MultiprocessorCount), "copyEngines": int64(p.CopyEngineCount),
				"decoders": int64(p.DecoderCount), "encoders": int64(p.EncoderCount), "jpegEngines": int64(p.JpegCount),
				"ofaEngines": int64(p.OfaCount), "memory": int64(p.MemorySizeMB * 1024 * 1024),
			} {
				d.Capacity[name] = quantity(v)
			}
			for s := info.Placement.Start; s < info.Placement.Start+info.Placement.Size; s++ {
				d.Capacity[resourcev1.QualifiedName(fmt.Sprintf("memorySlice%d", s))] = quantity(1)
			}
			return nil
		}
		return fmt.Errorf("no GPU instance profile with id %d", info.ProfileId)
	}
	return fmt.Errorf("not among the MIG devices of its GPU")
}

func quantity(v int64) resourcev1.DeviceCapacity {
	return resourcev1.DeviceCapacity{Value: *resource.NewQuantity(v, resource.BinarySI)}
}

// semver is Masterminds semver's NewVersion(v).String() for the plugin's
// dotted numbers: up to three segments, leading zeros coerced, missing ones
// 0 ("9.0" is 9.0.0, "580.159.04" 580.159.4).
func semver(v string) string {
	parts := strings.SplitN(v, ".", 3)
	out := []string{"0", "0", "0"}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return v
		}
		out[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(out, ".")
}

// archNames and brandNames are go-nvlib's GetArchitectureAsString and
// GetBrandAsString (pkg/nvlib/device/device.go), for the GPUs simulated.
var (
	archNames = map[nvml.DeviceArchitecture]string{
		nvml.DEVICE_ARCH_AMPERE: "Ampere", nvml.DEVICE_ARCH_ADA: "Ada Lovelace",
		nvml.DEVICE_ARCH_HOPPER: "Hopper", nvml.DEVICE_ARCH_BLACKWELL: "Blackwell",
	}
	brandNames = map[nvml.BrandType]string{
		nvml.BRAND_TESLA: "Tesla", nvml.BRAND_NVIDIA: "Nvidia", nvml.BRAND_NVIDIA_RTX: "NvidiaRTX", nvml.BRAND_QUADRO: "Quadro",
	}
)
