package nvmlx

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// realReturnName is the enum name of an NVML return code ("ERROR_IN_USE").
// After nvml.Init, Return.Error() gives the driver's prose ("In use by
// another client"), so the names are mapped here, never read from strings.
func realReturnName(r nvml.Return) string {
	switch r {
	case nvml.SUCCESS:
		return "SUCCESS"
	case nvml.ERROR_UNINITIALIZED:
		return "ERROR_UNINITIALIZED"
	case nvml.ERROR_INVALID_ARGUMENT:
		return "ERROR_INVALID_ARGUMENT"
	case nvml.ERROR_NOT_SUPPORTED:
		return "ERROR_NOT_SUPPORTED"
	case nvml.ERROR_NO_PERMISSION:
		return "ERROR_NO_PERMISSION"
	case nvml.ERROR_ALREADY_INITIALIZED:
		return "ERROR_ALREADY_INITIALIZED"
	case nvml.ERROR_NOT_FOUND:
		return "ERROR_NOT_FOUND"
	case nvml.ERROR_INSUFFICIENT_SIZE:
		return "ERROR_INSUFFICIENT_SIZE"
	case nvml.ERROR_INSUFFICIENT_POWER:
		return "ERROR_INSUFFICIENT_POWER"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "ERROR_DRIVER_NOT_LOADED"
	case nvml.ERROR_TIMEOUT:
		return "ERROR_TIMEOUT"
	case nvml.ERROR_IRQ_ISSUE:
		return "ERROR_IRQ_ISSUE"
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "ERROR_LIBRARY_NOT_FOUND"
	case nvml.ERROR_FUNCTION_NOT_FOUND:
		return "ERROR_FUNCTION_NOT_FOUND"
	case nvml.ERROR_CORRUPTED_INFOROM:
		return "ERROR_CORRUPTED_INFOROM"
	case nvml.ERROR_GPU_IS_LOST:
		return "ERROR_GPU_IS_LOST"
	case nvml.ERROR_RESET_REQUIRED:
		return "ERROR_RESET_REQUIRED"
	case nvml.ERROR_OPERATING_SYSTEM:
		return "ERROR_OPERATING_SYSTEM"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "ERROR_LIB_RM_VERSION_MISMATCH"
	case nvml.ERROR_IN_USE:
		return "ERROR_IN_USE"
	case nvml.ERROR_MEMORY:
		return "ERROR_MEMORY"
	case nvml.ERROR_NO_DATA:
		return "ERROR_NO_DATA"
	case nvml.ERROR_VGPU_ECC_NOT_SUPPORTED:
		return "ERROR_VGPU_ECC_NOT_SUPPORTED"
	case nvml.ERROR_INSUFFICIENT_RESOURCES:
		return "ERROR_INSUFFICIENT_RESOURCES"
	case nvml.ERROR_FREQ_NOT_SUPPORTED:
		return "ERROR_FREQ_NOT_SUPPORTED"
	case nvml.ERROR_ARGUMENT_VERSION_MISMATCH:
		return "ERROR_ARGUMENT_VERSION_MISMATCH"
	case nvml.ERROR_DEPRECATED:
		return "ERROR_DEPRECATED"
	case nvml.ERROR_NOT_READY:
		return "ERROR_NOT_READY"
	case nvml.ERROR_GPU_NOT_FOUND:
		return "ERROR_GPU_NOT_FOUND"
	case nvml.ERROR_INVALID_STATE:
		return "ERROR_INVALID_STATE"
	case nvml.ERROR_RESET_TYPE_NOT_SUPPORTED:
		return "ERROR_RESET_TYPE_NOT_SUPPORTED"
	case nvml.ERROR_UNKNOWN:
		return "ERROR_UNKNOWN"
	}
	return fmt.Sprintf("ERROR_CODE_%d", int32(r))
}

// realError is the *Error for a failed NVML call.
func realError(op string, gpu int, r nvml.Return) *Error {
	return &Error{Op: op, GPU: gpu, Return: realReturnName(r)}
}
