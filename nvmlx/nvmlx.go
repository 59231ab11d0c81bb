// Package nvmlx is mig-agent's only door to NVML: a narrow interface (GPU),
// the real backend over go-nvml (with its subpackages, the only code that
// imports it) and Sim, that backend over the simulated NVML library of
// nvmlx/nvmlsim, which enforces what the hardware enforces, so every
// state-changing path runs on a machine with no GPU.
package nvmlx

import (
	"errors"
	"fmt"
	"strings"

	"github.com/migagent/mig-agent/profiles"
)

// MigMode is a GPU's MIG mode: Current is in effect, Pending takes effect at
// the next activation (GPU reset or reboot) when it differs.
type MigMode struct {
	Current bool `json:"current"`
	Pending bool `json:"pending"`
}

// Device is what discovery reports for one GPU.
type Device struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	PCIDeviceID uint32 `json:"-"`
	// PCISubsystemID is NVML's pciSubSystemId (0x18BF10DE); 0 when unknown.
	PCISubsystemID uint32             `json:"-"`
	PCIBusID       string             `json:"pciBusId"`
	MemoryMiB      uint64             `json:"memoryMiB"`
	Architecture   string             `json:"architecture"`
	MigCapable     bool               `json:"migCapable"`
	MigMode        MigMode            `json:"migMode"`
	Catalogue      profiles.Catalogue `json:"-"`
}

// PCIDeviceIDString is the id as config device-filters write it: "0x233510DE".
func (d *Device) PCIDeviceIDString() string { return fmt.Sprintf("0x%08X", d.PCIDeviceID) }

// ComputeInstance is one compute instance inside a GPU instance; each is a
// MIG device with its own UUID (the id the device plugin hands to pods).
type ComputeInstance struct {
	ID        int    `json:"id"`        // driver-assigned CI id
	ProfileID int    `json:"profileId"` // compute instance profile id
	Profile   string `json:"profile"`   // "1c.3g.40gb", or the GI name for a full CI
	UUID      string `json:"uuid"`      // "MIG-..."
}

// GPUInstance is one GPU instance that exists on a GPU.
type GPUInstance struct {
	ID               int                `json:"id"`        // driver-assigned GI id (not stable; key on profile + placement)
	ProfileID        int                `json:"profileId"` // GI profile id
	Profile          string             `json:"profile"`   // canonical name
	Placement        profiles.Placement `json:"placement"`
	ComputeInstances []ComputeInstance  `json:"computeInstances"`
}

// Process is a process NVML sees on a GPU.
type Process struct {
	PID  uint32 `json:"pid"`
	GIID int    `json:"giId"` // -1 when not in a GPU instance
	CIID int    `json:"ciId"`
	Name string `json:"name,omitempty"`
}

// GPU is the narrow interface the rest of mig-agent uses. Callers are the
// CLI, the planner's discovery step and the agent's apply step; every
// method is safe to retry after an error (it changes nothing or exactly the
// one thing it names). GPUs are addressed by NVML index. GPU instances are
// addressed by their driver id as Instances reports it.
type GPU interface {
	// Devices discovers every GPU with its MIG catalogue and mode. A GPU
	// NVML counts but the agent cannot read (its handle answers
	// NO_PERMISSION, the GPU is lost, ...) is left out of the list, and the
	// error is then an *UnusableError naming it: the devices returned
	// beside that error are the others, complete (see SplitUnusable).
	Devices() ([]Device, error)
	// DriverVersion is the NVIDIA driver version ("580.159.04", "sim").
	DriverVersion() (string, error)
	// Instances lists the GPU instances on a GPU with their compute instances.
	Instances(gpu int) ([]GPUInstance, error)
	// SetMigMode asks for a MIG mode and returns the mode read back
	// afterwards. Pending != Current means the change waits for a reset or
	// reboot; the error wraps ErrResetRequired when NVML said a reset is
	// needed and ErrInUse when the GPU is busy.
	SetMigMode(gpu int, enabled bool) (MigMode, error)
	// CreateGPUInstance creates a GPU instance of profile id at placement
	// and returns its GI id.
	CreateGPUInstance(gpu, profileID int, at profiles.Placement) (int, error)
	// CreateComputeInstance creates a compute instance of the compute
	// profile at ciProfileIndex (NVML_COMPUTE_INSTANCE_PROFILE_*, portable)
	// in GPU instance gi and returns it, with the profile id NVML gave.
	CreateComputeInstance(gpu, gi, ciProfileIndex int) (ComputeInstance, error)
	// DestroyComputeInstance destroys compute instance ci of GPU instance gi.
	DestroyComputeInstance(gpu, gi, ci int) error
	// DestroyGPUInstance destroys GPU instance gi (its compute instances first
	// gone, else ErrInUse).
	DestroyGPUInstance(gpu, gi int) error
	// CanReset reports whether this GPU can be reset on its own, and why not.
	CanReset(gpu int) (bool, string)
	// ResetGPU resets one GPU so a pending MIG mode takes effect.
	ResetGPU(gpu int) error
	// Processes lists the processes NVML sees on a GPU.
	Processes(gpu int) ([]Process, error)
	// Begin opens an NVML session for a pass of work (the daemon's
	// reconcile pass): NVML stays initialized until the matching End.
	// Sessions nest. An error means NVML cannot be opened now (no driver,
	// the module unloaded for an upgrade); calling Begin again retries.
	Begin() error
	// End ends a session; a backend opened idle then shuts NVML down, so an
	// idle agent never pins the driver.
	End()
	// Close releases NVML.
	Close() error
}

// ErrProcessesUnknown: NVML cannot tell which processes use a GPU (none of
// its process lists is supported there). Whoever must know that nothing
// uses a GPU fails closed on it.
var ErrProcessesUnknown = errors.New("NVML cannot list the processes on this GPU: cannot tell whether anything uses it")

// UnusableGPU is a GPU NVML counts but the agent cannot read: it is left
// alone (nothing is asked of it) and reported.
type UnusableGPU struct {
	Index int `json:"index"`
	// Return is NVML's return code name ("ERROR_NO_PERMISSION"), or
	// "ERROR_UNKNOWN" for a failure that is not NVML's.
	Return string `json:"error"`
	// Reason is the whole error: which call failed.
	Reason string `json:"reason"`
	// Err is the error itself (not serialized).
	Err error `json:"-"`
}

// UnusableError is Devices' error when some GPUs could not be read; the
// devices returned with it are the readable ones.
type UnusableError struct {
	GPUs []UnusableGPU
}

func (e *UnusableError) Error() string {
	parts := make([]string, len(e.GPUs))
	for k, u := range e.GPUs {
		parts[k] = fmt.Sprintf("GPU %d: %s", u.Index, u.Reason)
	}
	return "GPUs NVML cannot open: " + strings.Join(parts, "; ")
}

// Unwrap gives each GPU's error, so errors.Is sees NVML's return codes.
func (e *UnusableError) Unwrap() []error {
	out := make([]error, 0, len(e.GPUs))
	for _, u := range e.GPUs {
		if u.Err != nil {
			out = append(out, u.Err)
		}
	}
	return out
}

// SplitUnusable takes Devices' results apart: the readable devices, the
// unusable GPUs, and the error that remains (nil when the only trouble was
// unusable GPUs).
func SplitUnusable(devs []Device, err error) ([]Device, []UnusableGPU, error) {
	var ue *UnusableError
	if errors.As(err, &ue) {
		return devs, ue.GPUs, nil
	}
	return devs, nil, err
}

// Error is an NVML failure: the operation and NVML's return code name
// ("ERROR_IN_USE"). Compare with errors.Is against the sentinels below.
type Error struct {
	Op     string // go-nvml method name: "CreateGpuInstanceWithPlacement"
	GPU    int
	Return string // "ERROR_IN_USE"
}

func (e *Error) Error() string {
	return fmt.Sprintf("nvml %s on GPU %d: %s", e.Op, e.GPU, e.Return)
}

// Is matches sentinels by return code.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Op == "" && t.Return == e.Return
	}
	return false
}

// Sentinels, matched by return code only.
var (
	ErrInUse                 = &Error{Return: "ERROR_IN_USE"}
	ErrInsufficientResources = &Error{Return: "ERROR_INSUFFICIENT_RESOURCES"}
	ErrNotSupported          = &Error{Return: "ERROR_NOT_SUPPORTED"}
	ErrResetRequired         = &Error{Return: "ERROR_RESET_REQUIRED"}
	ErrNotFound              = &Error{Return: "ERROR_NOT_FOUND"}
	ErrInvalidArgument       = &Error{Return: "ERROR_INVALID_ARGUMENT"}
	ErrNoPermission          = &Error{Return: "ERROR_NO_PERMISSION"}
	ErrLibraryNotFound       = &Error{Return: "ERROR_LIBRARY_NOT_FOUND"}
)
