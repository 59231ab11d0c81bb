package nvmlx

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/profiles"
)

// realCapture is what the read-only hardware test (real_hw_test.go, build
// tag realgpu) records on a machine with a real GPU: NVML's raw answers
// and what the real backend made of them. testdata/h200-real-profiles.json
// is one, taken on an H200.
type realCapture struct {
	Note          string            `json:"note"`
	CapturedAt    string            `json:"capturedAt"`
	Library       string            `json:"library"`
	DriverVersion string            `json:"driverVersion"`
	Raw           []realRawGPU      `json:"raw"`
	GPUs          []realCapturedGPU `json:"gpus"`
}

// realRawGPU is NVML's raw answers for one GPU, every return code by name.
type realRawGPU struct {
	Index            int              `json:"index"`
	Name             string           `json:"name"`
	UUID             string           `json:"uuid"`
	PCIBusID         string           `json:"pciBusId"`
	PCIDeviceID      string           `json:"pciDeviceId"`
	MemoryTotalBytes uint64           `json:"memoryTotalBytes"`
	Architecture     uint32           `json:"architecture"`
	MigMode          realRawMigMode   `json:"migMode"`
	Profiles         []realRawProfile `json:"profiles"` // one per index, 0..GPU_INSTANCE_PROFILE_COUNT-1
	// Read since the simulator speaks NVML (absent in older captures).
	PCISubsystemID      string `json:"pciSubsystemId,omitempty"`
	MaxMigDevices       int    `json:"maxMigDevices,omitempty"`
	MaxMigDevicesReturn string `json:"maxMigDevicesReturn,omitempty"`
	// SimDiffs lists where the simulated GPU of the same model, read
	// through the same calls, answers differently (empty: it matches).
	SimDiffs []string `json:"simDiffs,omitempty"`
}

type realRawMigMode struct {
	Current int    `json:"current"`
	Pending int    `json:"pending"`
	Return  string `json:"return"`
}

// realRawProfile is GetGpuInstanceProfileInfo(index) and, where it
// succeeded, GetGpuInstancePossiblePlacements.
type realRawProfile struct {
	Index            int                          `json:"index"`
	Return           string                       `json:"return"`
	Info             *nvml.GpuInstanceProfileInfo `json:"info,omitempty"`
	Placements       []nvml.GpuInstancePlacement  `json:"placements,omitempty"`
	PlacementsReturn string                       `json:"placementsReturn,omitempty"`
	Instances        int                          `json:"instances,omitempty"`
	InstancesReturn  string                       `json:"instancesReturn,omitempty"`
}

// realCapturedGPU is what the backend reports for one GPU.
type realCapturedGPU struct {
	Device
	PCIDeviceID string             `json:"pciDeviceId"`
	Catalogue   profiles.Catalogue `json:"catalogue"`
	Instances   []GPUInstance      `json:"instances"`
	Processes   []Process          `json:"processes"`
	CanReset    bool               `json:"canReset"`
	ResetReason string             `json:"resetReason,omitempty"`
}

// parsePCIDeviceID reads "0x233510DE".
func parsePCIDeviceID(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 0, 32)
	return uint32(v), err
}

// readRaw reads GPU i through lib with the read-only nvml.Interface calls
// the backend makes for discovery; has says which symbols the library has.
// The same function reads the real driver (the realgpu test) and the
// simulator, so their answers compare field by field.
func readRaw(lib nvml.Interface, i int, has func(string) bool) (realRawGPU, error) {
	d, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return realRawGPU{}, fmt.Errorf("DeviceGetHandleByIndex(%d): %s", i, nvmlreturn.Name(ret))
	}
	r := realRawGPU{Index: i}
	r.Name, _ = d.GetName()
	r.UUID, _ = d.GetUUID()
	pci, _ := d.GetPciInfo()
	r.PCIBusID, r.PCIDeviceID = realBusID(pci.BusId), fmt.Sprintf("0x%08X", pci.PciDeviceId)
	r.PCISubsystemID = fmt.Sprintf("0x%08X", pci.PciSubSystemId)
	mem, _ := d.GetMemoryInfo()
	r.MemoryTotalBytes = mem.Total
	if has("nvmlDeviceGetArchitecture") {
		a, _ := d.GetArchitecture()
		r.Architecture = uint32(a)
	}
	if has("nvmlDeviceGetMigMode") {
		cur, pend, ret := d.GetMigMode()
		r.MigMode = realRawMigMode{Current: cur, Pending: pend, Return: nvmlreturn.Name(ret)}
	}
	for idx := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := d.GetGpuInstanceProfileInfo(idx)
		p := realRawProfile{Index: idx, Return: nvmlreturn.Name(ret)}
		if ret == nvml.SUCCESS {
			p.Info = &info
			if has("nvmlDeviceGetGpuInstancePossiblePlacements_v2") || has("nvmlDeviceGetGpuInstancePossiblePlacements") {
				pls, ret := d.GetGpuInstancePossiblePlacements(&info)
				p.Placements, p.PlacementsReturn = pls, nvmlreturn.Name(ret)
			}
			if has("nvmlDeviceGetGpuInstances") {
				q := info
				q.InstanceCount = max(q.InstanceCount, realListSlots)
				gis, ret := d.GetGpuInstances(&q)
				p.Instances, p.InstancesReturn = len(gis), nvmlreturn.Name(ret)
			}
		}
		r.Profiles = append(r.Profiles, p)
	}
	if has("nvmlDeviceGetMaxMigDeviceCount") {
		n, ret := d.GetMaxMigDeviceCount()
		r.MaxMigDevices, r.MaxMigDevicesReturn = n, nvmlreturn.Name(ret)
	}
	return r, nil
}

// compareRaw lists the fields where the simulator's reading of a GPU
// differs from the real one's; identity (UUID, bus id, index) is not
// compared. A PCI subsystem id the simulator does not know ("0x00000000")
// is reported too: it is a fact to add.
func compareRaw(real, sim realRawGPU) []string {
	var diffs []string
	diff := func(field string, r, s any) {
		if !reflect.DeepEqual(r, s) {
			diffs = append(diffs, fmt.Sprintf("%s: real %v, sim %v", field, r, s))
		}
	}
	diff("name", real.Name, sim.Name)
	diff("pciDeviceId", real.PCIDeviceID, sim.PCIDeviceID)
	if real.PCISubsystemID != "" {
		diff("pciSubsystemId", real.PCISubsystemID, sim.PCISubsystemID)
	}
	diff("memoryTotalBytes", real.MemoryTotalBytes, sim.MemoryTotalBytes)
	diff("architecture", real.Architecture, sim.Architecture)
	diff("migMode", real.MigMode, sim.MigMode)
	if real.MaxMigDevicesReturn != "" {
		diff("maxMigDeviceCount", [2]any{real.MaxMigDevices, real.MaxMigDevicesReturn}, [2]any{sim.MaxMigDevices, sim.MaxMigDevicesReturn})
	}
	for k := range min(len(real.Profiles), len(sim.Profiles)) {
		r, s := real.Profiles[k], sim.Profiles[k]
		f := fmt.Sprintf("profile %d ", k)
		diff(f+"return", r.Return, s.Return)
		diff(f+"info", r.Info, s.Info)
		diff(f+"placements", r.Placements, s.Placements)
		diff(f+"placementsReturn", r.PlacementsReturn, s.PlacementsReturn)
		if r.InstancesReturn != "" {
			diff(f+"instances", [2]any{r.Instances, r.InstancesReturn}, [2]any{s.Instances, s.InstancesReturn})
		}
	}
	diff("profile count", len(real.Profiles), len(sim.Profiles))
	return diffs
}

// simRawFor reads the simulated GPU of the same model as real (found by
// PCI device id), in real's MIG mode, through the same calls; false when
// the simulator has no such model.
func simRawFor(real realRawGPU) (realRawGPU, bool, error) {
	id, err := parsePCIDeviceID(real.PCIDeviceID)
	if err != nil {
		return realRawGPU{}, false, err
	}
	m, ok := profiles.ModelByPCIID(id)
	if !ok {
		return realRawGPU{}, false, nil
	}
	l, err := nvmlsim.New(m.Key+"x1", nvmlsim.Options{}, nil)
	if err != nil {
		return realRawGPU{}, false, err
	}
	if err := l.SetMigModes(0, real.MigMode.Current == nvml.DEVICE_MIG_ENABLE, real.MigMode.Pending == nvml.DEVICE_MIG_ENABLE); err != nil {
		return realRawGPU{}, false, err
	}
	l.Init()
	defer l.Shutdown()
	r, err := readRaw(l, 0, func(string) bool { return true })
	return r, true, err
}

// TestSimMatchesH200Capture: the simulated H200, read through the same
// nvml.Interface calls as the read-only hardware capture, answers like the
// real H200 did (testdata/h200-real-profiles.json, driver 580.159.04).
func TestSimMatchesH200Capture(t *testing.T) {
	c := loadRealCapture(t, filepath.Join("testdata", "h200-real-profiles.json"))
	for _, real := range c.Raw {
		sim, ok, err := simRawFor(real)
		if err != nil || !ok {
			t.Fatalf("simulator for %s: %v %v", real.PCIDeviceID, ok, err)
		}
		for _, d := range compareRaw(real, sim) {
			t.Errorf("GPU %d: %s", real.Index, d)
		}
	}
}
