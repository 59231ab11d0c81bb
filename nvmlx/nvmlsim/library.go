// Package nvmlsim is a simulated NVML library: go-nvml's nvml.Interface over
// a simulated node's state (GPUs, MIG modes, GPU and compute instances,
// processes), kept in memory or in a --sim-state file shared by processes,
// with the hardware's and driver's rules (library.go), the calls NVIDIA's
// own tools make (tools.go) and the node around NVML (node.go:
// `nvidia-smi -r`, sysfs, the test hooks). nvmlx runs its real backend over
// it for --nvml sim:SPEC (nvmlx.Sim); NewSimNVML gives the library alone.
package nvmlsim

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
	"github.com/migagent/mig-agent/profiles"
)

// Lib is the simulated NVML library: go-nvml's nvml.Interface over the
// simulator's state, with the hardware's and driver's rules (each rule names
// its source; TestSimRules checks them one by one). The real backend runs on
// it unchanged, so every test and scenario exercises the code that runs on
// real GPUs.
//
// Implemented is what the real backend calls and what NVIDIA's
// mig-parted apply path and DRA kubelet plugin enumeration call
// (simImplemented; tools.go names each tool's calls with their
// sources). The embedded interfaces are nil: any other method panics with a
// nil dereference when called, so a backend change that starts calling a
// new NVML function fails loudly in every test until the simulator learns it.
type Lib struct {
	nvml.Interface // nil: unimplemented methods panic

	log *slog.Logger

	mu      sync.Mutex
	path    string
	noReset bool
	faults  faultPlan
	calls   map[string]int // per operation, every call
	muts    map[string]int // per operation, successful mutating calls
	models  []*profiles.Model
	st      simState
	stamp   fileStamp // the state file as this process last read or wrote it
	dirLock *os.File  // held between lock and unlock
	refs    int       // nvmlInit reference count in this process
	// sessions counts Init and Shutdown without a state file.
	sessions simSessions
}

// simImplemented lists the NVML functions the simulator implements (go-nvml
// method names; "Device." for nvml.Device, "GpuInstance." and
// "ComputeInstance." for those handles). TestSimImplemented keeps it honest.
var simImplemented = []string{
	"Init", "InitWithFlags", "Shutdown", "Extensions", "SystemGetDriverVersion", "SystemGetNVMLVersion",
	"SystemGetCudaDriverVersion", "SystemGetProcessName",
	"DeviceGetCount", "DeviceGetHandleByIndex", "DeviceGetHandleByUUID", "DeviceGetHandleByPciBusId",
	"Device.GetUUID", "Device.GetName", "Device.GetPciInfo", "Device.GetMemoryInfo", "Device.GetArchitecture",
	"Device.GetMinorNumber", "Device.GetBrand", "Device.GetCudaComputeCapability", "Device.GetAddressingMode",
	"Device.GetDeviceHandleFromMigDeviceHandle", "Device.CreateGpuInstance",
	"Device.GetVirtualizationMode", "Device.GetMigMode", "Device.SetMigMode",
	"Device.GetGpuInstanceProfileInfo", "Device.GetGpuInstancePossiblePlacements", "Device.GetGpuInstances",
	"Device.GetGpuInstanceById", "Device.CreateGpuInstanceWithPlacement",
	"Device.GetMaxMigDeviceCount", "Device.GetMigDeviceHandleByIndex", "Device.IsMigDeviceHandle", "Device.GetIndex",
	"Device.GetAttributes", "Device.GetTopologyCommonAncestor",
	"Device.GetGpuInstanceId", "Device.GetComputeInstanceId",
	"Device.GetComputeRunningProcesses", "Device.GetGraphicsRunningProcesses", "Device.GetMPSComputeRunningProcesses",
	"GpuInstance.GetInfo", "GpuInstance.GetComputeInstanceProfileInfo", "GpuInstance.GetComputeInstances",
	"GpuInstance.GetComputeInstanceById", "GpuInstance.CreateComputeInstance", "GpuInstance.Destroy",
	"ComputeInstance.GetInfo", "ComputeInstance.Destroy",
}

var _ nvml.Interface = (*Lib)(nil)

// simPCISubsystemIDs are the PCI subsystem ids the simulator reports, per
// model key; a model without one reports 0 (unknown), as no capture shows it.
var simPCISubsystemIDs = map[string]uint32{
	"h200": 0x18BF10DE, // fixtures/h200-nvml-probe.json (measured)
}

// simMaxProfileIndex is where the H200 probe's driver 580 starts answering
// INVALID_ARGUMENT instead of NOT_SUPPORTED for GPU instance profile
// indices it does not offer (MIG facts §5, measured).
const simMaxProfileIndex = 17

// notAvailable is the GPU and compute instance id NVML reports for a
// process outside MIG: NVML_VALUE_NOT_AVAILABLE as an unsigned int.
const notAvailable = ^uint32(0)

// --- state plumbing ----------------------------------------------------------

// lock takes the mutex and picks up a state another process wrote: what a
// read needs. Writers replace the file by rename, so a read sees a whole
// state, never a half-written one; reads take no file lock, as reading
// NVML takes none. lockWrite also takes the lock that serializes every
// process's read-modify-write of the file (flock on its directory: the
// file itself is replaced by rename). unlock releases what was taken.
func (l *Lib) lock() {
	l.mu.Lock()
	l.refresh()
}

func (l *Lib) lockWrite() {
	l.mu.Lock()
	if l.path == "" {
		return
	}
	l.dirLock = flockDir(filepath.Dir(l.path))
	l.refresh()
}

// refresh reads the state file when another process replaced it.
func (l *Lib) refresh() {
	if l.path == "" {
		return
	}
	if now := stampOf(l.path); now != l.stamp {
		if st, err := readSimState(l.path); err == nil && slices.Equal(st.modelKeys(), l.st.modelKeys()) {
			l.st, l.stamp = st, now
		}
	}
}

func (l *Lib) unlock() {
	if l.dirLock != nil {
		_ = l.dirLock.Close() // closing the descriptor releases the flock
		l.dirLock = nil
	}
	l.mu.Unlock()
}

// flockDir takes an exclusive flock on dir; nil (no lock) when it cannot.
func flockDir(dir string) *os.File {
	f, err := os.Open(dir)
	if err != nil {
		return nil
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil
	}
	return f
}

// commit makes next the state: written to the file first, kept in memory
// only when that worked.
func (l *Lib) commit(next simState) error {
	if l.path != "" {
		if err := writeSimState(l.path, &next); err != nil {
			return err
		}
		l.stamp = stampOf(l.path)
	}
	l.st = next
	return nil
}

// mutate runs f on a copy of the state and commits it when f returns
// SUCCESS (or keep: a change the return reports, like a pending mode).
func (l *Lib) mutate(op string, f func(st *simState) (keep bool, ret nvml.Return)) nvml.Return {
	next := l.st.clone()
	keep, ret := f(&next)
	if ret != nvml.SUCCESS && !keep {
		return ret
	}
	if err := l.commit(next); err != nil {
		l.log.Error("simulator state not written", "op", op, "err", err)
		return nvml.ERROR_UNKNOWN
	}
	if ret == nvml.SUCCESS {
		l.muts[op]++
	}
	return ret
}

// fault counts one call of each op and returns the injected return of the
// first op whose call number has a fault planned (SUCCESS: none). The
// injection is logged with the fault as written, so the command's output
// names it.
func (l *Lib) fault(gpu int, ops ...string) nvml.Return {
	ret := nvml.SUCCESS
	for _, op := range ops {
		l.calls[op]++
		if name, ok := l.faults[op][l.calls[op]]; ok && ret == nvml.SUCCESS {
			ret = simReturnByName(name)
			l.log.Warn("NVML fault injected", "fault", fmt.Sprintf("%s:%d=%s", op, l.calls[op], name), "gpu", gpu,
				"source", "--sim-faults")
		}
	}
	return ret
}

// simReturnByName maps an NVML return name to its code (names checked by
// parseFaults and SetHandleError).
func simReturnByName(name string) nvml.Return {
	if r, ok := nvmlreturn.ByName(name); ok {
		return r
	}
	return nvml.ERROR_UNKNOWN
}

// up reports whether this process initialized the library (nvml.h: every
// call but Init returns ERROR_UNINITIALIZED otherwise). Callers hold l.mu.
func (l *Lib) up() bool { return l.refs > 0 }

// gpu returns GPU i of st and its model, or nil.
func (l *Lib) gpu(st *simState, i int) (*simGPU, *profiles.Model) {
	if i < 0 || i >= len(st.GPUs) {
		return nil, nil
	}
	return &st.GPUs[i], l.models[i]
}

// --- library -----------------------------------------------------------------

// Init counts a reference (nvml.h nvmlInit_v2: "... reference counted") and
// the session beside the state file (SessionsPath), so a test sees how many
// sessions were opened and closed across processes. With the driver unloaded (the state's
// driverUnloaded) it fails with DRIVER_NOT_LOADED; a --sim-faults Init:N
// fault fails that call.
func (l *Lib) Init() nvml.Return {
	l.lockWrite()
	defer l.unlock()
	if ret := l.fault(-1, OpInit); ret != nvml.SUCCESS {
		return ret // --sim-faults Init:N: no reference taken
	}
	if l.st.DriverUnloaded {
		return nvml.ERROR_DRIVER_NOT_LOADED // nvml.h nvmlInit_v2
	}
	if err := countSession(l.path, &l.sessions, true); err != nil {
		l.log.Error("simulator session count not written", "op", "Init", "err", err)
		return nvml.ERROR_UNKNOWN
	}
	l.refs++
	return nvml.SUCCESS
}

// Shutdown releases one reference; without one it is ERROR_UNINITIALIZED
// (nvml.h nvmlShutdown).
func (l *Lib) Shutdown() nvml.Return {
	l.lockWrite()
	defer l.unlock()
	if !l.up() {
		return nvml.ERROR_UNINITIALIZED
	}
	if err := countSession(l.path, &l.sessions, false); err != nil {
		l.log.Error("simulator session count not written", "op", "Shutdown", "err", err)
		return nvml.ERROR_UNKNOWN
	}
	l.refs--
	return nvml.SUCCESS
}

// simExt is the loaded library's symbol table: the simulated driver (580)
// has every entry point the backend guards.
type simExt struct{}

func (simExt) LookupSymbol(string) error { return nil }

// Extensions gives the symbol lookup.
func (l *Lib) Extensions() nvml.ExtendedInterface { return simExt{} }

// SystemGetDriverVersion is DriverVersion.
func (l *Lib) SystemGetDriverVersion() (string, nvml.Return) {
	l.lock()
	defer l.unlock()
	if !l.up() {
		return "", nvml.ERROR_UNINITIALIZED
	}
	return DriverVersion, nvml.SUCCESS
}

// SystemGetProcessName names a process on any GPU; NOT_FOUND otherwise.
func (l *Lib) SystemGetProcessName(pid int) (string, nvml.Return) {
	l.lock()
	defer l.unlock()
	if !l.up() {
		return "", nvml.ERROR_UNINITIALIZED
	}
	for _, g := range l.st.GPUs {
		for _, p := range g.Processes {
			if int(p.PID) == pid {
				return p.Name, nvml.SUCCESS
			}
		}
	}
	return "", nvml.ERROR_NOT_FOUND
}

// DeviceGetCount counts every GPU, also those whose handle cannot be
// opened (nvml.h nvmlDeviceGetCount_v2: "the count can contain devices
// that are not accessible").
func (l *Lib) DeviceGetCount() (int, nvml.Return) {
	l.lock()
	defer l.unlock()
	if !l.up() {
		return 0, nvml.ERROR_UNINITIALIZED
	}
	return len(l.st.GPUs), nvml.SUCCESS
}

// DeviceGetHandleByIndex: INVALID_ARGUMENT past the count; the GPU's
// handleError (NO_PERMISSION, ...) where the state gives one (nvml.h
// nvmlDeviceGetHandleByIndex_v2).
func (l *Lib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	l.lock()
	defer l.unlock()
	if !l.up() {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	g, _ := l.gpu(&l.st, i)
	if g == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if g.HandleError != "" {
		return nil, simReturnByName(g.HandleError)
	}
	return &simDevice{lib: l, index: i}, nvml.SUCCESS
}

// DeviceGetHandleByUUID finds a GPU by UUID; NOT_FOUND otherwise.
func (l *Lib) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	l.lock()
	defer l.unlock()
	if !l.up() {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	for i, g := range l.st.GPUs {
		if g.UUID == uuid {
			if g.HandleError != "" {
				return nil, simReturnByName(g.HandleError)
			}
			return &simDevice{lib: l, index: i}, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// --- device ------------------------------------------------------------------

// simDevice is a GPU handle (index into the state). A MIG device handle is
// a simDevice with mig set.
type simDevice struct {
	nvml.Device // nil: unimplemented methods panic
	lib         *Lib
	index       int
	mig         *simMigRef
}

// simMigRef names the compute instance a MIG device handle stands for.
type simMigRef struct{ gi, ci int }

// with runs f on GPU d under the lock, after the checks every call makes.
func (d *simDevice) with(f func(g *simGPU, m *profiles.Model) nvml.Return) nvml.Return {
	d.lib.lock()
	defer d.lib.unlock()
	if !d.lib.up() {
		return nvml.ERROR_UNINITIALIZED
	}
	g, m := d.lib.gpu(&d.lib.st, d.index)
	if g == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return f(g, m)
}

// GetUUID is the GPU's UUID, or the MIG device's.
func (d *simDevice) GetUUID() (string, nvml.Return) {
	var out string
	ret := d.with(func(g *simGPU, _ *profiles.Model) nvml.Return {
		if d.mig == nil {
			out = g.UUID
			return nvml.SUCCESS
		}
		ci := findCI(g, d.mig.gi, d.mig.ci)
		if ci == nil {
			return nvml.ERROR_INVALID_ARGUMENT // the MIG device is gone: a stale handle
		}
		out = ci.UUID
		return nvml.SUCCESS
	})
	return out, ret
}

// GetName is the model's NVML name.
func (d *simDevice) GetName() (string, nvml.Return) {
	var out string
	return out, d.with(func(_ *simGPU, m *profiles.Model) nvml.Return { out = m.Name; return nvml.SUCCESS })
}

// GetPciInfo gives bus id (in both of nvmlPciInfo_t's forms), domain,
// bus, device, device id and subsystem id.
func (d *simDevice) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	var out nvml.PciInfo
	return out, d.with(func(g *simGPU, m *profiles.Model) nvml.Return {
		out.PciDeviceId, out.PciSubSystemId = m.PCIDeviceID, simPCISubsystemIDs[m.Key]
		for i := range min(len(g.PCIBusID), len(out.BusId)-1) {
			out.BusId[i] = int8(g.PCIBusID[i])
		}
		if a, ok := parsePCIBusID(g.PCIBusID); ok {
			out.Domain, out.Bus, out.Device = uint32(a.domain), uint32(a.bus), uint32(a.device)
			legacy := fmt.Sprintf("%04x:%02x:%02x.%x", a.domain, a.bus, a.device, a.function)
			for i := range min(len(legacy), len(out.BusIdLegacy)-1) {
				out.BusIdLegacy[i] = int8(legacy[i])
			}
		}
		return nvml.SUCCESS
	})
}

// GetMemoryInfo gives the total memory: the GPU's, or for a MIG device
// handle its GPU instance's (nvml.h nvmlDeviceGetMemoryInfo takes both).
func (d *simDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	var out nvml.Memory
	return out, d.with(func(g *simGPU, m *profiles.Model) nvml.Return {
		total := m.MemoryBytes
		if d.mig != nil {
			p, _, ret := d.migProfiles(g, m)
			if ret != nvml.SUCCESS {
				return ret
			}
			total = p.MemoryMiB << 20
		}
		out = nvml.Memory{Total: total, Free: total}
		return nvml.SUCCESS
	})
}

// GetArchitecture maps the model's architecture.
func (d *simDevice) GetArchitecture() (nvml.DeviceArchitecture, nvml.Return) {
	var out nvml.DeviceArchitecture
	return out, d.with(func(_ *simGPU, m *profiles.Model) nvml.Return {
		switch m.Architecture {
		case profiles.ArchAmpere:
			out = nvml.DEVICE_ARCH_AMPERE
		case profiles.ArchHopper:
			out = nvml.DEVICE_ARCH_HOPPER
		case profiles.ArchBlackwell:
			out = nvml.DEVICE_ARCH_BLACKWELL
		case profiles.ArchAda:
			out = nvml.DEVICE_ARCH_ADA
		default:
			out = nvml.DEVICE_ARCH_UNKNOWN
		}
		return nvml.SUCCESS
	})
}

// GetVirtualizationMode: bare metal.
func (d *simDevice) GetVirtualizationMode() (nvml.GpuVirtualizationMode, nvml.Return) {
	return nvml.GPU_VIRTUALIZATION_MODE_NONE, d.with(func(*simGPU, *profiles.Model) nvml.Return { return nvml.SUCCESS })
}

// GetMigMode: NOT_SUPPORTED on a GPU without MIG (nvml.h nvmlDeviceGetMigMode).
func (d *simDevice) GetMigMode() (int, int, nvml.Return) {
	cur, pend := 0, 0
	ret := d.with(func(g *simGPU, m *profiles.Model) nvml.Return {
		if !m.MigCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		cur, pend = simMode(g.MigCurrent), simMode(g.MigPending)
		return nvml.SUCCESS
	})
	return cur, pend, ret
}

func simMode(on bool) int {
	if on {
		return nvml.DEVICE_MIG_ENABLE
	}
	return nvml.DEVICE_MIG_DISABLE
}

// SetMigMode returns (activationStatus, ret) as go-nvml does. The rules:
//
//   - Hopper and later: the mode takes effect at once (MIG user guide: "Starting
//     with the Hopper generation ... enabling MIG mode no longer requires a GPU
//     reset"); while a process is on the GPU the unbind fails: activation
//     IN_USE, the mode stays pending (nvml.h nvmlDeviceSetMigMode).
//   - Ampere: the driver's own reset needs every client gone ("All daemons
//     holding handles on driver modules need to be stopped", MIG user guide);
//     the simulated node keeps one attached (nvidia-persistenced, as on
//     gpu-operator issue 118's output), so the mode stays pending with
//     activation IN_USE, or RESET_REQUIRED where no reset is exposed
//     (--sim-no-reset: nvml.h's pass-through case).
//   - Disabling while GPU instances exist: IN_USE, nothing changes
//     (unverified; NVIDIA's mig-parted clears every instance first).
func (d *simDevice) SetMigMode(mode int) (nvml.Return, nvml.Return) {
	activation := nvml.SUCCESS
	d.lib.lockWrite()
	defer d.lib.unlock()
	if !d.lib.up() {
		return nvml.ERROR_UNINITIALIZED, nvml.ERROR_UNINITIALIZED
	}
	if mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE {
		return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
	}
	if ret := d.lib.fault(d.index, OpSetMigMode); ret != nvml.SUCCESS {
		return ret, ret
	}
	enabled := mode == nvml.DEVICE_MIG_ENABLE
	ret := d.lib.mutate(OpSetMigMode, func(st *simState) (bool, nvml.Return) {
		g, m := d.lib.gpu(st, d.index)
		if g == nil {
			return false, nvml.ERROR_INVALID_ARGUMENT
		}
		if !m.MigCapable {
			return false, nvml.ERROR_NOT_SUPPORTED
		}
		if !enabled && len(g.Instances) > 0 {
			return false, nvml.ERROR_IN_USE
		}
		g.MigPending = enabled
		switch {
		case g.MigCurrent == enabled:
		case m.Architecture == profiles.ArchAmpere && d.lib.noReset:
			activation = nvml.ERROR_RESET_REQUIRED
		case m.Architecture == profiles.ArchAmpere || len(g.Processes) > 0:
			activation = nvml.ERROR_IN_USE
		default:
			g.MigCurrent = enabled
		}
		return false, nvml.SUCCESS
	})
	return activation, ret
}

// GetGpuInstanceProfileInfo: the catalogue's profile at index idx; an index
// the GPU does not offer is NOT_SUPPORTED below 17 and INVALID_ARGUMENT from
// there (measured on the H200, MIG facts §5); also with MIG disabled.
func (d *simDevice) GetGpuInstanceProfileInfo(idx int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	var out nvml.GpuInstanceProfileInfo
	return out, d.with(func(_ *simGPU, m *profiles.Model) nvml.Return {
		if idx < 0 || idx >= simMaxProfileIndex {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if !m.MigCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		p, ok := m.Catalogue.ByIndex(idx)
		if !ok {
			return nvml.ERROR_NOT_SUPPORTED
		}
		out = simProfileInfo(p)
		return nvml.SUCCESS
	})
}

// simProfileInfo is NVML's info for p: IsP2pSupported 0 as on the H200.
func simProfileInfo(p *profiles.Profile) nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id: uint32(p.ID), SliceCount: uint32(p.Slices), InstanceCount: uint32(p.MaxCount),
		MultiprocessorCount: uint32(p.Multiprocessors), CopyEngineCount: uint32(p.CopyEngines),
		DecoderCount: uint32(p.Decoders), EncoderCount: uint32(p.Encoders), JpegCount: uint32(p.JPEGs),
		OfaCount: uint32(p.OFAs), MemorySizeMB: p.MemoryMiB,
	}
}

// profileOf finds the catalogue profile an info names by its Id.
func profileOf(m *profiles.Model, info *nvml.GpuInstanceProfileInfo) (*profiles.Profile, bool) {
	if info == nil {
		return nil, false
	}
	return m.Catalogue.ByID(int(info.Id))
}

// GetGpuInstancePossiblePlacements lists where info's profile can sit,
// whether MIG is on or not (nvml.h; measured on the H200).
func (d *simDevice) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	var out []nvml.GpuInstancePlacement
	return out, d.with(func(_ *simGPU, m *profiles.Model) nvml.Return {
		if !m.MigCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		p, ok := profileOf(m, info)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		for _, pl := range p.Placements {
			out = append(out, nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
		}
		return nvml.SUCCESS
	})
}

// GetGpuInstances lists the GPU instances of info's profile, at most
// info.InstanceCount (go-nvml refuses 0 with INVALID_ARGUMENT; more than
// fit is INSUFFICIENT_SIZE, nvml.h). With MIG disabled the list is empty
// (measured on the H200; nvml.h documents NOT_SUPPORTED).
func (d *simDevice) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	var out []nvml.GpuInstance
	return out, d.with(func(g *simGPU, m *profiles.Model) nvml.Return {
		if info == nil || info.InstanceCount == 0 {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if !m.MigCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		if _, ok := profileOf(m, info); !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		for _, gi := range g.Instances {
			if gi.ProfileID == int(info.Id) {
				out = append(out, d.giHandle(gi))
			}
		}
		if len(out) > int(info.InstanceCount) {
			out = nil
			return nvml.ERROR_INSUFFICIENT_SIZE
		}
		return nvml.SUCCESS
	})
}

func (d *simDevice) giHandle(gi simGI) *simGpuInstance {
	return &simGpuInstance{lib: d.lib, gpu: d.index, id: gi.ID, profileID: gi.ProfileID, start: gi.Placement.Start}
}

// GetGpuInstanceById: NOT_SUPPORTED with MIG disabled, NOT_FOUND for an id
// no instance has (nvml.h nvmlDeviceGetGpuInstanceById).
func (d *simDevice) GetGpuInstanceById(id int) (nvml.GpuInstance, nvml.Return) {
	var out nvml.GpuInstance
	return out, d.with(func(g *simGPU, m *profiles.Model) nvml.Return {
		if !m.MigCapable || !g.MigCurrent {
			return nvml.ERROR_NOT_SUPPORTED
		}
		x := findGI(g, id)
		if x == nil {
			return nvml.ERROR_NOT_FOUND
		}
		out = d.giHandle(*x)
		return nvml.SUCCESS
	})
}

// simGIID is the id the driver gives a GPU instance: its place in a heap
// over the memory slices (the whole GPU 0, the halves 1 and 2, the
// quarters 3 to 6, the eighths 7 to 14 on an 8-slice GPU). Sources: the
// MIG user guide's "Instance Geometry" examples on an A100-SXM4-40GB (4g
// at 0:4 is 1, 3g at 4:4 is 2, 2g at 0:2, 2:2, 4:2 are 3, 4, 5, 1g at p is
// 7+p); dra-driver issue 933 on H100 (1g ids 7, 8, 12 at 0, 1, 5); the
// A30 output in issue 25's research (1g at 0 is 3 on 4 slices). The
// guide's `-cgi 9,9` example contradicts itself (its creation lines give
// ids 2 then 1, its -lgi table id 1 at 4:4), so it is not a source.
func simGIID(slices int, at profiles.Placement) int {
	n := slices / max(at.Size, 1)
	return n - 1 + at.Start/max(at.Size, 1)
}

// CreateGpuInstanceWithPlacement creates a GPU instance at the placement
// the caller names (nvml.h nvmlDeviceCreateGpuInstanceWithPlacement); see
// createGI for the rules. INVALID_ARGUMENT for a placement the profile
// does not list.
func (d *simDevice) CreateGpuInstanceWithPlacement(info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	return d.createGI(OpCreateGpuInstanceWithPlacement, info, func(_ *simGPU, _ *profiles.Model, p *profiles.Profile) (profiles.Placement, nvml.Return) {
		if at == nil {
			return profiles.Placement{}, nvml.ERROR_INVALID_ARGUMENT
		}
		pl := profiles.Placement{Start: int(at.Start), Size: int(at.Size)}
		if !slices.Contains(p.Placements, pl) {
			return pl, nvml.ERROR_INVALID_ARGUMENT
		}
		return pl, nvml.SUCCESS
	})
}

// createGI creates a GPU instance of info's profile at the placement place
// chooses. The rules (nvml.h nvmlDeviceCreateGpuInstance[WithPlacement]
// and MIG facts §3.8): NOT_SUPPORTED without MIG mode; INVALID_ARGUMENT for
// a profile the GPU does not list; INSUFFICIENT_RESOURCES when the
// placement overlaps an instance (memory slices; the DRA driver's note), the
// profile's count is reached, or the media engines (+me) are taken. A
// --sim-faults entry for either creation op name fails either call; a
// success counts in Mutations under op.
func (d *simDevice) createGI(op string, info *nvml.GpuInstanceProfileInfo,
	place func(g *simGPU, m *profiles.Model, p *profiles.Profile) (profiles.Placement, nvml.Return)) (nvml.GpuInstance, nvml.Return) {
	d.lib.lockWrite()
	defer d.lib.unlock()
	if !d.lib.up() {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	if ret := d.lib.fault(d.index, OpCreateGpuInstanceWithPlacement, OpCreateGpuInstance); ret != nvml.SUCCESS {
		return nil, ret
	}
	var made simGI
	ret := d.lib.mutate(op, func(st *simState) (bool, nvml.Return) {
		g, m := d.lib.gpu(st, d.index)
		if g == nil {
			return false, nvml.ERROR_INVALID_ARGUMENT
		}
		if !m.MigCapable || !g.MigCurrent {
			return false, nvml.ERROR_NOT_SUPPORTED
		}
		p, ok := profileOf(m, info)
		if !ok {
			return false, nvml.ERROR_INVALID_ARGUMENT
		}
		pl, ret := place(g, m, p)
		if ret != nvml.SUCCESS {
			return false, ret
		}
		count, ofas := 0, p.OFAs
		for _, gi := range g.Instances {
			q, _ := m.Catalogue.ByID(gi.ProfileID)
			if gi.ProfileID == p.ID {
				count++
			}
			ofas += q.OFAs
			if gi.Placement.Overlaps(pl) {
				return false, nvml.ERROR_INSUFFICIENT_RESOURCES
			}
		}
		if count >= p.MaxCount || ofas > ofaTotal(m) {
			return false, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		made = simGI{ID: simGIID(m.Catalogue.MemorySlices, pl), ProfileID: p.ID, Placement: pl, ComputeInstances: []simCI{}}
		g.Instances = append(g.Instances, made)
		return false, nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return d.giHandle(made), nvml.SUCCESS
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

// GetMaxMigDeviceCount: 0 with MIG disabled (measured on the H200), else
// one per compute slice.
func (d *simDevice) GetMaxMigDeviceCount() (int, nvml.Return) {
	n := 0
	return n, d.with(func(g *simGPU, m *profiles.Model) nvml.Return {
		if !m.MigCapable {
			return nvml.ERROR_NOT_SUPPORTED
		}
		if g.MigCurrent {
			for _, p := range m.Catalogue.Profiles {
				n = max(n, p.Slices)
			}
		}
		return nvml.SUCCESS
	})
}

// migDevices lists g's compute instances in (GI id, CI id) order: the MIG
// device indices.
func migDevices(g *simGPU) []simMigRef {
	var out []simMigRef
	for _, gi := range g.Instances {
		for _, ci := range gi.ComputeInstances {
			out = append(out, simMigRef{gi.ID, ci.ID})
		}
	}
	slices.SortFunc(out, func(a, b simMigRef) int {
		if a.gi != b.gi {
			return a.gi - b.gi
		}
		return a.ci - b.ci
	})
	return out
}

// GetMigDeviceHandleByIndex: NOT_FOUND for an index with no MIG device,
// INVALID_ARGUMENT past the maximum (nvml.h nvmlDeviceGetMigDeviceHandleByIndex).
func (d *simDevice) GetMigDeviceHandleByIndex(k int) (nvml.Device, nvml.Return) {
	var out nvml.Device
	return out, d.with(func(g *simGPU, m *profiles.Model) nvml.Return {
		if !m.MigCapable || !g.MigCurrent || d.mig != nil {
			return nvml.ERROR_NOT_SUPPORTED
		}
		devs := migDevices(g)
		maxDevs := 0
		for _, p := range m.Catalogue.Profiles {
			maxDevs = max(maxDevs, p.Slices)
		}
		switch {
		case k < 0 || k >= maxDevs:
			return nvml.ERROR_INVALID_ARGUMENT
		case k >= len(devs):
			return nvml.ERROR_NOT_FOUND
		}
		out = &simDevice{lib: d.lib, index: d.index, mig: &devs[k]}
		return nvml.SUCCESS
	})
}

// IsMigDeviceHandle tells MIG device handles from GPU handles.
func (d *simDevice) IsMigDeviceHandle() (bool, nvml.Return) { return d.mig != nil, nvml.SUCCESS }

// GetIndex is a GPU's NVML index (DeviceGetHandleByIndex's), or a MIG
// device's index within its GPU (GetMigDeviceHandleByIndex's): nvml.h
// nvmlDeviceGetIndex. INVALID_ARGUMENT for a MIG device that is gone.
func (d *simDevice) GetIndex() (int, nvml.Return) {
	out := d.index
	ret := d.with(func(g *simGPU, _ *profiles.Model) nvml.Return {
		if d.mig == nil {
			return nvml.SUCCESS
		}
		out = slices.Index(migDevices(g), *d.mig)
		if out < 0 {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.SUCCESS
	})
	return out, ret
}

// GetGpuInstanceId is a MIG device's GI id; NOT_SUPPORTED on a GPU handle.
func (d *simDevice) GetGpuInstanceId() (int, nvml.Return) {
	if d.mig == nil {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	return d.mig.gi, d.with(func(*simGPU, *profiles.Model) nvml.Return { return nvml.SUCCESS })
}

// GetComputeInstanceId is a MIG device's CI id; NOT_SUPPORTED on a GPU handle.
func (d *simDevice) GetComputeInstanceId() (int, nvml.Return) {
	if d.mig == nil {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	return d.mig.ci, d.with(func(*simGPU, *profiles.Model) nvml.Return { return nvml.SUCCESS })
}

// GetComputeRunningProcesses lists the GPU's processes with their GPU and
// compute instance ids (0xFFFFFFFF outside MIG: NVML's "not available").
func (d *simDevice) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	var out []nvml.ProcessInfo
	return out, d.with(func(g *simGPU, _ *profiles.Model) nvml.Return {
		for _, p := range g.Processes {
			q := nvml.ProcessInfo{Pid: p.PID, GpuInstanceId: notAvailable, ComputeInstanceId: notAvailable}
			if p.GIID >= 0 {
				q.GpuInstanceId, q.ComputeInstanceId = uint32(p.GIID), uint32(p.CIID)
			}
			if d.mig != nil && (p.GIID != d.mig.gi || p.CIID != d.mig.ci) {
				continue
			}
			out = append(out, q)
		}
		return nvml.SUCCESS
	})
}

// GetGraphicsRunningProcesses: the simulator runs no graphics processes.
func (d *simDevice) GetGraphicsRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	return nil, d.with(func(*simGPU, *profiles.Model) nvml.Return { return nvml.SUCCESS })
}

// GetMPSComputeRunningProcesses: the simulator runs no MPS clients.
func (d *simDevice) GetMPSComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	return nil, d.with(func(*simGPU, *profiles.Model) nvml.Return { return nvml.SUCCESS })
}

// --- GPU instance --------------------------------------------------------------

// simGpuInstance is a GPU instance handle. It stays valid while the same
// instance (id, profile, placement) exists; after a destroy or reset it is
// INVALID_ARGUMENT (nvml.h: handles become invalid).
type simGpuInstance struct {
	nvml.GpuInstance // nil: unimplemented methods panic
	lib              *Lib
	gpu, id          int
	profileID, start int
}

// with runs f on the instance under the lock.
func (h *simGpuInstance) with(f func(g *simGPU, m *profiles.Model, x *simGI) nvml.Return) nvml.Return {
	h.lib.lock()
	defer h.lib.unlock()
	return h.withLocked(&h.lib.st, f)
}

func (h *simGpuInstance) withLocked(st *simState, f func(g *simGPU, m *profiles.Model, x *simGI) nvml.Return) nvml.Return {
	if !h.lib.up() {
		return nvml.ERROR_UNINITIALIZED
	}
	g, m := h.lib.gpu(st, h.gpu)
	if g == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	x := findGI(g, h.id)
	if x == nil || x.ProfileID != h.profileID || x.Placement.Start != h.start {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return f(g, m, x)
}

// GetInfo gives the id, profile id and placement.
func (h *simGpuInstance) GetInfo() (nvml.GpuInstanceInfo, nvml.Return) {
	var out nvml.GpuInstanceInfo
	return out, h.with(func(_ *simGPU, _ *profiles.Model, x *simGI) nvml.Return {
		out = nvml.GpuInstanceInfo{Device: &simDevice{lib: h.lib, index: h.gpu}, Id: uint32(x.ID), ProfileId: uint32(x.ProfileID),
			Placement: nvml.GpuInstancePlacement{Start: uint32(x.Placement.Start), Size: uint32(x.Placement.Size)}}
		return nvml.SUCCESS
	})
}

// computeProfileAt finds the compute profile of GI profile p at NVML index idx.
func computeProfileAt(p *profiles.Profile, idx int) (*profiles.ComputeProfile, bool) {
	for i := range p.ComputeProfiles {
		if p.ComputeProfiles[i].Index == idx {
			return &p.ComputeProfiles[i], true
		}
	}
	return nil, false
}

func computeByID(p *profiles.Profile, id int) (*profiles.ComputeProfile, bool) {
	for i := range p.ComputeProfiles {
		if p.ComputeProfiles[i].ID == id {
			return &p.ComputeProfiles[i], true
		}
	}
	return nil, false
}

// GetComputeInstanceProfileInfo: the compute profile at index idx with the
// shared engine profile; NOT_SUPPORTED for a size the GPU instance does not
// offer, INVALID_ARGUMENT for a bad index or engine profile (nvml.h
// nvmlGpuInstanceGetComputeInstanceProfileInfo). The id is NVML's index, as
// `nvidia-smi mig -lcip` shows it (1c.3g.20gb 0, 2c.3g.20gb 1, 3g.20gb 2 in
// the MIG user guide's A100 example); SMs are the GI's share per slice.
func (h *simGpuInstance) GetComputeInstanceProfileInfo(idx, eng int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	var out nvml.ComputeInstanceProfileInfo
	return out, h.with(func(_ *simGPU, m *profiles.Model, x *simGI) nvml.Return {
		if idx < 0 || idx >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT || eng != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		p, _ := m.Catalogue.ByID(x.ProfileID)
		cp, ok := computeProfileAt(p, idx)
		if !ok {
			return nvml.ERROR_NOT_SUPPORTED
		}
		out = simComputeInfo(p, cp)
		return nvml.SUCCESS
	})
}

func simComputeInfo(p *profiles.Profile, cp *profiles.ComputeProfile) nvml.ComputeInstanceProfileInfo {
	return nvml.ComputeInstanceProfileInfo{
		Id: uint32(cp.ID), SliceCount: uint32(cp.Slices), InstanceCount: uint32(cp.MaxCount),
		MultiprocessorCount:   uint32(p.Multiprocessors * cp.Slices / max(p.Slices, 1)),
		SharedCopyEngineCount: uint32(p.CopyEngines), SharedDecoderCount: uint32(p.Decoders),
		SharedEncoderCount: uint32(p.Encoders), SharedJpegCount: uint32(p.JPEGs), SharedOfaCount: uint32(p.OFAs),
	}
}

// GetComputeInstances lists the compute instances of info's profile, at
// most info.InstanceCount (0 is INVALID_ARGUMENT, as go-nvml refuses it).
func (h *simGpuInstance) GetComputeInstances(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
	var out []nvml.ComputeInstance
	return out, h.with(func(_ *simGPU, _ *profiles.Model, x *simGI) nvml.Return {
		if info == nil || info.InstanceCount == 0 {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		for _, ci := range x.ComputeInstances {
			if ci.ProfileID == int(info.Id) {
				out = append(out, h.ciHandle(ci))
			}
		}
		if len(out) > int(info.InstanceCount) {
			out = nil
			return nvml.ERROR_INSUFFICIENT_SIZE
		}
		return nvml.SUCCESS
	})
}

func (h *simGpuInstance) ciHandle(ci simCI) *simComputeInstance {
	return &simComputeInstance{gi: h, id: ci.ID, profileID: ci.ProfileID}
}

// GetComputeInstanceById: NOT_FOUND for an id no compute instance has.
func (h *simGpuInstance) GetComputeInstanceById(id int) (nvml.ComputeInstance, nvml.Return) {
	var out nvml.ComputeInstance
	return out, h.with(func(_ *simGPU, _ *profiles.Model, x *simGI) nvml.Return {
		for _, ci := range x.ComputeInstances {
			if ci.ID == id {
				out = h.ciHandle(ci)
				return nvml.SUCCESS
			}
		}
		return nvml.ERROR_NOT_FOUND
	})
}

// CreateComputeInstance: NOT_SUPPORTED for a profile id the GPU instance
// does not offer (nvml.h nvmlGpuInstanceCreateComputeInstance);
// INSUFFICIENT_RESOURCES when the profile's count is reached or the compute
// slices are used up (compute placements are not modelled). CI ids are the
// smallest free from 0 (`-cci 0,0,0` gives 0, 1, 2 in the MIG user guide).
func (h *simGpuInstance) CreateComputeInstance(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
	const op = OpCreateComputeInstance
	h.lib.lockWrite()
	defer h.lib.unlock()
	if !h.lib.up() {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	if ret := h.lib.fault(h.gpu, op); ret != nvml.SUCCESS {
		return nil, ret
	}
	var made simCI
	ret := h.lib.mutate(op, func(st *simState) (bool, nvml.Return) {
		return false, h.withLocked(st, func(g *simGPU, m *profiles.Model, x *simGI) nvml.Return {
			if info == nil {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			p, _ := m.Catalogue.ByID(x.ProfileID)
			cp, ok := computeByID(p, int(info.Id))
			if !ok {
				return nvml.ERROR_NOT_SUPPORTED
			}
			count, used := 0, cp.Slices
			for _, ci := range x.ComputeInstances {
				c, _ := computeByID(p, ci.ProfileID)
				used += c.Slices
				if ci.ProfileID == cp.ID {
					count++
				}
			}
			if count >= cp.MaxCount || used > p.Slices {
				return nvml.ERROR_INSUFFICIENT_RESOURCES
			}
			id := 0
			for slices.ContainsFunc(x.ComputeInstances, func(c simCI) bool { return c.ID == id }) {
				id++
			}
			made = simCI{ID: id, ProfileID: cp.ID, UUID: simMIGUUID(g.UUID, x.ProfileID, x.Placement.Start, cp.ID, id)}
			x.ComputeInstances = append(x.ComputeInstances, made)
			return nvml.SUCCESS
		})
	})
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return h.ciHandle(made), nvml.SUCCESS
}

// Destroy: IN_USE while processes or compute instances are on it (nvml.h
// nvmlGpuInstanceDestroy); INVALID_ARGUMENT for a stale handle.
func (h *simGpuInstance) Destroy() nvml.Return {
	const op = OpGpuInstanceDestroy
	h.lib.lockWrite()
	defer h.lib.unlock()
	if !h.lib.up() {
		return nvml.ERROR_UNINITIALIZED
	}
	if ret := h.lib.fault(h.gpu, op); ret != nvml.SUCCESS {
		return ret
	}
	return h.lib.mutate(op, func(st *simState) (bool, nvml.Return) {
		return false, h.withLocked(st, func(g *simGPU, _ *profiles.Model, x *simGI) nvml.Return {
			for _, p := range g.Processes {
				if p.GIID == x.ID {
					return nvml.ERROR_IN_USE
				}
			}
			if len(x.ComputeInstances) > 0 {
				return nvml.ERROR_IN_USE
			}
			id := x.ID
			g.Instances = slices.DeleteFunc(g.Instances, func(y simGI) bool { return y.ID == id })
			return nvml.SUCCESS
		})
	})
}

// --- compute instance ----------------------------------------------------------

// simComputeInstance is a compute instance handle.
type simComputeInstance struct {
	nvml.ComputeInstance // nil: unimplemented methods panic
	gi                   *simGpuInstance
	id, profileID        int
}

func (c *simComputeInstance) find(x *simGI) *simCI {
	for i := range x.ComputeInstances {
		if x.ComputeInstances[i].ID == c.id && x.ComputeInstances[i].ProfileID == c.profileID {
			return &x.ComputeInstances[i]
		}
	}
	return nil
}

// GetInfo gives the id and profile id.
func (c *simComputeInstance) GetInfo() (nvml.ComputeInstanceInfo, nvml.Return) {
	var out nvml.ComputeInstanceInfo
	return out, c.gi.with(func(_ *simGPU, _ *profiles.Model, x *simGI) nvml.Return {
		ci := c.find(x)
		if ci == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		out = nvml.ComputeInstanceInfo{Device: &simDevice{lib: c.gi.lib, index: c.gi.gpu}, GpuInstance: c.gi,
			Id: uint32(ci.ID), ProfileId: uint32(ci.ProfileID)}
		return nvml.SUCCESS
	})
}

// Destroy: IN_USE while a process runs on it (nvml.h nvmlComputeInstanceDestroy).
func (c *simComputeInstance) Destroy() nvml.Return {
	const op = OpComputeInstanceDestroy
	l := c.gi.lib
	l.lockWrite()
	defer l.unlock()
	if !l.up() {
		return nvml.ERROR_UNINITIALIZED
	}
	if ret := l.fault(c.gi.gpu, op); ret != nvml.SUCCESS {
		return ret
	}
	return l.mutate(op, func(st *simState) (bool, nvml.Return) {
		return false, c.gi.withLocked(st, func(g *simGPU, _ *profiles.Model, x *simGI) nvml.Return {
			if c.find(x) == nil {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			for _, p := range g.Processes {
				if p.GIID == x.ID && p.CIID == c.id {
					return nvml.ERROR_IN_USE
				}
			}
			x.ComputeInstances = slices.DeleteFunc(x.ComputeInstances, func(y simCI) bool { return y.ID == c.id })
			return nvml.SUCCESS
		})
	})
}

func findGI(g *simGPU, id int) *simGI {
	for i := range g.Instances {
		if g.Instances[i].ID == id {
			return &g.Instances[i]
		}
	}
	return nil
}

func findCI(g *simGPU, gi, ci int) *simCI {
	x := findGI(g, gi)
	if x == nil {
		return nil
	}
	for i := range x.ComputeInstances {
		if x.ComputeInstances[i].ID == ci {
			return &x.ComputeInstances[i]
		}
	}
	return nil
}
