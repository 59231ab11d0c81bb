// Package nvmlreturn names NVML's return codes as go-nvml spells its
// constants ("ERROR_IN_USE"): the names the real backend's errors carry and
// the simulator's --sim-faults and handle errors take.
package nvmlreturn

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// names lists every return code go-nvml v0.13.4-1 defines, with its name.
var names = []struct {
	r    nvml.Return
	name string
}{
	{nvml.SUCCESS, "SUCCESS"},
	{nvml.ERROR_UNINITIALIZED, "ERROR_UNINITIALIZED"},
	{nvml.ERROR_INVALID_ARGUMENT, "ERROR_INVALID_ARGUMENT"},
	{nvml.ERROR_NOT_SUPPORTED, "ERROR_NOT_SUPPORTED"},
	{nvml.ERROR_NO_PERMISSION, "ERROR_NO_PERMISSION"},
	{nvml.ERROR_ALREADY_INITIALIZED, "ERROR_ALREADY_INITIALIZED"},
	{nvml.ERROR_NOT_FOUND, "ERROR_NOT_FOUND"},
	{nvml.ERROR_INSUFFICIENT_SIZE, "ERROR_INSUFFICIENT_SIZE"},
	{nvml.ERROR_INSUFFICIENT_POWER, "ERROR_INSUFFICIENT_POWER"},
	{nvml.ERROR_DRIVER_NOT_LOADED, "ERROR_DRIVER_NOT_LOADED"},
	{nvml.ERROR_TIMEOUT, "ERROR_TIMEOUT"},
	{nvml.ERROR_IRQ_ISSUE, "ERROR_IRQ_ISSUE"},
	{nvml.ERROR_LIBRARY_NOT_FOUND, "ERROR_LIBRARY_NOT_FOUND"},
	{nvml.ERROR_FUNCTION_NOT_FOUND, "ERROR_FUNCTION_NOT_FOUND"},
	{nvml.ERROR_CORRUPTED_INFOROM, "ERROR_CORRUPTED_INFOROM"},
	{nvml.ERROR_GPU_IS_LOST, "ERROR_GPU_IS_LOST"},
	{nvml.ERROR_RESET_REQUIRED, "ERROR_RESET_REQUIRED"},
	{nvml.ERROR_OPERATING_SYSTEM, "ERROR_OPERATING_SYSTEM"},
	{nvml.ERROR_LIB_RM_VERSION_MISMATCH, "ERROR_LIB_RM_VERSION_MISMATCH"},
	{nvml.ERROR_IN_USE, "ERROR_IN_USE"},
	{nvml.ERROR_MEMORY, "ERROR_MEMORY"},
	{nvml.ERROR_NO_DATA, "ERROR_NO_DATA"},
	{nvml.ERROR_VGPU_ECC_NOT_SUPPORTED, "ERROR_VGPU_ECC_NOT_SUPPORTED"},
	{nvml.ERROR_INSUFFICIENT_RESOURCES, "ERROR_INSUFFICIENT_RESOURCES"},
	{nvml.ERROR_FREQ_NOT_SUPPORTED, "ERROR_FREQ_NOT_SUPPORTED"},
	{nvml.ERROR_ARGUMENT_VERSION_MISMATCH, "ERROR_ARGUMENT_VERSION_MISMATCH"},
	{nvml.ERROR_DEPRECATED, "ERROR_DEPRECATED"},
	{nvml.ERROR_NOT_READY, "ERROR_NOT_READY"},
	{nvml.ERROR_GPU_NOT_FOUND, "ERROR_GPU_NOT_FOUND"},
	{nvml.ERROR_INVALID_STATE, "ERROR_INVALID_STATE"},
	{nvml.ERROR_RESET_TYPE_NOT_SUPPORTED, "ERROR_RESET_TYPE_NOT_SUPPORTED"},
	{nvml.ERROR_UNKNOWN, "ERROR_UNKNOWN"},
}

// Name is the enum name of an NVML return code ("ERROR_IN_USE"), or
// "ERROR_CODE_N" for a code go-nvml does not define. After nvml.Init,
// Return.Error() gives the driver's prose ("In use by another client"), so
// the names are mapped here, never read from strings.
func Name(r nvml.Return) string {
	for _, n := range names {
		if n.r == r {
			return n.name
		}
	}
	return fmt.Sprintf("ERROR_CODE_%d", int32(r))
}

// ByName is the return code Name gives name; false for a name go-nvml does
// not define ("ERROR_CODE_N" included).
func ByName(name string) (nvml.Return, bool) {
	for _, n := range names {
		if n.name == name {
			return n.r, true
		}
	}
	return 0, false
}

// prose is what the driver's nvmlErrorString says for the codes a caller
// most often prints (libnvidia-ml's own strings; those hack/nvmlprobe
// reads were captured from driver 580.159.04).
var prose = map[nvml.Return]string{
	nvml.SUCCESS:                      "Success",
	nvml.ERROR_UNINITIALIZED:          "Uninitialized",
	nvml.ERROR_INVALID_ARGUMENT:       "Invalid Argument",
	nvml.ERROR_NOT_SUPPORTED:          "Not Supported",
	nvml.ERROR_NO_PERMISSION:          "Insufficient Permissions",
	nvml.ERROR_ALREADY_INITIALIZED:    "Already Initialized",
	nvml.ERROR_NOT_FOUND:              "Not Found",
	nvml.ERROR_INSUFFICIENT_SIZE:      "Insufficient Size",
	nvml.ERROR_DRIVER_NOT_LOADED:      "Driver Not Loaded",
	nvml.ERROR_TIMEOUT:                "Timeout",
	nvml.ERROR_LIBRARY_NOT_FOUND:      "NVML Shared Library Not Found",
	nvml.ERROR_FUNCTION_NOT_FOUND:     "Function Not Found",
	nvml.ERROR_GPU_IS_LOST:            "GPU is lost",
	nvml.ERROR_RESET_REQUIRED:         "GPU requires restart",
	nvml.ERROR_IN_USE:                 "In use by another client",
	nvml.ERROR_MEMORY:                 "Insufficient Memory",
	nvml.ERROR_NO_DATA:                "No data",
	nvml.ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
	nvml.ERROR_UNKNOWN:                "Unknown Error",
}

// Prose is nvmlErrorString's text for r: the driver's words where known,
// else Name.
func Prose(r nvml.Return) string {
	if s, ok := prose[r]; ok {
		return s
	}
	return Name(r)
}
