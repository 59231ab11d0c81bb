// Command nvmlprobe reads, through an NVML library, what the simulated
// library (make simlib) writes itself rather than taking from the
// simulator's tables: the fields of nvml.h's structs as the C API fills
// them (PCI info in both bus id forms, memory v1 and v2, the versioned
// profile info structs and their names, MIG attributes' return on a GPU
// handle, the driver's error strings). Run on a machine with a real GPU,
// it captures the driver's answers (read-only: it changes nothing); its
// test compares the simulated library with that capture
// (testdata/<model>-driver-<version>.json, TestSimulatedLibraryMatchesCapture).
//
//	nvmlprobe [-lib PATH] > capture.json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
)

// Probe is what one library answered.
type Probe struct {
	NVMLVersion   string            `json:"nvmlVersion"`
	DriverVersion string            `json:"driverVersion"`
	CudaVersion   int               `json:"cudaVersion"`
	ErrorStrings  map[string]string `json:"errorStrings"`
	GPUs          []GPU             `json:"gpus"`
}

// GPU is one GPU's answers.
type GPU struct {
	Name            string    `json:"name"`
	Minor           int       `json:"minor"`
	PciDomain       uint32    `json:"pciDomain"`
	PciBus          uint32    `json:"pciBus"`
	PciDevice       uint32    `json:"pciDevice"`
	PciBusID        string    `json:"pciBusId"`
	PciBusIDLegacy  string    `json:"pciBusIdLegacy"`
	PciDeviceID     string    `json:"pciDeviceId"`
	MemoryTotal     uint64    `json:"memoryTotal"`
	MemoryV2Total   uint64    `json:"memoryV2Total"`
	MemoryV2Return  string    `json:"memoryV2Return"`
	AttributesOnGPU string    `json:"attributesOnGpu"`
	Profiles        []Profile `json:"profiles"`
}

// Profile is one GPU instance profile index's answers.
type Profile struct {
	Index        int    `json:"index"`
	V1Return     string `json:"v1Return"`
	ID           uint32 `json:"id,omitempty"`
	MemoryMB     uint64 `json:"memoryMB,omitempty"`
	V2Return     string `json:"v2Return"`
	V2Name       string `json:"v2Name,omitempty"`
	V3Return     string `json:"v3Return"`
	V3Name       string `json:"v3Name,omitempty"`
	Capabilities uint32 `json:"v3Capabilities,omitempty"`
	// V2Fields and V3Fields are id, slices, instances, SMs and memory as
	// each versioned struct came back.
	V2Fields []uint64 `json:"v2Fields,omitempty"`
	V3Fields []uint64 `json:"v3Fields,omitempty"`
}

func main() {
	lib := flag.String("lib", "", "path of libnvidia-ml.so.1 (default: the loader's)")
	flag.Parse()
	var opts []nvml.LibraryOption
	if *lib != "" {
		opts = append(opts, nvml.WithLibraryPath(*lib))
	}
	p, err := probe(nvml.New(opts...))
	if err != nil {
		fmt.Fprintln(os.Stderr, "nvmlprobe:", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(p)
}

func probe(l nvml.Interface) (Probe, error) {
	if ret := l.Init(); ret != nvml.SUCCESS {
		return Probe{}, fmt.Errorf("nvmlInit: %s", nvmlreturn.Name(ret))
	}
	defer l.Shutdown()
	var p Probe
	p.NVMLVersion, _ = l.SystemGetNVMLVersion()
	p.DriverVersion, _ = l.SystemGetDriverVersion()
	p.CudaVersion, _ = l.SystemGetCudaDriverVersion()
	p.ErrorStrings = map[string]string{}
	for _, r := range []nvml.Return{nvml.SUCCESS, nvml.ERROR_UNINITIALIZED, nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_NOT_SUPPORTED,
		nvml.ERROR_NO_PERMISSION, nvml.ERROR_NOT_FOUND, nvml.ERROR_INSUFFICIENT_SIZE, nvml.ERROR_DRIVER_NOT_LOADED,
		nvml.ERROR_IN_USE, nvml.ERROR_INSUFFICIENT_RESOURCES, nvml.ERROR_UNKNOWN} {
		p.ErrorStrings[nvmlreturn.Name(r)] = l.ErrorString(r)
	}
	n, ret := l.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return p, fmt.Errorf("nvmlDeviceGetCount: %s", nvmlreturn.Name(ret))
	}
	for i := range n {
		d, ret := l.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return p, fmt.Errorf("GPU %d: %s", i, nvmlreturn.Name(ret))
		}
		p.GPUs = append(p.GPUs, probeGPU(d))
	}
	return p, nil
}

func probeGPU(d nvml.Device) GPU {
	var g GPU
	g.Name, _ = d.GetName()
	g.Minor, _ = d.GetMinorNumber()
	pci, _ := d.GetPciInfo()
	g.PciDomain, g.PciBus, g.PciDevice = pci.Domain, pci.Bus, pci.Device
	g.PciBusID, g.PciBusIDLegacy = cString(pci.BusId[:]), cString(pci.BusIdLegacy[:])
	g.PciDeviceID = fmt.Sprintf("0x%08X", pci.PciDeviceId)
	mem, _ := d.GetMemoryInfo()
	g.MemoryTotal = mem.Total
	mem2, ret := d.GetMemoryInfo_v2()
	g.MemoryV2Total, g.MemoryV2Return = mem2.Total, nvmlreturn.Name(ret)
	_, ret = d.GetAttributes()
	g.AttributesOnGPU = nvmlreturn.Name(ret)
	for i := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		pr := Profile{Index: i}
		v1, ret := d.GetGpuInstanceProfileInfo(i)
		pr.V1Return = nvmlreturn.Name(ret)
		if ret == nvml.SUCCESS {
			pr.ID, pr.MemoryMB = v1.Id, v1.MemorySizeMB
		}
		v2, ret := d.GetGpuInstanceProfileInfoV(i).V2()
		pr.V2Return = nvmlreturn.Name(ret)
		if ret == nvml.SUCCESS {
			pr.V2Name = cString(v2.Name[:])
			pr.V2Fields = []uint64{uint64(v2.Id), uint64(v2.SliceCount), uint64(v2.InstanceCount), uint64(v2.MultiprocessorCount), v2.MemorySizeMB}
		}
		v3, ret := d.GetGpuInstanceProfileInfoV(i).V3()
		pr.V3Return = nvmlreturn.Name(ret)
		if ret == nvml.SUCCESS {
			pr.V3Name, pr.Capabilities = cString(v3.Name[:]), v3.Capabilities
			pr.V3Fields = []uint64{uint64(v3.Id), uint64(v3.SliceCount), uint64(v3.InstanceCount), uint64(v3.MultiprocessorCount), v3.MemorySizeMB}
		}
		g.Profiles = append(g.Profiles, pr)
	}
	return g
}

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
