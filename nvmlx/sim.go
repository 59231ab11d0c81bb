package nvmlx

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// SimDriverVersion is the driver version the simulator reports: the one
// the H200 probe ran (testdata/h200-nvml-probe.json), in the driver's own
// form, since NVIDIA's DRA kubelet plugin parses it as a semantic version
// (deviceinfo.go: semver.MustParse; "sim-580.159.04" made it panic).
const SimDriverVersion = "580.159.04"

// SimOptions configure the simulator: --sim-state, --sim-faults and
// --sim-no-reset.
type SimOptions struct {
	// StatePath is the state file; empty keeps the state in memory.
	StatePath string
	// Faults is "Op:N=ERROR_NAME,...": the Nth call (from 1, in this
	// process) of Op fails with that NVML error and changes nothing.
	Faults string
	// NoReset makes GPU reset unavailable, as in a VM with passthrough.
	NoReset bool
}

// Sim is a simulated node behind --nvml sim:SPEC: the real backend (the
// code that runs on real GPUs) over a simulated NVML library that enforces
// what the hardware and driver enforce (see simLib), plus the node around
// it that the backend touches (`nvidia-smi -r`, sysfs). Its state lives in
// a file that survives restarts and is shared like real GPUs: every NVML
// call first re-reads the file when another process replaced it (an `apply`
// or `sim reboot` beside a running daemon is seen, as NVML would show it).
// Writes are atomic. Methods are safe for concurrent use.
//
// GPU returns the backend, so a Sim is an nvmlx.GPU; AddProcess,
// RemoveProcess, SetHandleError, Mutations, BootCount and Sessions are the test hooks.
type Sim struct {
	*realGPU
	lib *simLib
}

// fileStamp identifies one version of the state file.
type fileStamp struct {
	ino, size int64
	mtime     time.Time
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = int64(sys.Ino)
	}
	return st
}

var _ GPU = (*Sim)(nil)

// NewSim starts a simulator for spec ("h200x8", "a100-40gbx4,h100-80gbx4")
// with NVML open. With o.StatePath, the state is read from that file
// (created, with MIG disabled everywhere, when missing); the file's GPUs
// must be the spec's.
func NewSim(spec string, o SimOptions) (*Sim, error) {
	return newSimWith(spec, o, nil, false)
}

// newSimWith builds the simulated library and the real backend over it;
// idle leaves NVML closed until a call or Begin needs it.
func newSimWith(spec string, o SimOptions, log *slog.Logger, idle bool) (*Sim, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lib, err := newSimLib(spec, o, log)
	if err != nil {
		return nil, err
	}
	cfg := realConfig{
		log:     log,
		library: "simulated NVML (" + strings.TrimPrefix(spec, "sim:") + ")",
		pci:     simPCI{lib: lib},
		lookPath: func(name string) (string, error) {
			if name == "nvidia-smi" {
				return "/usr/bin/nvidia-smi", nil
			}
			return "", exec.ErrNotFound
		},
		run: func(_ context.Context, name string, args ...string) ([]byte, error) {
			if len(args) == 3 && args[0] == "-r" && args[1] == "-i" {
				return lib.smiReset(args[2])
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

// newSimLib reads or creates the state and parses the faults.
func newSimLib(spec string, o SimOptions, log *slog.Logger) (*simLib, error) {
	models, err := ParseSimSpec(spec)
	if err != nil {
		return nil, err
	}
	faults, err := parseFaults(o.Faults)
	if err != nil {
		return nil, err
	}
	s := &simLib{log: log, path: o.StatePath, noReset: o.NoReset, faults: faults,
		calls: map[string]int{}, muts: map[string]int{}, models: models}
	keys := make([]string, len(models))
	for i, m := range models {
		keys[i] = m.Key
	}
	if s.path == "" {
		s.st = newSimState(models)
		return s, nil
	}
	st, err := readSimState(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		st = newSimState(models)
		if err := os.MkdirAll(filepath.Dir(s.path), 0o755); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSimState, err)
		}
		if err := writeSimState(s.path, &st); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSimState, err)
		}
	case err != nil:
		return nil, err
	case !slices.Equal(st.modelKeys(), keys):
		return nil, fmt.Errorf("%w: %s holds GPUs %s, the spec asks for %s (use another --sim-state file or remove this one)",
			ErrSimState, s.path, specOf(st.modelKeys()), specOf(keys))
	}
	s.st, s.stamp = st, stampOf(s.path)
	return s, nil
}

// AddProcess puts a process on a GPU (persisted), for tests and demos: with
// p.GIID < 0 on the whole GPU (stored as GIID and CIID -1), else on compute
// instance p.CIID of GPU instance p.GIID (GI ids start at 0: the whole-GPU
// instance), which must exist.
func (s *Sim) AddProcess(gpu int, p Process) error {
	return s.editGPU(gpu, func(g *simGPU) error {
		if p.GIID >= 0 {
			if findCI(g, p.GIID, p.CIID) == nil {
				return fmt.Errorf("sim: no compute instance %d in GPU instance %d on GPU %d", p.CIID, p.GIID, gpu)
			}
		} else {
			p.GIID, p.CIID = -1, -1
		}
		if slices.ContainsFunc(g.Processes, func(q Process) bool { return q.PID == p.PID }) {
			return fmt.Errorf("sim: process %d already on GPU %d", p.PID, gpu)
		}
		g.Processes = append(g.Processes, p)
		return nil
	})
}

// editGPU runs f on GPU gpu of a copy of the state (for the test and demo
// hooks) and, when f returns nil, writes that copy: all or nothing.
func (s *Sim) editGPU(gpu int, f func(g *simGPU) error) error {
	l := s.lib
	l.lockWrite()
	defer l.unlock()
	next := l.st.clone()
	g, _ := l.gpu(&next, gpu)
	if g == nil {
		return fmt.Errorf("sim: no GPU %d", gpu)
	}
	if err := f(g); err != nil {
		return err
	}
	return l.commit(next)
}

// SetHandleError makes every handle lookup of a GPU answer ret
// ("ERROR_NO_PERMISSION": a GPU this process may not open, as with a
// device node it has no access to), persisted; "" makes it openable again.
// nvmlDeviceGetCount still counts it (nvml.h nvmlDeviceGetCount_v2).
func (s *Sim) SetHandleError(gpu int, ret string) error {
	if ret != "" && simReturnByName(ret) == nvml.ERROR_UNKNOWN && ret != "ERROR_UNKNOWN" {
		return fmt.Errorf("sim: %q is no NVML return name", ret)
	}
	return s.editGPU(gpu, func(g *simGPU) error {
		g.HandleError = ret
		return nil
	})
}

// RemoveProcess takes process pid off a GPU (persisted).
func (s *Sim) RemoveProcess(gpu int, pid uint32) error {
	return s.editGPU(gpu, func(g *simGPU) error {
		n := len(g.Processes)
		g.Processes = slices.DeleteFunc(g.Processes, func(q Process) bool { return q.PID == pid })
		if len(g.Processes) == n {
			return fmt.Errorf("sim: no process %d on GPU %d", pid, gpu)
		}
		return nil
	})
}

// Mutations counts the successful state-changing NVML calls per operation
// (OpCreateGpuInstanceWithPlacement, OpCreateGpuInstance (the driver-placed
// creation NVIDIA's mig-parted makes), OpCreateComputeInstance,
// OpGpuInstanceDestroy, OpComputeInstanceDestroy, OpSetMigMode, OpResetGpu)
// since NewSim.
func (s *Sim) Mutations() map[string]int {
	s.lib.lock()
	defer s.lib.unlock()
	return maps.Clone(s.lib.muts)
}

// BootCount is how many times SimReboot has run on this state.
func (s *Sim) BootCount() int {
	s.lib.lock()
	defer s.lib.unlock()
	return s.lib.st.BootCount
}

// Sessions counts the nvmlInit and nvmlShutdown calls every process made on
// this state; equal when no NVML session is open.
func (s *Sim) Sessions() (inits, shutdowns int) {
	s.lib.lock()
	defer s.lib.unlock()
	c := readSessions(s.lib.path, s.lib.sessions)
	return c.Inits, c.Shutdowns
}
