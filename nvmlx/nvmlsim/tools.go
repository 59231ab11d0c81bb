package nvmlsim

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/profiles"
)

// The NVML calls NVIDIA's own tools make, so that they run on the simulator
// unaided (issue 25). Read from their sources: mig-parted
// bd7160f4 (2026-08-21; go-nvlib v0.12.0), the DRA driver's kubelet plugin
// 95932046 (2026-08-07; go-nvlib v0.12.0). "mp" = mig-parted's apply path
// (cmd/nvidia-mig-parted/apply, .../assert, .../util; pkg/mig/mode/nvml.go;
// pkg/mig/config/config.go; internal/nvlib/mig/mig.go; pkg/types/nvdev.go,
// whose ParseMigProfile opens NVML and walks every GPU's profiles through
// go-nvlib for each profile name of the config), "dra" = the kubelet
// plugin's start-up enumeration without DynamicMIG (cmd/gpu-kubelet-plugin/
// nvlib.go GetPerGpuAllocatableDevices, getGpuInfo, getMigDevices,
// walkMigDevices), "nvlib" = go-nvlib pkg/nvlib/device/device.go, which both
// call, "dp" = NVIDIA's k8s-device-plugin v0.17.4 and GPU Feature
// Discovery naming MIG devices through go-nvlib v0.7.4, "cdi" = the plugin's CDI spec cache warm-up at start, for every full
// GPU it announces (device_state.go: cdi.WarmupDevSpecCache; cdi.go:
// GetDeviceSpecsByUUIDCached), through nvidia-container-toolkit's pkg/nvcdi
// (lib-nvml.go getDeviceSpecGeneratorsForIDs: Init, DeviceGetHandleByUUID,
// IsMigDeviceHandle, then full-gpu-nvml.go; internal/platform-support/dgpu:
// GetMinorNumber, GetPciInfo; Shutdown), and at prepare time for a MIG
// device (mig-device-nvml.go). TestDRAPluginStartSequence runs the whole
// start-up sequence. Every row is implemented; TestSimToolCalls makes each call added
// for these tools the way its caller does (the others are TestSimRules').
//
//	function                                    caller  source (file: function)
//	Init                                        mp      util/nvml.go: NvmlInit; types/nvdev.go: nvdevParseMigProfile
//	InitWithFlags(INIT_FLAG_NO_GPUS)            dra     nvlib.go: ensureNVML, Init
//	Shutdown                                    mp dra  util/nvml.go: TryNvmlShutdown; nvlib.go: alwaysShutdown
//	SystemGetNVMLVersion                        mp      util/nvml.go: IsNVMLVersionSupported (major >= 11)
//	SystemGetDriverVersion                      dra     nvlib.go: getGpuInfo (semver.MustParse in deviceinfo.go)
//	SystemGetCudaDriverVersion                  dra     nvlib.go: getGpuInfo ("%d.%d" of v/1000, v%1000/10)
//	Extensions().LookupSymbol                   nvlib   device.go: hasSymbol (GetMigMode, GetAddressingMode)
//	DeviceGetCount                              mp nvlib device.go: VisitDevices (via types/nvdev.go ParseMigProfile)
//	DeviceGetHandleByIndex                      mp nvlib mode/nvml.go, config/config.go: every Manager method; VisitDevices
//	DeviceGetHandleByPciBusId                   mp      util/device.go: nvmlGetGPUDeviceIDs, nvmlGetGPUPciBusIds
//	DeviceGetHandleByUUID                       dra     nvlib.go: DeviceGetHandleByUUID (getMigDevices)
//	Device.GetName                              mp nvlib device.go: isSkipped (via VisitDevices); nvlib.go: getGpuInfo
//	Device.GetMinorNumber                       dra     nvlib.go: getGpuInfo (device name gpu-<minor>)
//	Device.GetUUID                              dra     nvlib.go: getGpuInfo, getMigDevices (MIG handle)
//	Device.GetMigMode                           mp nvlib mode/nvml.go: IsMigCapable, GetMigMode, IsMigModeChangePending; mig.go: AssertMigEnabled; device.go: IsMigCapable, IsMigEnabled
//	Device.SetMigMode                           mp      mode/nvml.go: SetMigMode
//	Device.GetMemoryInfo                        mp dra  config/config.go: GetMigConfig, SetMigConfig; device.go: VisitMigProfiles; nvlib.go: getGpuInfo
//	Device.GetArchitecture                      nvlib   device.go: GetArchitectureAsString
//	Device.GetBrand                             nvlib   device.go: GetBrandAsString
//	Device.GetCudaComputeCapability             nvlib   device.go: GetCudaComputeCapabilityAsString
//	Device.GetPciInfo                           nvlib   device.go: GetPCIBusID
//	Device.GetAddressingMode                    nvlib   device.go: GetAddressingModeAsString
//	Device.GetGpuInstanceProfileInfo            mp dra  mig.go: WalkGpuInstances; config.go: SetMigConfig; device.go: VisitMigProfiles; nvlib.go: getGpuInfo, getMigDevices
//	Device.GetGpuInstancePossiblePlacements     dra     nvlib.go: getGpuInfo
//	Device.GetGpuInstances                      mp      mig.go: WalkGpuInstances
//	Device.CreateGpuInstance (driver placement) mp      config.go: SetMigConfig
//	Device.GetGpuInstanceById                   dra     nvlib.go: getMigDevices
//	Device.GetMaxMigDeviceCount                 dra     nvlib.go: walkMigDevices
//	Device.GetMigDeviceHandleByIndex            dra     nvlib.go: walkMigDevices (NOT_FOUND, INVALID_ARGUMENT skipped)
//	Device.GetIndex                             cdi     full-gpu-nvml.go: newFullGPUDeviceSpecGeneratorFromNVMLDevice; mig-device-nvml.go (parent and MIG handle)
//	Device.GetGpuInstanceId                     dra     nvlib.go: getMigDevices (MIG handle)
//	Device.GetComputeInstanceId                 dra     nvlib.go: getMigDevices (MIG handle)
//	Device.GetAttributes                        dp      go-nvlib mig_device.go: GetProfile (MemorySizeMB names the MIG device)
//	Device.GetTopologyCommonAncestor            dp      go-gpuallocator: GetPreferredAllocation for whole GPUs
//	GpuInstance.GetInfo                         dra     nvlib.go: getMigDevices (placement, profile id)
//	GpuInstance.GetComputeInstanceProfileInfo   mp dra  mig.go: WalkComputeInstances; config.go: SetMigConfig; nvlib.go: getMigDevices
//	GpuInstance.GetComputeInstances             mp      mig.go: WalkComputeInstances
//	GpuInstance.GetComputeInstanceById          dra     nvlib.go: getMigDevices
//	GpuInstance.CreateComputeInstance           mp      config.go: SetMigConfig
//	GpuInstance.Destroy                         mp      config.go: ClearMigConfig
//	ComputeInstance.GetInfo                     dra     nvlib.go: getMigDevices
//	ComputeInstance.Destroy                     mp      config.go: ClearMigConfig
//
// Outside those paths, and not implemented unless said: the plugin's CDI
// spec generation for a MIG device at prepare time (nvidia-container-toolkit
// nvcdi mig-device-nvml.go: Device.GetIndex and
// GetDeviceHandleFromMigDeviceHandle, implemented), its NVMLDeviceHealthCheck (EventSetCreate,
// GetSupportedEventTypes; gate off by default), DynamicMIG
// (GetVirtualizationMode and CreateGpuInstanceWithPlacement, implemented),
// FabricManagerPartitioning (GetModuleId) and PassthroughSupport
// (DeviceGetPersistenceMode, SetPersistenceMode). mig-parted's GetGPUDeviceIDs and ResetAllGPUs also
// read /proc/modules and sysfs (go-nvlib nvpci), which are not NVML.

// NewSimNVML opens the simulated NVML library alone, as go-nvml's
// nvml.Interface, for a program that expects NVML itself (NVIDIA's
// mig-parted and DRA kubelet plugin with only their nvml.New pointed here).
// It shares o.StatePath with a mig-agent on the same spec. Like
// libnvidia-ml, it is not initialized: the caller calls Init.
func NewSimNVML(spec string, o Options) (nvml.Interface, error) {
	return New(spec, o, slog.New(slog.DiscardHandler))
}

// simCudaDriverVersion is what nvmlSystemGetCudaDriverVersion returns with
// the simulated driver 580.159.04: 13000 (CUDA 13.0), measured on the H200
// (testdata/h200-nvml-probe.json; nvidia-smi's "CUDA Version: 13.0").
const simCudaDriverVersion = 13000

// simNVMLVersion is nvmlSystemGetNVMLVersion's string: the CUDA major, then
// the driver version ("13.580.159.04" measured on the H200 probe).
func simNVMLVersion() string {
	return fmt.Sprintf("%d.%s", simCudaDriverVersion/1000, DriverVersion)
}

// InitWithFlags is Init with nvmlInitWithFlags' flags: NVML_INIT_FLAG_NO_GPUS
// (do not fail without GPUs) and NVML_INIT_FLAG_NO_ATTACH (do not attach
// GPUs); the simulated GPUs need neither, any other bit is INVALID_ARGUMENT.
func (l *Lib) InitWithFlags(flags uint32) nvml.Return {
	if flags&^(nvml.INIT_FLAG_NO_GPUS|nvml.INIT_FLAG_NO_ATTACH) != 0 {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return l.Init()
}

// SystemGetNVMLVersion is simNVMLVersion (nvml.h nvmlSystemGetNVMLVersion).
func (l *Lib) SystemGetNVMLVersion() (string, nvml.Return) {
	l.lock()
	defer l.unlock()
	if !l.up() {
		return "", nvml.ERROR_UNINITIALIZED
	}
	return simNVMLVersion(), nvml.SUCCESS
}

// SystemGetCudaDriverVersion is simCudaDriverVersion (nvml.h
// nvmlSystemGetCudaDriverVersion: 1000*major + 10*minor).
func (l *Lib) SystemGetCudaDriverVersion() (int, nvml.Return) {
	l.lock()
	defer l.unlock()
	if !l.up() {
		return 0, nvml.ERROR_UNINITIALIZED
	}
	return simCudaDriverVersion, nvml.SUCCESS
}

// DeviceGetHandleByPciBusId finds a GPU by PCI bus id in any form nvml.h
// nvmlDeviceGetHandleByPciBusId_v2 accepts ("domain:bus:device.function",
// "domain:bus:device", "bus:device.function", hex, any case, domain of 4
// or 8 digits: go-nvlib nvpci gives "0000:00:06.0", NVML "00000000:00:06.0");
// NOT_FOUND for none, INVALID_ARGUMENT for a malformed id.
func (l *Lib) DeviceGetHandleByPciBusId(busID string) (nvml.Device, nvml.Return) {
	want, ok := parsePCIBusID(busID)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	l.lock()
	defer l.unlock()
	if !l.up() {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	for i, g := range l.st.GPUs {
		if have, _ := parsePCIBusID(g.PCIBusID); have == want {
			if g.HandleError != "" {
				return nil, simReturnByName(g.HandleError)
			}
			return &simDevice{lib: l, index: i}, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// pciAddr is a parsed PCI bus id.
type pciAddr struct{ domain, bus, device, function uint64 }

// parsePCIBusID parses the forms nvmlDeviceGetHandleByPciBusId_v2 accepts.
func parsePCIBusID(s string) (pciAddr, bool) {
	var a pciAddr
	head, fn, hasFn := strings.Cut(strings.TrimSpace(s), ".")
	parts := strings.Split(head, ":")
	hex := func(x string, bits int) (uint64, bool) {
		v, err := strconv.ParseUint(x, 16, bits)
		return v, err == nil && x != ""
	}
	var ok [4]bool
	switch {
	case len(parts) == 3: // domain:bus:device[.function]
		a.domain, ok[0] = hex(parts[0], 32)
		a.bus, ok[1] = hex(parts[1], 8)
		a.device, ok[2] = hex(parts[2], 8)
	case len(parts) == 2 && hasFn: // bus:device.function
		ok[0] = true
		a.bus, ok[1] = hex(parts[0], 8)
		a.device, ok[2] = hex(parts[1], 8)
	default:
		return a, false
	}
	ok[3] = true
	if hasFn {
		a.function, ok[3] = hex(fn, 4)
	}
	return a, ok == [4]bool{true, true, true, true}
}

// GetMinorNumber is the GPU's /dev/nvidiaN number: its index, as on the
// H200 probe (GPU 0, minor 0). The DRA driver names the GPU gpu-<minor>.
func (d *simDevice) GetMinorNumber() (int, nvml.Return) {
	if d.mig != nil {
		return 0, nvml.ERROR_NOT_SUPPORTED // a MIG device has no /dev/nvidiaN of its own (unverified)
	}
	return d.index, d.with(func(*simGPU, *profiles.Model) nvml.Return { return nvml.SUCCESS })
}

// GetBrand is NVML_BRAND_NVIDIA (14) for every simulated model: measured on
// the H200 (probe "brand": 14; go-nvlib GetBrandAsString "Nvidia"); the
// other data-center models are assumed alike (not measured).
func (d *simDevice) GetBrand() (nvml.BrandType, nvml.Return) {
	return nvml.BRAND_NVIDIA, d.with(func(*simGPU, *profiles.Model) nvml.Return { return nvml.SUCCESS })
}

// simComputeCapability is the CUDA compute capability per architecture
// (NVIDIA's CUDA GPUs list: A100 and A30 8.0, L40S 8.9, H100 and H200 9.0
// (measured on the H200 probe: "9.0"), B200 10.0).
var simComputeCapability = map[string][2]int{
	profiles.ArchAmpere:    {8, 0},
	profiles.ArchAda:       {8, 9},
	profiles.ArchHopper:    {9, 0},
	profiles.ArchBlackwell: {10, 0},
}

// GetCudaComputeCapability is the model's (major, minor).
func (d *simDevice) GetCudaComputeCapability() (int, int, nvml.Return) {
	var cc [2]int
	ret := d.with(func(_ *simGPU, m *profiles.Model) nvml.Return {
		var ok bool
		if cc, ok = simComputeCapability[m.Architecture]; !ok {
			return nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.SUCCESS
	})
	return cc[0], cc[1], ret
}

// GetAddressingMode: NOT_SUPPORTED. The simulated GPUs sit on x86 PCIe or
// SXM boards without coherent CPU memory; nvml.h nvmlDeviceGetAddressingMode
// answers NOT_SUPPORTED where the device lacks the feature, and the DRA
// driver then publishes no addressingMode attribute (nvlib.go getGpuInfo:
// "" = "Not supported by the platform"). Not measured on the H200 probe.
func (d *simDevice) GetAddressingMode() (nvml.DeviceAddressingMode, nvml.Return) {
	return nvml.DeviceAddressingMode{}, d.with(func(*simGPU, *profiles.Model) nvml.Return { return nvml.ERROR_NOT_SUPPORTED })
}

// GetDeviceHandleFromMigDeviceHandle is a MIG device's parent GPU;
// INVALID_ARGUMENT for a GPU handle (nvml.h: "if device is not a valid MIG
// device handle").
func (d *simDevice) GetDeviceHandleFromMigDeviceHandle() (nvml.Device, nvml.Return) {
	if d.mig == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return &simDevice{lib: d.lib, index: d.index}, d.with(func(*simGPU, *profiles.Model) nvml.Return { return nvml.SUCCESS })
}

// CreateGpuInstance creates a GPU instance where the driver chooses
// (nvml.h nvmlDeviceCreateGpuInstance), as mig-parted's SetMigConfig asks
// for it: the placement is simDriverPlacement's; with none free,
// INSUFFICIENT_RESOURCES (the MIG user guide's `-cgi 19,19,14,9` fails so at
// its 3g). The other rules, the GI id and the faults are those of
// CreateGpuInstanceWithPlacement; the success counts in Mutations as
// OpCreateGpuInstance.
func (d *simDevice) CreateGpuInstance(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
	return d.createGI(OpCreateGpuInstance, info, func(g *simGPU, m *profiles.Model, p *profiles.Profile) (profiles.Placement, nvml.Return) {
		pl, ok := simDriverPlacement(g, m, p)
		if !ok {
			return pl, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		return pl, nvml.SUCCESS
	})
}

// simDriverPlacement is where the driver puts a GPU instance of profile p
// when the caller names no placement: of p's free placements, the one that
// takes away the fewest placements still free to the GPU's profiles (every
// profile's, p's own included), the lowest start on a tie. NVIDIA
// publishes no rule; this one reproduces every driver-placed example of the
// MIG user guide ("Instance Geometry", A100-SXM4-40GB): `-cgi 19,14,5` puts
// 1g at 6:1, 2g at 4:2, 4g at 0:4; `-cgi 19,19,14,9` puts 1g at 6 and 4 and
// 2g at 0:2, then the 3g fails; `-cgi 9,19,14,19` puts 3g at 4:4, 1g at 0,
// 2g at 2:2, 1g at 1; `-cgi 14,19,19,19,19,19` puts 2g at 4:2, then 1g at 6,
// 0, 1, 2, 3 (TestSimDriverPlacement). In words: small instances go first
// to the half a 4g cannot use, and a half is filled before the other.
func simDriverPlacement(g *simGPU, m *profiles.Model, p *profiles.Profile) (profiles.Placement, bool) {
	free := func(pl profiles.Placement) bool {
		return !slices.ContainsFunc(g.Instances, func(gi simGI) bool { return gi.Placement.Overlaps(pl) })
	}
	best, bestCost := profiles.Placement{}, -1
	for _, cand := range p.Placements {
		if !free(cand) {
			continue
		}
		cost := 0
		for _, q := range m.Catalogue.Profiles {
			for _, other := range q.Placements {
				if free(other) && other.Overlaps(cand) {
					cost++
				}
			}
		}
		if bestCost < 0 || cost < bestCost || (cost == bestCost && cand.Start < best.Start) {
			best, bestCost = cand, cost
		}
	}
	return best, bestCost >= 0
}

// GetAttributes is a MIG device's share of its GPU (nvml.h
// nvmlDeviceGetAttributes_v2, which "only supports MIG device handles": a
// GPU handle gets NOT_SUPPORTED): the GPU instance's memory, slices and
// engines, which its compute instances share, and the compute instance's
// slices with their part of the multiprocessors. NVIDIA's device plugin and
// GPU Feature Discovery name a MIG device from it (go-nvlib
// pkg/nvlib/device/mig_device.go GetProfile: NewMigProfile from
// MemorySizeMB and the parent's total memory).
func (d *simDevice) GetAttributes() (nvml.DeviceAttributes, nvml.Return) {
	var out nvml.DeviceAttributes
	if d.mig == nil {
		return out, nvml.ERROR_NOT_SUPPORTED
	}
	return out, d.with(func(g *simGPU, m *profiles.Model) nvml.Return {
		p, cp, ret := d.migProfiles(g, m)
		if ret != nvml.SUCCESS {
			return ret
		}
		out = nvml.DeviceAttributes{
			MultiprocessorCount:       uint32(p.Multiprocessors * cp.Slices / max(p.Slices, 1)),
			SharedCopyEngineCount:     uint32(p.CopyEngines),
			SharedDecoderCount:        uint32(p.Decoders),
			SharedEncoderCount:        uint32(p.Encoders),
			SharedJpegCount:           uint32(p.JPEGs),
			SharedOfaCount:            uint32(p.OFAs),
			GpuInstanceSliceCount:     uint32(p.Slices),
			ComputeInstanceSliceCount: uint32(cp.Slices),
			MemorySizeMB:              p.MemoryMiB,
		}
		return nvml.SUCCESS
	})
}

// migProfiles are the GPU instance and compute instance profiles of MIG
// device handle d on g; INVALID_ARGUMENT when the device is gone (a stale
// handle).
func (d *simDevice) migProfiles(g *simGPU, m *profiles.Model) (*profiles.Profile, *profiles.ComputeProfile, nvml.Return) {
	gi, ci := findGI(g, d.mig.gi), findCI(g, d.mig.gi, d.mig.ci)
	if gi == nil || ci == nil {
		return nil, nil, nvml.ERROR_INVALID_ARGUMENT
	}
	p, ok := m.Catalogue.ByID(gi.ProfileID)
	if !ok {
		return nil, nil, nvml.ERROR_UNKNOWN
	}
	cp, ok := computeByID(p, ci.ProfileID)
	if !ok {
		return nil, nil, nvml.ERROR_UNKNOWN
	}
	return p, cp, nvml.SUCCESS
}

// GetTopologyCommonAncestor is the PCIe path between two GPUs (nvml.h
// nvmlDeviceGetTopologyCommonAncestor): NVML_TOPOLOGY_INTERNAL for a GPU
// and itself, else NVML_TOPOLOGY_NODE, every simulated GPU sitting on its
// own bus below the same NUMA node (an assumption: no topology was
// captured; an HGX board's GPUs report NODE or SYSTEM). NVIDIA's device
// plugin asks it in GetPreferredAllocation for whole GPUs (go-gpuallocator);
// MIG device handles are INVALID_ARGUMENT, as NVML documents GPU handles
// only.
func (d *simDevice) GetTopologyCommonAncestor(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
	o, ok := other.(*simDevice)
	if !ok || d.mig != nil || o.mig != nil || o.lib != d.lib {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	level := nvml.TOPOLOGY_NODE
	if o.index == d.index {
		level = nvml.TOPOLOGY_INTERNAL
	}
	return level, d.with(func(*simGPU, *profiles.Model) nvml.Return { return nvml.SUCCESS })
}
