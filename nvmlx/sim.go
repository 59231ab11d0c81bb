package nvmlx

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
)

// Sim is a simulated node behind --nvml sim:SPEC: the real backend (the
// code that runs on real GPUs) over the simulated NVML library of package
// nvmlsim, which enforces what the hardware and driver enforce, plus the
// node around it that the backend touches (`nvidia-smi -r`, sysfs). Its
// state lives in a file that survives restarts and is shared like real
// GPUs: every NVML call first re-reads the file when another process
// replaced it (an `apply` or `sim reboot` beside a running daemon is seen,
// as NVML would show it). Writes are atomic. Methods are safe for
// concurrent use.
//
// GPU returns the backend, so a Sim is an nvmlx.GPU; AddProcess,
// RemoveProcess, SetHandleError, Mutations, BootCount and Sessions are the
// test hooks.
type Sim struct {
	*realGPU
	lib *nvmlsim.Lib
}

var _ GPU = (*Sim)(nil)

// NewSim starts a simulator for spec ("h200x8", "a100-40gbx4,h100-80gbx4")
// with NVML open. With o.StatePath, the state is read from that file
// (created, with MIG disabled everywhere, when missing); the file's GPUs
// must be the spec's.
func NewSim(spec string, o nvmlsim.Options) (*Sim, error) {
	return newSimWith(spec, o, nil, false)
}

// newSimWith builds the simulated library and the real backend over it;
// idle leaves NVML closed until a call or Begin needs it.
func newSimWith(spec string, o nvmlsim.Options, log *slog.Logger, idle bool) (*Sim, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lib, err := nvmlsim.New(spec, o, log)
	if err != nil {
		return nil, err
	}
	cfg := realConfig{
		log:     log,
		library: "simulated NVML (" + strings.TrimPrefix(spec, "sim:") + ")",
		pci:     lib.PCI(),
		lookPath: func(name string) (string, error) {
			if name == "nvidia-smi" {
				return "/usr/bin/nvidia-smi", nil
			}
			return "", exec.ErrNotFound
		},
		run: func(_ context.Context, name string, args ...string) ([]byte, error) {
			if len(args) == 3 && args[0] == "-r" && args[1] == "-i" {
				return lib.SMIReset(args[2])
			}
			return nil, fmt.Errorf("simulated node: %s %v is not simulated", name, args)
		},
		load: func() (nvml.Interface, string, error) { return lib, "simulated NVML", nil },
	}
	g, err := newRealBackend(cfg, idle)
	if err != nil {
		return nil, err
	}
	return &Sim{realGPU: g, lib: lib}, nil
}

// AddProcess puts a process on a GPU (persisted), for tests and demos: with
// p.GIID < 0 on the whole GPU (stored as GIID and CIID -1), else on compute
// instance p.CIID of GPU instance p.GIID (GI ids start at 0: the whole-GPU
// instance), which must exist.
func (s *Sim) AddProcess(gpu int, p Process) error {
	return s.lib.AddProcess(gpu, nvmlsim.Process(p))
}

// SetHandleError makes every handle lookup of a GPU answer ret
// ("ERROR_NO_PERMISSION": a GPU this process may not open, as with a
// device node it has no access to), persisted; "" makes it openable again.
// nvmlDeviceGetCount still counts it (nvml.h nvmlDeviceGetCount_v2).
func (s *Sim) SetHandleError(gpu int, ret string) error { return s.lib.SetHandleError(gpu, ret) }

// RemoveProcess takes process pid off a GPU (persisted).
func (s *Sim) RemoveProcess(gpu int, pid uint32) error { return s.lib.RemoveProcess(gpu, pid) }

// Mutations counts the successful state-changing NVML calls per operation
// (nvmlsim.OpCreateGpuInstanceWithPlacement, ...) since NewSim.
func (s *Sim) Mutations() map[string]int { return s.lib.Mutations() }

// BootCount is how many times nvmlsim.Reboot has run on this state.
func (s *Sim) BootCount() int { return s.lib.BootCount() }

// Sessions counts the nvmlInit and nvmlShutdown calls every process made on
// this state; equal when no NVML session is open.
func (s *Sim) Sessions() (inits, shutdowns int) { return s.lib.Sessions() }
