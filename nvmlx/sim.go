package nvmlx

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/migagent/mig-agent/profiles"
)

// SimDriverVersion is the driver version the simulator reports.
const SimDriverVersion = "sim-580.159.04"

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

// Sim is the stateful GPU simulator behind --nvml sim:SPEC. It enforces
// what the hardware and driver enforce (MIG mode, profiles, max counts,
// placements, memory-slice overlap, compute capacity, processes, Ampere's
// pending mode) and keeps its state in a file that survives restarts.
// GPU instances that own media engines (OFAs: the +me profiles and the full
// GPU) cannot together own more than the GPU has, so A30's 1g.6gb+me and
// 2g.12gb+me exclude each other. Compute capacity is counted in compute
// slices (their sum within a GPU instance) and per-profile max counts;
// compute-instance placements are not modelled. GPU instance ids are the
// smallest free from 1, compute instance ids the smallest free from 0.
//
// Hopper and later: SetMigMode takes effect at once; when a process is on
// the GPU the requested mode stays pending (current unchanged) and the call
// returns an error wrapping ErrInUse, as nvidia-smi's "pending enable state
// ... In use by another client". Ampere: SetMigMode only sets the pending
// mode (and returns no error); ResetGPU or SimReboot makes it current.
//
// A state file is the simulated hardware, shared like real GPUs: every
// method first re-reads the file when another process replaced it since
// this Sim last read or wrote it (an `apply` or `sim reboot` beside a
// running daemon is seen, as NVML would show it). Writes are atomic.
// Methods are safe for concurrent use.
type Sim struct {
	mu      sync.Mutex
	path    string
	noReset bool
	faults  faultPlan
	calls   map[string]int // per operation, every call
	muts    map[string]int // per operation, successful mutating calls
	models  []*profiles.Model
	st      simState
	stamp   fileStamp // the state file as this Sim last read or wrote it
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

// lock takes the mutex and picks up a state file another process wrote.
// A file that cannot be read back keeps the state in memory.
func (s *Sim) lock() {
	s.mu.Lock()
	if s.path == "" {
		return
	}
	if now := stampOf(s.path); now != s.stamp {
		if st, err := readSimState(s.path); err == nil && slices.Equal(st.modelKeys(), s.st.modelKeys()) {
			s.st, s.stamp = st, now
		}
	}
}

var _ GPU = (*Sim)(nil)

// NewSim starts a simulator for spec ("h200x8", "a100-40gbx4,h100-80gbx4").
// With o.StatePath, the state is read from that file (created, with MIG
// disabled everywhere, when missing); the file's GPUs must be the spec's.
func NewSim(spec string, o SimOptions) (*Sim, error) {
	models, err := ParseSimSpec(spec)
	if err != nil {
		return nil, err
	}
	faults, err := parseFaults(o.Faults)
	if err != nil {
		return nil, err
	}
	s := &Sim{path: o.StatePath, noReset: o.NoReset, faults: faults,
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

// fault counts one call of each op and returns the injected error of the
// first op whose call number has a fault planned.
func (s *Sim) fault(gpu int, ops ...string) error {
	var err error
	for _, op := range ops {
		s.calls[op]++
		if name, ok := s.faults[op][s.calls[op]]; ok && err == nil {
			err = fmt.Errorf("injected by --sim-faults %s:%d: %w", op, s.calls[op], &Error{Op: op, GPU: gpu, Return: name})
		}
	}
	return err
}

// nvErr builds an NVML error with context.
func nvErr(op string, gpu int, ret, format string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), &Error{Op: op, GPU: gpu, Return: ret})
}

// device returns GPU i of st and its model.
func (s *Sim) device(st *simState, i int) (*simGPU, *profiles.Model, error) {
	if i < 0 || i >= len(st.GPUs) {
		return nil, nil, nvErr("DeviceGetHandleByIndex", i, "ERROR_INVALID_ARGUMENT", "no GPU %d (%d GPUs)", i, len(st.GPUs))
	}
	return &st.GPUs[i], s.models[i], nil
}

// commit makes next the state: written to the file first, kept in memory
// only when that worked.
func (s *Sim) commit(next simState) error {
	if s.path != "" {
		if err := writeSimState(s.path, &next); err != nil {
			return err
		}
		s.stamp = stampOf(s.path)
	}
	s.st = next
	return nil
}

// mutate runs f on a copy of the state and commits the copy when f
// succeeds. f returns whether to commit even though it failed (a change the
// error reports, like a mode left pending).
func (s *Sim) mutate(op string, f func(st *simState) (keep bool, err error)) error {
	next := s.st.clone()
	keep, err := f(&next)
	if err != nil && !keep {
		return err
	}
	if cerr := s.commit(next); cerr != nil {
		return cerr
	}
	if err == nil {
		s.muts[op]++
	}
	return err
}

// Devices lists the simulated GPUs.
func (s *Sim) Devices() ([]Device, error) {
	s.lock()
	defer s.mu.Unlock()
	out := make([]Device, len(s.st.GPUs))
	for i, g := range s.st.GPUs {
		m := s.models[i]
		out[i] = Device{
			Index: i, UUID: g.UUID, Name: m.Name, PCIDeviceID: m.PCIDeviceID, PCIBusID: g.PCIBusID,
			MemoryMiB: m.MemoryMiB(), Architecture: m.Architecture, MigCapable: m.MigCapable,
			MigMode: MigMode{Current: g.MigCurrent, Pending: g.MigPending}, Catalogue: cloneCatalogue(m.Catalogue),
		}
	}
	return out, nil
}

func cloneCatalogue(c profiles.Catalogue) profiles.Catalogue {
	out := profiles.Catalogue{MemorySlices: c.MemorySlices}
	for _, p := range c.Profiles {
		p.Placements = slices.Clone(p.Placements)
		p.ComputeProfiles = slices.Clone(p.ComputeProfiles)
		out.Profiles = append(out.Profiles, p)
	}
	return out
}

// DriverVersion is SimDriverVersion.
func (s *Sim) DriverVersion() (string, error) { return SimDriverVersion, nil }

// Instances lists a GPU's instances, by placement start.
func (s *Sim) Instances(gpu int) ([]GPUInstance, error) {
	s.lock()
	defer s.mu.Unlock()
	g, m, err := s.device(&s.st, gpu)
	if err != nil {
		return nil, err
	}
	out := []GPUInstance{}
	for _, gi := range g.Instances {
		p, _ := m.Catalogue.ByID(gi.ProfileID)
		x := GPUInstance{ID: gi.ID, ProfileID: gi.ProfileID, Profile: p.Name, Placement: gi.Placement,
			ComputeInstances: []ComputeInstance{}}
		for _, ci := range gi.ComputeInstances {
			cp, _ := computeByID(p, ci.ProfileID)
			x.ComputeInstances = append(x.ComputeInstances, ComputeInstance{ID: ci.ID, ProfileID: ci.ProfileID, Profile: cp.Name, UUID: ci.UUID})
		}
		out = append(out, x)
	}
	slices.SortFunc(out, func(a, b GPUInstance) int { return a.Placement.Start - b.Placement.Start })
	return out, nil
}

func computeByID(p *profiles.Profile, id int) (*profiles.ComputeProfile, bool) {
	for i := range p.ComputeProfiles {
		if p.ComputeProfiles[i].ID == id {
			return &p.ComputeProfiles[i], true
		}
	}
	return nil, false
}

func findGI(g *simGPU, id int) *simGI {
	for i := range g.Instances {
		if g.Instances[i].ID == id {
			return &g.Instances[i]
		}
	}
	return nil
}

// SetMigMode sets the MIG mode as the GPU's architecture does (see Sim).
func (s *Sim) SetMigMode(gpu int, enabled bool) (MigMode, error) {
	s.lock()
	defer s.mu.Unlock()
	if err := s.fault(gpu, OpSetMigMode); err != nil {
		return s.modeOf(gpu), err
	}
	err := s.mutate(OpSetMigMode, func(st *simState) (bool, error) {
		g, m, err := s.device(st, gpu)
		if err != nil {
			return false, err
		}
		if !m.MigCapable {
			return false, nvErr(OpSetMigMode, gpu, "ERROR_NOT_SUPPORTED", "%s cannot do MIG", m.Name)
		}
		if !enabled && len(g.Instances) > 0 {
			return false, nvErr(OpSetMigMode, gpu, "ERROR_IN_USE", "%d GPU instances exist", len(g.Instances))
		}
		g.MigPending = enabled
		if m.Architecture == profiles.ArchAmpere || g.MigCurrent == enabled {
			return false, nil // Ampere: pending until a reset or reboot
		}
		if len(g.Processes) > 0 {
			return true, nvErr(OpSetMigMode, gpu, "ERROR_IN_USE", "%d processes on the GPU; mode stays pending", len(g.Processes))
		}
		g.MigCurrent = enabled
		return false, nil
	})
	return s.modeOf(gpu), err
}

func (s *Sim) modeOf(gpu int) MigMode {
	if gpu < 0 || gpu >= len(s.st.GPUs) {
		return MigMode{}
	}
	g := &s.st.GPUs[gpu]
	return MigMode{Current: g.MigCurrent, Pending: g.MigPending}
}

// migOn checks that GPU instances can exist on g now.
func migOn(op string, gpu int, g *simGPU, m *profiles.Model) error {
	if !m.MigCapable {
		return nvErr(op, gpu, "ERROR_NOT_SUPPORTED", "%s cannot do MIG", m.Name)
	}
	if !g.MigCurrent {
		return nvErr(op, gpu, "ERROR_NOT_SUPPORTED", "MIG mode is not enabled (pending %v)", g.MigPending)
	}
	return nil
}

// ofaTotal is the number of optical-flow accelerators the GPU has: what its
// largest owner reports. +me profiles own one, so they exclude each other.
func ofaTotal(m *profiles.Model) int {
	n := 0
	for _, p := range m.Catalogue.Profiles {
		n = max(n, p.OFAs)
	}
	return n
}

// CreateGPUInstance creates a GPU instance of profileID at placement at.
func (s *Sim) CreateGPUInstance(gpu, profileID int, at profiles.Placement) (int, error) {
	const op = OpCreateGpuInstanceWithPlacement
	s.lock()
	defer s.mu.Unlock()
	if err := s.fault(gpu, op, OpCreateGpuInstance); err != nil {
		return 0, err
	}
	var id int
	err := s.mutate(op, func(st *simState) (bool, error) {
		g, m, err := s.device(st, gpu)
		if err != nil {
			return false, err
		}
		if err := migOn(op, gpu, g, m); err != nil {
			return false, err
		}
		p, ok := m.Catalogue.ByID(profileID)
		if !ok {
			return false, nvErr(op, gpu, "ERROR_INVALID_ARGUMENT", "no GPU instance profile id %d on %s", profileID, m.Name)
		}
		if !slices.Contains(p.Placements, at) {
			return false, nvErr(op, gpu, "ERROR_INVALID_ARGUMENT", "%s cannot be placed at %v (placements %v)", p.Name, at, p.Placements)
		}
		count, ofas := 0, p.OFAs
		for _, gi := range g.Instances {
			q, _ := m.Catalogue.ByID(gi.ProfileID)
			if gi.ProfileID == profileID {
				count++
			}
			ofas += q.OFAs
			if gi.Placement.Overlaps(at) {
				return false, nvErr(op, gpu, "ERROR_INSUFFICIENT_RESOURCES", "%s at %v overlaps GPU instance %d (%s at %v)",
					p.Name, at, gi.ID, q.Name, gi.Placement)
			}
		}
		if count >= p.MaxCount {
			return false, nvErr(op, gpu, "ERROR_INSUFFICIENT_RESOURCES", "%s: %d of at most %d exist", p.Name, count, p.MaxCount)
		}
		if ofas > ofaTotal(m) {
			return false, nvErr(op, gpu, "ERROR_INSUFFICIENT_RESOURCES", "%s: media engines already owned by another GPU instance", p.Name)
		}
		id = 1
		for findGI(g, id) != nil {
			id++
		}
		g.Instances = append(g.Instances, simGI{ID: id, ProfileID: profileID, Placement: at, ComputeInstances: []simCI{}})
		return false, nil
	})
	if err != nil {
		return 0, err
	}
	return id, nil
}

// CreateComputeInstance creates a compute instance of ciProfileID in GPU
// instance gi.
func (s *Sim) CreateComputeInstance(gpu, gi, ciProfileID int) (ComputeInstance, error) {
	const op = OpCreateComputeInstance
	s.lock()
	defer s.mu.Unlock()
	if err := s.fault(gpu, op); err != nil {
		return ComputeInstance{}, err
	}
	var out ComputeInstance
	err := s.mutate(op, func(st *simState) (bool, error) {
		g, m, err := s.device(st, gpu)
		if err != nil {
			return false, err
		}
		if err := migOn(op, gpu, g, m); err != nil {
			return false, err
		}
		x := findGI(g, gi)
		if x == nil {
			return false, nvErr("GetGpuInstanceById", gpu, "ERROR_NOT_FOUND", "no GPU instance %d", gi)
		}
		p, _ := m.Catalogue.ByID(x.ProfileID)
		cp, ok := computeByID(p, ciProfileID)
		if !ok {
			return false, nvErr(op, gpu, "ERROR_INVALID_ARGUMENT", "no compute profile id %d in %s", ciProfileID, p.Name)
		}
		count, used := 0, cp.Slices
		for _, ci := range x.ComputeInstances {
			c, _ := computeByID(p, ci.ProfileID)
			used += c.Slices
			if ci.ProfileID == ciProfileID {
				count++
			}
		}
		if count >= cp.MaxCount || used > p.Slices {
			return false, nvErr(op, gpu, "ERROR_INSUFFICIENT_RESOURCES", "%s does not fit in GPU instance %d (%s): %d of %d compute slices in use",
				cp.Name, gi, p.Name, used-cp.Slices, p.Slices)
		}
		id := 0
		for slices.ContainsFunc(x.ComputeInstances, func(c simCI) bool { return c.ID == id }) {
			id++
		}
		ci := simCI{ID: id, ProfileID: ciProfileID, UUID: simMIGUUID(g.UUID, x.ProfileID, x.Placement.Start, ciProfileID, id)}
		x.ComputeInstances = append(x.ComputeInstances, ci)
		out = ComputeInstance{ID: ci.ID, ProfileID: ci.ProfileID, Profile: cp.Name, UUID: ci.UUID}
		return false, nil
	})
	if err != nil {
		return ComputeInstance{}, err
	}
	return out, nil
}

// DestroyComputeInstance destroys compute instance ci of GPU instance gi.
func (s *Sim) DestroyComputeInstance(gpu, gi, ci int) error {
	const op = OpComputeInstanceDestroy
	return s.onGI(op, gpu, gi, func(g *simGPU, x *simGI) error {
		i := slices.IndexFunc(x.ComputeInstances, func(c simCI) bool { return c.ID == ci })
		if i < 0 {
			return nvErr("GetComputeInstanceById", gpu, "ERROR_NOT_FOUND", "no compute instance %d in GPU instance %d", ci, gi)
		}
		for _, p := range g.Processes {
			if p.GIID == gi && p.CIID == ci {
				return nvErr(op, gpu, "ERROR_IN_USE", "process %d runs on compute instance %d of GPU instance %d", p.PID, ci, gi)
			}
		}
		x.ComputeInstances = slices.Delete(x.ComputeInstances, i, i+1)
		return nil
	})
}

// DestroyGPUInstance destroys GPU instance gi; its compute instances must be
// gone first.
func (s *Sim) DestroyGPUInstance(gpu, gi int) error {
	const op = OpGpuInstanceDestroy
	return s.onGI(op, gpu, gi, func(g *simGPU, x *simGI) error {
		for _, p := range g.Processes {
			if p.GIID == gi {
				return nvErr(op, gpu, "ERROR_IN_USE", "process %d runs on GPU instance %d", p.PID, gi)
			}
		}
		if n := len(x.ComputeInstances); n > 0 {
			return nvErr(op, gpu, "ERROR_IN_USE", "GPU instance %d still has %d compute instances", gi, n)
		}
		g.Instances = slices.DeleteFunc(g.Instances, func(y simGI) bool { return y.ID == gi })
		return nil
	})
}

// onGI runs destroy-like operation op on GPU instance gi of GPU gpu: an
// injected fault first, then f on a copy of the state, committed when f
// succeeds.
func (s *Sim) onGI(op string, gpu, gi int, f func(g *simGPU, x *simGI) error) error {
	s.lock()
	defer s.mu.Unlock()
	if err := s.fault(gpu, op); err != nil {
		return err
	}
	return s.mutate(op, func(st *simState) (bool, error) {
		g, _, err := s.device(st, gpu)
		if err != nil {
			return false, err
		}
		x := findGI(g, gi)
		if x == nil {
			return false, nvErr("GetGpuInstanceById", gpu, "ERROR_NOT_FOUND", "no GPU instance %d", gi)
		}
		return false, f(g, x)
	})
}

// CanReset is false with --sim-no-reset.
func (s *Sim) CanReset(gpu int) (bool, string) {
	s.lock()
	defer s.mu.Unlock()
	if gpu < 0 || gpu >= len(s.st.GPUs) {
		return false, fmt.Sprintf("no GPU %d", gpu)
	}
	if s.noReset {
		return false, "GPU reset is not available (--sim-no-reset)"
	}
	return true, ""
}

// ResetGPU resets one GPU: its pending MIG mode becomes current and its
// GPU and compute instances are gone. It fails with ErrInUse while a
// process is on the GPU and ErrNotSupported with --sim-no-reset.
func (s *Sim) ResetGPU(gpu int) error {
	const op = OpResetGpu
	s.lock()
	defer s.mu.Unlock()
	if err := s.fault(gpu, op); err != nil {
		return err
	}
	return s.mutate(op, func(st *simState) (bool, error) {
		g, _, err := s.device(st, gpu)
		if err != nil {
			return false, err
		}
		if s.noReset {
			return false, nvErr(op, gpu, "ERROR_NOT_SUPPORTED", "GPU reset is not available (--sim-no-reset)")
		}
		if len(g.Processes) > 0 {
			return false, nvErr(op, gpu, "ERROR_IN_USE", "%d processes on the GPU", len(g.Processes))
		}
		g.MigCurrent = g.MigPending
		g.Instances = []simGI{}
		return false, nil
	})
}

// Processes lists the processes on a GPU.
func (s *Sim) Processes(gpu int) ([]Process, error) {
	s.lock()
	defer s.mu.Unlock()
	g, _, err := s.device(&s.st, gpu)
	if err != nil {
		return nil, err
	}
	return slices.Clone(g.Processes), nil
}

// Close does nothing: every change is already in the state file.
func (s *Sim) Close() error { return nil }

// AddProcess puts a process on a GPU (persisted), for tests and demos: with
// p.GIID ≤ 0 on the whole GPU (stored as GIID and CIID -1; the simulator's
// GI ids start at 1), else on compute instance p.CIID of GPU instance
// p.GIID, which must exist.
func (s *Sim) AddProcess(gpu int, p Process) error {
	s.lock()
	defer s.mu.Unlock()
	next := s.st.clone()
	g, _, err := s.device(&next, gpu)
	if err != nil {
		return err
	}
	if p.GIID > 0 {
		x := findGI(g, p.GIID)
		if x == nil || !slices.ContainsFunc(x.ComputeInstances, func(c simCI) bool { return c.ID == p.CIID }) {
			return fmt.Errorf("sim: no compute instance %d in GPU instance %d on GPU %d", p.CIID, p.GIID, gpu)
		}
	} else {
		p.GIID, p.CIID = -1, -1
	}
	if slices.ContainsFunc(g.Processes, func(q Process) bool { return q.PID == p.PID }) {
		return fmt.Errorf("sim: process %d already on GPU %d", p.PID, gpu)
	}
	g.Processes = append(g.Processes, p)
	return s.commit(next)
}

// RemoveProcess takes process pid off a GPU (persisted).
func (s *Sim) RemoveProcess(gpu int, pid uint32) error {
	s.lock()
	defer s.mu.Unlock()
	next := s.st.clone()
	g, _, err := s.device(&next, gpu)
	if err != nil {
		return err
	}
	n := len(g.Processes)
	g.Processes = slices.DeleteFunc(g.Processes, func(q Process) bool { return q.PID == pid })
	if len(g.Processes) == n {
		return fmt.Errorf("sim: no process %d on GPU %d", pid, gpu)
	}
	return s.commit(next)
}

// Mutations counts the successful state-changing calls per operation
// (OpCreateGpuInstanceWithPlacement, OpCreateComputeInstance,
// OpGpuInstanceDestroy, OpComputeInstanceDestroy, OpSetMigMode, OpResetGpu)
// since NewSim.
func (s *Sim) Mutations() map[string]int {
	s.lock()
	defer s.mu.Unlock()
	return maps.Clone(s.muts)
}

// BootCount is how many times SimReboot has run on this state.
func (s *Sim) BootCount() int {
	s.lock()
	defer s.mu.Unlock()
	return s.st.BootCount
}
