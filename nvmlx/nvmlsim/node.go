package nvmlsim

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
)

// DriverVersion is the driver version the simulator reports: the one
// the H200 probe ran (testdata/h200-nvml-probe.json), in the driver's own
// form, since NVIDIA's DRA kubelet plugin parses it as a semantic version
// (deviceinfo.go: semver.MustParse; "sim-580.159.04" made it panic).
const DriverVersion = "580.159.04"

// Options configure the simulator: --sim-state, --sim-faults and
// --sim-no-reset.
type Options struct {
	// StatePath is the state file; empty keeps the state in memory.
	StatePath string
	// Faults is "Op:N=ERROR_NAME,...": the Nth call (from 1, in this
	// process) of Op fails with that NVML error and changes nothing.
	Faults string
	// NoReset makes GPU reset unavailable, as in a VM with passthrough.
	NoReset bool
}

// New opens the simulated NVML library for spec ("h200x8",
// "a100-40gbx4,h100-80gbx4"; a leading "sim:" is allowed), not initialized:
// with o.StatePath, the state is read from that file (created, with MIG
// disabled everywhere, when missing), whose GPUs must be the spec's; the
// faults are parsed. log receives the library's logs; nil discards them.
func New(spec string, o Options, log *slog.Logger) (*Lib, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	models, err := ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	faults, err := parseFaults(o.Faults)
	if err != nil {
		return nil, err
	}
	s := &Lib{log: log, path: o.StatePath, noReset: o.NoReset, faults: faults,
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
			return nil, fmt.Errorf("%w: %w", ErrState, err)
		}
		if err := writeSimState(s.path, &st); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrState, err)
		}
	case err != nil:
		return nil, err
	case !slices.Equal(st.modelKeys(), keys):
		return nil, fmt.Errorf("%w: %s holds GPUs %s, the spec asks for %s (use another --sim-state file or remove this one)",
			ErrState, s.path, specOf(st.modelKeys()), specOf(keys))
	}
	s.st, s.stamp = st, stampOf(s.path)
	return s, nil
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

// Process is a process on a simulated GPU: GIID and CIID -1 when it runs
// on the whole GPU. Its fields are nvmlx.Process's, so one converts to the
// other.
type Process struct {
	PID  uint32 `json:"pid"`
	GIID int    `json:"giId"`
	CIID int    `json:"ciId"`
	Name string `json:"name,omitempty"`
}

// AddProcess puts a process on a GPU (persisted), for tests and demos: with
// p.GIID < 0 on the whole GPU (stored as GIID and CIID -1), else on compute
// instance p.CIID of GPU instance p.GIID (GI ids start at 0: the whole-GPU
// instance), which must exist.
func (l *Lib) AddProcess(gpu int, p Process) error {
	return l.editGPU(gpu, func(g *simGPU) error {
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
func (l *Lib) editGPU(gpu int, f func(g *simGPU) error) error {
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
func (l *Lib) SetHandleError(gpu int, ret string) error {
	if _, ok := nvmlreturn.ByName(ret); ret != "" && !ok {
		return fmt.Errorf("sim: %q is no NVML return name", ret)
	}
	return l.editGPU(gpu, func(g *simGPU) error {
		g.HandleError = ret
		return nil
	})
}

// SetMigModes sets a GPU's current and pending MIG modes (persisted), as a
// captured GPU had them; a GPU holding instances keeps MIG on.
func (l *Lib) SetMigModes(gpu int, current, pending bool) error {
	return l.editGPU(gpu, func(g *simGPU) error {
		if len(g.Instances) > 0 && !current {
			return fmt.Errorf("sim: GPU %d holds GPU instances: MIG stays on", gpu)
		}
		g.MigCurrent, g.MigPending = current, pending
		return nil
	})
}

// RemoveProcess takes process pid off a GPU (persisted).
func (l *Lib) RemoveProcess(gpu int, pid uint32) error {
	return l.editGPU(gpu, func(g *simGPU) error {
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
// since New.
func (l *Lib) Mutations() map[string]int {
	l.lock()
	defer l.unlock()
	return maps.Clone(l.muts)
}

// BootCount is how many times Reboot has run on this state.
func (l *Lib) BootCount() int {
	l.lock()
	defer l.unlock()
	return l.st.BootCount
}

// Sessions counts the nvmlInit and nvmlShutdown calls every process made on
// this state; equal when no NVML session is open.
func (l *Lib) Sessions() (inits, shutdowns int) {
	l.lock()
	defer l.unlock()
	c := readSessions(l.path, l.sessions)
	return c.Inits, c.Shutdowns
}

// --- the node around NVML: nvidia-smi -r and sysfs ----------------------------

// SMIReset is `nvidia-smi -r -i BUSID` on the simulated node. Like the real
// one it refuses while any client holds the GPU, this process's own NVML
// session included (nvidia-smi lists the processes using the device), while
// processes run on it, and where no reset is exposed ("Resetting GPU ... is
// not supported", gpu-operator issue 1606). A reset makes the pending MIG
// mode current and drops every GPU and compute instance.
func (l *Lib) SMIReset(busID string) ([]byte, error) {
	l.lockWrite()
	defer l.unlock()
	gpu := slices.IndexFunc(l.st.GPUs, func(g simGPU) bool { return g.PCIBusID == busID })
	if gpu < 0 {
		return []byte(fmt.Sprintf("No devices were found matching %s.\n", busID)), simExit(6)
	}
	if ret := l.fault(gpu, OpResetGpu); ret != nvml.SUCCESS {
		return []byte(fmt.Sprintf("Resetting GPU %s failed (injected %s).\n", busID, nvmlreturn.Name(ret))), simExit(255)
	}
	if l.noReset {
		return []byte(fmt.Sprintf("Resetting GPU %s is not supported.\n", busID)), simExit(3)
	}
	if l.up() {
		return []byte(fmt.Sprintf("GPU %s is currently in use by another process (an NVML session of mig-agent).\n", busID)), simExit(255)
	}
	ret := l.mutate(OpResetGpu, func(st *simState) (bool, nvml.Return) {
		g := &st.GPUs[gpu]
		if len(g.Processes) > 0 {
			return false, nvml.ERROR_IN_USE
		}
		g.MigCurrent = g.MigPending
		g.Instances = []simGI{}
		return false, nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return []byte(fmt.Sprintf("GPU %s is currently in use by another process.\n", busID)), simExit(255)
	}
	return []byte(fmt.Sprintf("GPU %s was successfully reset.\n", busID)), nil
}

// PCI is the simulated node's sysfs: every GPU is bound to the nvidia
// driver and has a function reset, except with --sim-no-reset.
type PCI struct{ lib *Lib }

// PCI is the node's sysfs around this library.
func (l *Lib) PCI() PCI { return PCI{lib: l} }

// HasReset reports whether the GPU exposes a function reset.
func (p PCI) HasReset(string) (bool, error) { return !p.lib.noReset, nil }

// Driver is the kernel driver bound to the GPU: always nvidia.
func (p PCI) Driver(string) (string, error) { return "nvidia", nil }

// Reset is a sysfs function reset, refused while nvidia is bound.
func (p PCI) Reset(bdf string) error {
	return fmt.Errorf("sysfs reset of %s while the nvidia driver is bound: refused", bdf)
}

// simExit is a simulated command's exit status, like *exec.ExitError.
type simExit int

func (e simExit) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
func (e simExit) ExitCode() int { return int(e) }
