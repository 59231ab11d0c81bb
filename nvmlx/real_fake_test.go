package nvmlx

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/migagent/mig-agent/profiles"
)

// fakeNVML is a small stateful NVML on go-nvml's generated mocks, built
// from a model of the static catalogue: profile info per index, placements,
// GPU and compute instances, MIG devices, processes. Tests bend it to
// produce the driver behaviours the real backend must survive. A mock
// method left without a function panics when called, which is how tests
// prove that a guarded entry point is never reached.
type fakeNVML struct {
	lib     *mock.Interface
	ext     *mock.ExtendedInterface
	missing map[string]bool // symbols the "driver" lacks
	gpus    []*fakeGPU
	inits   int
	downs   int
}

type fakeGPU struct {
	dev     *mock.Device
	uuid    string
	model   *profiles.Model
	pciID   uint32
	infos   map[int]nvml.GpuInstanceProfileInfo // by profile index
	infoRet map[int]nvml.Return                 // forced returns by index
	migCur  int
	migPend int
	virt    nvml.GpuVirtualizationMode
	gis     []*fakeGI
	nextGI  uint32
	procs   []nvml.ProcessInfo
	gprocs  []nvml.ProcessInfo
	// fail forces the next call of an operation to fail with a return.
	fail map[string]nvml.Return
	// setMig replaces SetMigMode: (activation, ret) and the mode after.
	setMig func(mode int) (nvml.Return, nvml.Return)
	// ciIDBase is added to every compute profile id the fake reports and
	// takes: nvml.h promises no id equal to its index, so a backend that
	// assumes one fails here.
	ciIDBase uint32
}

type fakeGI struct {
	gpu    *fakeGPU
	gi     *mock.GpuInstance
	info   nvml.GpuInstanceInfo
	prof   profiles.Profile
	cis    []*fakeCI
	nextCI uint32
}

type fakeCI struct {
	gi   *fakeGI
	ci   *mock.ComputeInstance
	info nvml.ComputeInstanceInfo
	uuid string
}

// newFakeNVML builds one fake GPU per model key.
func newFakeNVML(keys ...string) *fakeNVML {
	f := &fakeNVML{missing: map[string]bool{}}
	f.ext = &mock.ExtendedInterface{LookupSymbolFunc: func(s string) error {
		if f.missing[s] {
			return fmt.Errorf("undefined symbol: %s", s)
		}
		return nil
	}}
	f.lib = &mock.Interface{
		ExtensionsFunc: func() nvml.ExtendedInterface { return f.ext },
		InitFunc:       func() nvml.Return { f.inits++; return nvml.SUCCESS },
		ShutdownFunc:   func() nvml.Return { f.downs++; return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) {
			return "580.159.04", nvml.SUCCESS
		},
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(f.gpus), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(f.gpus) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return f.gpus[i].dev, nvml.SUCCESS
		},
		DeviceGetHandleByUUIDFunc: func(u string) (nvml.Device, nvml.Return) {
			for _, g := range f.gpus {
				if g.uuid == u {
					return g.dev, nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		SystemGetProcessNameFunc: func(pid int) (string, nvml.Return) {
			return fmt.Sprintf("proc%d", pid), nvml.SUCCESS
		},
	}
	for i, k := range keys {
		m, ok := profiles.ModelByKey(k)
		if !ok {
			panic("unknown model " + k)
		}
		f.gpus = append(f.gpus, newFakeGPU(i, m))
	}
	return f
}

// nvmlInfo is the profile info NVML would report for p.
func nvmlInfo(p profiles.Profile) nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id: uint32(p.ID), SliceCount: uint32(p.Slices), InstanceCount: uint32(p.MaxCount),
		MultiprocessorCount: uint32(p.Multiprocessors), CopyEngineCount: uint32(p.CopyEngines),
		DecoderCount: uint32(p.Decoders), EncoderCount: uint32(p.Encoders), JpegCount: uint32(p.JPEGs),
		OfaCount: uint32(p.OFAs), MemorySizeMB: p.MemoryMiB,
	}
}

func cBusID(s string) [32]int8 {
	var b [32]int8
	for i := range len(s) {
		b[i] = int8(s[i])
	}
	return b
}

func newFakeGPU(i int, m *profiles.Model) *fakeGPU {
	g := &fakeGPU{
		uuid: fmt.Sprintf("GPU-fake-%d", i), model: m, pciID: m.PCIDeviceID,
		infos: map[int]nvml.GpuInstanceProfileInfo{}, infoRet: map[int]nvml.Return{},
		fail: map[string]nvml.Return{},
	}
	for _, p := range m.Catalogue.Profiles {
		g.infos[p.Index] = nvmlInfo(p)
	}
	// Driver 580 answers INVALID_ARGUMENT above index 16 on the H200.
	g.infoRet[profiles.Index3SliceGfx] = nvml.ERROR_INVALID_ARGUMENT
	bus := fmt.Sprintf("00000000:%02X:00.0", 0x10+i)
	d := &mock.Device{}
	g.dev = d
	d.GetUUIDFunc = func() (string, nvml.Return) { return g.uuid, nvml.SUCCESS }
	d.GetNameFunc = func() (string, nvml.Return) { return m.Name, nvml.SUCCESS }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		return nvml.PciInfo{PciDeviceId: g.pciID, BusId: cBusID(bus)}, nvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{Total: m.MemoryBytes, Free: m.MemoryBytes}, nvml.SUCCESS
	}
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) {
		switch m.Architecture {
		case profiles.ArchAmpere:
			return nvml.DEVICE_ARCH_AMPERE, nvml.SUCCESS
		case profiles.ArchHopper:
			return nvml.DEVICE_ARCH_HOPPER, nvml.SUCCESS
		case profiles.ArchBlackwell:
			return nvml.DEVICE_ARCH_BLACKWELL, nvml.SUCCESS
		case profiles.ArchAda:
			return nvml.DEVICE_ARCH_ADA, nvml.SUCCESS
		}
		return nvml.DEVICE_ARCH_UNKNOWN, nvml.SUCCESS
	}
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		if !m.MigCapable {
			return 0, 0, nvml.ERROR_NOT_SUPPORTED
		}
		return g.migCur, g.migPend, nvml.SUCCESS
	}
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		if g.setMig != nil {
			return g.setMig(mode)
		}
		g.migCur, g.migPend = mode, mode
		return nvml.SUCCESS, nvml.SUCCESS
	}
	d.GetVirtualizationModeFunc = func() (nvml.GpuVirtualizationMode, nvml.Return) { return g.virt, nvml.SUCCESS }
	d.GetGpuInstanceProfileInfoFunc = func(idx int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		if ret, ok := g.infoRet[idx]; ok {
			return nvml.GpuInstanceProfileInfo{}, ret
		}
		if idx < 0 || idx >= nvml.GPU_INSTANCE_PROFILE_COUNT {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		info, ok := g.infos[idx]
		if !ok || !m.MigCapable {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return info, nvml.SUCCESS
	}
	d.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		p, ok := m.Catalogue.ByID(int(info.Id))
		if !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		var out []nvml.GpuInstancePlacement
		for _, pl := range p.Placements {
			out = append(out, nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
		}
		return out, nvml.SUCCESS
	}
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		if ret, ok := g.take("CreateGpuInstanceWithPlacement"); ok {
			return nil, ret
		}
		if g.migCur != nvml.DEVICE_MIG_ENABLE {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		p, ok := m.Catalogue.ByID(int(info.Id))
		if !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		want := profiles.Placement{Start: int(pl.Start), Size: int(pl.Size)}
		if !slices.Contains(p.Placements, want) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		for _, gi := range g.gis {
			have := profiles.Placement{Start: int(gi.info.Placement.Start), Size: int(gi.info.Placement.Size)}
			if have.Overlaps(want) {
				return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
			}
		}
		return g.addGI(*p, *pl).gi, nvml.SUCCESS
	}
	d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		if info.InstanceCount == 0 {
			return nil, nvml.ERROR_INVALID_ARGUMENT // as go-nvml does
		}
		var out []nvml.GpuInstance
		for _, gi := range g.gis {
			if gi.info.ProfileId == info.Id {
				out = append(out, gi.gi)
			}
		}
		if len(out) > int(info.InstanceCount) {
			return nil, nvml.ERROR_INSUFFICIENT_SIZE
		}
		return out, nvml.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		for _, gi := range g.gis {
			if int(gi.info.Id) == id {
				return gi.gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(k int) (nvml.Device, nvml.Return) {
		var all []*fakeCI
		for _, gi := range g.gis {
			all = append(all, gi.cis...)
		}
		if k >= len(all) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		ci := all[k]
		return &mock.Device{
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return int(ci.gi.info.Id), nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return int(ci.info.Id), nvml.SUCCESS },
			GetUUIDFunc:              func() (string, nvml.Return) { return ci.uuid, nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return g.procs, nvml.SUCCESS }
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return g.gprocs, nvml.SUCCESS }
	d.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	return g
}

// take consumes a forced failure of op.
func (g *fakeGPU) take(op string) (nvml.Return, bool) {
	ret, ok := g.fail[op]
	if ok {
		delete(g.fail, op)
	}
	return ret, ok
}

// addGI creates a GPU instance of p at pl, as the driver would.
func (g *fakeGPU) addGI(p profiles.Profile, pl nvml.GpuInstancePlacement) *fakeGI {
	fgi := &fakeGI{gpu: g, prof: p}
	g.nextGI++
	fgi.info = nvml.GpuInstanceInfo{Device: g.dev, Id: g.nextGI, ProfileId: uint32(p.ID), Placement: pl}
	gi := &mock.GpuInstance{}
	fgi.gi = gi
	gi.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) { return fgi.info, nvml.SUCCESS }
	gi.GetComputeInstanceProfileInfoFunc = func(idx, eng int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		if eng != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		for _, cp := range p.ComputeProfiles {
			if cp.Index == idx {
				return nvml.ComputeInstanceProfileInfo{Id: uint32(cp.ID) + g.ciIDBase, SliceCount: uint32(cp.Slices), InstanceCount: uint32(cp.MaxCount)}, nvml.SUCCESS
			}
		}
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		if ret, ok := g.take("CreateComputeInstance"); ok {
			return nil, ret
		}
		// nvml.h nvmlGpuInstanceCreateComputeInstance: NOT_SUPPORTED for a
		// profile the GPU instance does not offer.
		if !slices.ContainsFunc(p.ComputeProfiles, func(cp profiles.ComputeProfile) bool { return uint32(cp.ID)+g.ciIDBase == info.Id }) {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		return fgi.addCI(info).ci, nvml.SUCCESS
	}
	gi.GetComputeInstancesFunc = func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
		if info.InstanceCount == 0 {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		var out []nvml.ComputeInstance
		for _, ci := range fgi.cis {
			if ci.info.ProfileId == info.Id {
				out = append(out, ci.ci)
			}
		}
		return out, nvml.SUCCESS
	}
	gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		for _, ci := range fgi.cis {
			if int(ci.info.Id) == id {
				return ci.ci, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	gi.DestroyFunc = func() nvml.Return {
		if ret, ok := g.take("GpuInstance.Destroy"); ok {
			return ret
		}
		if len(fgi.cis) > 0 {
			return nvml.ERROR_IN_USE
		}
		g.gis = slices.DeleteFunc(g.gis, func(x *fakeGI) bool { return x == fgi })
		return nvml.SUCCESS
	}
	g.gis = append(g.gis, fgi)
	return fgi
}

// addCI creates a compute instance in fgi.
func (fgi *fakeGI) addCI(info *nvml.ComputeInstanceProfileInfo) *fakeCI {
	fgi.nextCI++
	fci := &fakeCI{gi: fgi, uuid: fmt.Sprintf("MIG-%s-%d-%d", fgi.gpu.uuid, fgi.info.Id, fgi.nextCI)}
	fci.info = nvml.ComputeInstanceInfo{Device: fgi.info.Device, GpuInstance: fgi.gi, Id: fgi.nextCI, ProfileId: info.Id}
	ci := &mock.ComputeInstance{}
	fci.ci = ci
	ci.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) { return fci.info, nvml.SUCCESS }
	ci.DestroyFunc = func() nvml.Return {
		if ret, ok := fgi.gpu.take("ComputeInstance.Destroy"); ok {
			return ret
		}
		fgi.cis = slices.DeleteFunc(fgi.cis, func(x *fakeCI) bool { return x == fci })
		return nvml.SUCCESS
	}
	fgi.cis = append(fgi.cis, fci)
	return fci
}
