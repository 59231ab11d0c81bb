package nvmlx

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
)

// realError is the *Error for a failed NVML call.
func realError(op string, gpu int, r nvml.Return) *Error {
	return &Error{Op: op, GPU: gpu, Return: nvmlreturn.Name(r)}
}
