package nvmlx

import (
	"fmt"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

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

// realReturnByName inverts realReturnName.
func realReturnByName(name string) (nvml.Return, error) {
	for r := nvml.Return(0); r < 1000; r++ {
		if realReturnName(r) == name {
			return r, nil
		}
	}
	return 0, fmt.Errorf("unknown NVML return %q", name)
}

// parsePCIDeviceID reads "0x233510DE".
func parsePCIDeviceID(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 0, 32)
	return uint32(v), err
}
