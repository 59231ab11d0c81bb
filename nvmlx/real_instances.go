package nvmlx

import (
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
	"github.com/migagent/mig-agent/profiles"
)

// realListSlots is how many handles a list call makes room for: go-nvml
// sizes the buffer by the profile's InstanceCount (and refuses 0), which is
// wrong on an A30. No GPU has more memory slices than this.
const realListSlots = 8

// realNotAvailable is NVML's 0xFFFFFFFF "no GPU/compute instance" id.
const realNotAvailable = ^uint32(0)

// profilesOf lists GPU i's GPU instance profiles with what discovery
// needs to name them. Callers hold g.mu.
func (g *realGPU) profilesOf(i int, dev nvml.Device) ([]realProfile, error) {
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return nil, realError("GetPciInfo", i, ret)
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return nil, realError("GetMemoryInfo", i, ret)
	}
	return g.giProfiles(i, dev, pci.PciDeviceId, mem.Total)
}

// Instances lists GPU i's GPU instances (with placement) and their compute
// instances, each with the UUID of the MIG device it exposes.
func (g *realGPU) Instances(i int) ([]GPUInstance, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	done, err := g.open("GetGpuInstances")
	if err != nil {
		return nil, err
	}
	defer done()
	dev, err := g.device(i)
	if err != nil {
		return nil, err
	}
	mode, capable, err := g.migMode(i, dev)
	if err != nil {
		return nil, err
	}
	out := []GPUInstance{}
	if !capable || !mode.Current {
		return out, nil
	}
	gps, err := g.profilesOf(i, dev)
	if err != nil {
		return nil, err
	}
	uuids, err := g.migUUIDs(i, dev)
	if err != nil {
		return nil, err
	}
	for _, gp := range gps {
		info := gp.info
		info.InstanceCount = max(info.InstanceCount, realListSlots)
		gis, ret := dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU instances of profile %s: %w", gp.prof.Name, realError("GetGpuInstances", i, ret))
		}
		for _, gi := range gis {
			inst, err := g.gpuInstance(i, gi, gp.prof, uuids)
			if err != nil {
				return nil, err
			}
			out = append(out, inst)
		}
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].Placement.Start != out[b].Placement.Start {
			return out[a].Placement.Start < out[b].Placement.Start
		}
		return out[a].ID < out[b].ID
	})
	return out, nil
}

// gpuInstance reads one GPU instance and its compute instances.
func (g *realGPU) gpuInstance(i int, gi nvml.GpuInstance, prof profiles.Profile, uuids map[[2]int]string) (GPUInstance, error) {
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return GPUInstance{}, realError("GpuInstance.GetInfo", i, ret)
	}
	inst := GPUInstance{
		ID:               int(info.Id),
		ProfileID:        int(info.ProfileId),
		Profile:          prof.Name,
		Placement:        profiles.Placement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)},
		ComputeInstances: []ComputeInstance{},
	}
	for idx := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		cpi, ret := gi.GetComputeInstanceProfileInfo(idx, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
			continue
		default:
			return GPUInstance{}, realError("GetComputeInstanceProfileInfo", i, ret)
		}
		cpi.InstanceCount = max(cpi.InstanceCount, realListSlots)
		cis, ret := gi.GetComputeInstances(&cpi)
		if ret != nvml.SUCCESS {
			return GPUInstance{}, realError("GetComputeInstances", i, ret)
		}
		for _, ci := range cis {
			cinfo, ret := ci.GetInfo()
			if ret != nvml.SUCCESS {
				return GPUInstance{}, realError("ComputeInstance.GetInfo", i, ret)
			}
			inst.ComputeInstances = append(inst.ComputeInstances, ComputeInstance{
				ID:        int(cinfo.Id),
				ProfileID: int(cinfo.ProfileId),
				Profile:   realCIName(prof, int(cpi.SliceCount)),
				UUID:      uuids[[2]int{inst.ID, int(cinfo.Id)}],
			})
		}
	}
	sort.Slice(inst.ComputeInstances, func(a, b int) bool {
		return inst.ComputeInstances[a].ID < inst.ComputeInstances[b].ID
	})
	return inst, nil
}

// realCIName names a compute instance of c slices in a GPU instance of
// profile p: "1c.3g.71gb", or p's own name for the full one.
func realCIName(p profiles.Profile, c int) string {
	n, err := profiles.Parse(p.Name)
	if err != nil || c <= 0 {
		return p.Name
	}
	n.C = c
	return n.String()
}

// migUUIDs maps (GI id, CI id) to the UUID of the MIG device, walking the
// MIG device handles of GPU i. Callers hold g.mu.
func (g *realGPU) migUUIDs(i int, dev nvml.Device) (map[[2]int]string, error) {
	out := map[[2]int]string{}
	if !g.hasSymbol("nvmlDeviceGetMigDeviceHandleByIndex") || !g.hasSymbol("nvmlDeviceGetMaxMigDeviceCount") {
		return nil, g.needSymbol("GetMigDeviceHandleByIndex", i, "nvmlDeviceGetMigDeviceHandleByIndex")
	}
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, realError("GetMaxMigDeviceCount", i, ret)
	}
	for k := range n {
		mig, ret := dev.GetMigDeviceHandleByIndex(k)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_FOUND, nvml.ERROR_INVALID_ARGUMENT:
			continue // an empty slot
		default:
			return nil, realError("GetMigDeviceHandleByIndex", i, ret)
		}
		giID, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return nil, realError("GetGpuInstanceId", i, ret)
		}
		ciID, ret := mig.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return nil, realError("GetComputeInstanceId", i, ret)
		}
		// The UUID names the MIG device to the pods that use it; reading the
		// geometry needs none. One that cannot be read is left empty (and
		// logged): a change that takes that device away cannot tell its
		// pods and stops there (gpus.Takes' caller), instead of every read
		// of the GPUs failing.
		uuid, ret := mig.GetUUID()
		if ret != nvml.SUCCESS {
			if g.firstTime(fmt.Sprintf("mig-uuid/%d/%d", giID, ciID), i) {
				g.log.Warn("reading a MIG device's UUID failed; it stays unknown", "gpu", i, "gi", giID, "ci", ciID, "error", realError("GetUUID", i, ret))
			}
			continue
		}
		out[[2]int{giID, ciID}] = uuid
	}
	return out, nil
}

// SetMigMode asks NVML for a MIG mode and returns the mode read back.
// go-nvml returns (activationStatus, ret) in that order; both are checked.
// An activation that did not happen (IN_USE: a client kept the driver from
// resetting the GPU; RESET_REQUIRED: no reset exposed, as in pass-through
// VMs; nvml.h nvmlDeviceSetMigMode) is no error when the mode reads back
// pending: the caller resets the GPU or reboots, as NVIDIA's mig-parted
// does (it ignores the activation status and compares current with
// pending). A failed call (ret), or an activation failure that left nothing
// pending, is an error.
func (g *realGPU) SetMigMode(i int, enabled bool) (MigMode, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	const op = "SetMigMode"
	done, err := g.open(op)
	if err != nil {
		return MigMode{}, err
	}
	defer done()
	dev, err := g.device(i)
	if err != nil {
		return MigMode{}, err
	}
	if err := g.needSymbol(op, i, "nvmlDeviceSetMigMode"); err != nil {
		return MigMode{}, err
	}
	want := nvml.DEVICE_MIG_DISABLE
	if enabled {
		want = nvml.DEVICE_MIG_ENABLE
	}
	activation, ret := dev.SetMigMode(want)
	// The device may have been unbound and rebound: handles go stale.
	dev, rerr := g.reacquire(i)
	var mode MigMode
	if rerr == nil {
		cur, pend, gret := dev.GetMigMode()
		if gret != nvml.SUCCESS {
			rerr = realError("GetMigMode", i, gret)
		}
		mode = MigMode{Current: cur == nvml.DEVICE_MIG_ENABLE, Pending: pend == nvml.DEVICE_MIG_ENABLE}
	}
	switch {
	case ret != nvml.SUCCESS:
		return mode, realError(op, i, ret)
	case rerr != nil:
		return mode, fmt.Errorf("read MIG mode back after setting it: %w", rerr)
	case activation != nvml.SUCCESS && mode.Pending == enabled && mode.Current != enabled:
		g.log.Info("MIG mode change pending until a GPU reset or reboot", "gpu", i, "enabled", enabled,
			"activation", nvmlreturn.Name(activation))
		return mode, nil
	case activation != nvml.SUCCESS && mode.Current != enabled:
		return mode, fmt.Errorf("activation of the MIG mode failed and nothing is pending (current %t, pending %t): %w",
			mode.Current, mode.Pending, realError(op, i, activation))
	}
	g.log.Info("MIG mode set", "gpu", i, "enabled", enabled, "current", mode.Current, "pending", mode.Pending)
	return mode, nil
}

// CreateGPUInstance creates a GPU instance of the profile with NVML id
// profileID at a placement and returns its GI id.
func (g *realGPU) CreateGPUInstance(i, profileID int, at profiles.Placement) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	const op = "CreateGpuInstanceWithPlacement"
	done, err := g.open(op)
	if err != nil {
		return 0, err
	}
	defer done()
	if at.Start < 0 || at.Size <= 0 {
		return 0, fmt.Errorf("placement %s: %w", at, realError(op, i, nvml.ERROR_INVALID_ARGUMENT))
	}
	dev, err := g.device(i)
	if err != nil {
		return 0, err
	}
	if err := g.needSymbol(op, i, "nvmlDeviceCreateGpuInstanceWithPlacement"); err != nil {
		return 0, err
	}
	gps, err := g.profilesOf(i, dev)
	if err != nil {
		return 0, err
	}
	var gp *realProfile
	for k := range gps {
		if gps[k].prof.ID == profileID {
			gp = &gps[k]
		}
	}
	if gp == nil {
		return 0, fmt.Errorf("GPU %d has no GPU instance profile with id %d: %w",
			i, profileID, realError("GetGpuInstanceProfileInfo", i, nvml.ERROR_NOT_FOUND))
	}
	pl := nvml.GpuInstancePlacement{Start: uint32(at.Start), Size: uint32(at.Size)}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&gp.info, &pl)
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("create %s at %s: %w", gp.prof.Name, at, realError(op, i, ret))
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return 0, realError("GpuInstance.GetInfo", i, ret)
	}
	g.log.Info("GPU instance created", "gpu", i, "profile", gp.prof.Name, "placement", at.String(), "gi", info.Id)
	return int(info.Id), nil
}

// CreateComputeInstance creates a compute instance of the compute profile
// at index ciProfileIndex inside GPU instance giID. The profile's info (its
// id above all, which is what the driver creates by) is read from NVML
// through the GPU instance: the id is NVML's to give (nvml.h
// nvmlComputeInstanceProfileInfo_t.id, "unique profile ID within the GPU
// instance"), not assumed equal to the index.
func (g *realGPU) CreateComputeInstance(i, giID, ciProfileIndex int) (ComputeInstance, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	const op = "CreateComputeInstance"
	done, err := g.open(op)
	if err != nil {
		return ComputeInstance{}, err
	}
	defer done()
	dev, err := g.device(i)
	if err != nil {
		return ComputeInstance{}, err
	}
	gi, ret := dev.GetGpuInstanceById(giID)
	if ret != nvml.SUCCESS {
		return ComputeInstance{}, fmt.Errorf("GPU instance %d: %w", giID, realError("GetGpuInstanceById", i, ret))
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return ComputeInstance{}, realError("GpuInstance.GetInfo", i, ret)
	}
	info, ret := gi.GetComputeInstanceProfileInfo(ciProfileIndex, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
		return ComputeInstance{}, fmt.Errorf("GPU instance %d offers no compute instance profile at index %d (NVML: %s): %w",
			giID, ciProfileIndex, nvmlreturn.Name(ret), realError("GetComputeInstanceProfileInfo", i, nvml.ERROR_NOT_FOUND))
	default:
		return ComputeInstance{}, realError("GetComputeInstanceProfileInfo", i, ret)
	}
	cpi := &info
	ci, ret := gi.CreateComputeInstance(cpi)
	if ret != nvml.SUCCESS {
		return ComputeInstance{}, fmt.Errorf("in GPU instance %d: %w", giID, realError(op, i, ret))
	}
	cinfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return ComputeInstance{}, realError("ComputeInstance.GetInfo", i, ret)
	}
	out := ComputeInstance{ID: int(cinfo.Id), ProfileID: int(cinfo.ProfileId)}
	// The name and UUID are for the caller's information; the instance
	// exists whether or not they can be read.
	if gps, err := g.profilesOf(i, dev); err == nil {
		for _, gp := range gps {
			if gp.prof.ID == int(giInfo.ProfileId) {
				out.Profile = realCIName(gp.prof, int(cpi.SliceCount))
			}
		}
	}
	if uuids, err := g.migUUIDs(i, dev); err == nil {
		out.UUID = uuids[[2]int{giID, out.ID}]
	} else {
		g.log.Warn("MIG device UUID unreadable", "gpu", i, "gi", giID, "ci", out.ID, "error", err)
	}
	g.log.Info("compute instance created", "gpu", i, "gi", giID, "ci", out.ID, "profile", out.Profile)
	return out, nil
}

// DestroyComputeInstance destroys compute instance ciID of GPU instance giID.
func (g *realGPU) DestroyComputeInstance(i, giID, ciID int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	const op = "ComputeInstance.Destroy"
	done, err := g.open(op)
	if err != nil {
		return err
	}
	defer done()
	gi, err := g.gpuInstanceByID(i, giID)
	if err != nil {
		return err
	}
	ci, ret := gi.GetComputeInstanceById(ciID)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("compute instance %d of GPU instance %d: %w", ciID, giID, realError("GetComputeInstanceById", i, ret))
	}
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		return fmt.Errorf("compute instance %d of GPU instance %d: %w", ciID, giID, realError(op, i, ret))
	}
	g.log.Info("compute instance destroyed", "gpu", i, "gi", giID, "ci", ciID)
	return nil
}

// DestroyGPUInstance destroys GPU instance giID. Its compute instances must
// be gone first (NVML answers IN_USE otherwise, as it does while processes
// run); the backend does not destroy them behind the caller's back.
func (g *realGPU) DestroyGPUInstance(i, giID int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	const op = "GpuInstance.Destroy"
	done, err := g.open(op)
	if err != nil {
		return err
	}
	defer done()
	gi, err := g.gpuInstanceByID(i, giID)
	if err != nil {
		return err
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		return fmt.Errorf("GPU instance %d: %w", giID, realError(op, i, ret))
	}
	g.log.Info("GPU instance destroyed", "gpu", i, "gi", giID)
	return nil
}

// Processes lists the compute, graphics and MPS client processes NVML sees
// on GPU i, with the GPU and compute instance each runs in (-1 outside MIG).
func (g *realGPU) Processes(i int) ([]Process, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	done, err := g.open("GetComputeRunningProcesses")
	if err != nil {
		return nil, err
	}
	defer done()
	dev, err := g.device(i)
	if err != nil {
		return nil, err
	}
	lists := []struct {
		op      string
		symbols []string
		get     func() ([]nvml.ProcessInfo, nvml.Return)
	}{
		{"GetComputeRunningProcesses", []string{"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses"}, dev.GetComputeRunningProcesses},
		{"GetGraphicsRunningProcesses", []string{"nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses"}, dev.GetGraphicsRunningProcesses},
		{"GetMPSComputeRunningProcesses", []string{"nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses"}, dev.GetMPSComputeRunningProcesses},
	}
	out := []Process{}
	seen := map[Process]bool{}
	answered := 0 // lists NVML could read
	for _, l := range lists {
		if !g.hasSymbol(l.symbols...) {
			if l.op == "GetComputeRunningProcesses" {
				return nil, g.needSymbol(l.op, i, l.symbols...)
			}
			continue
		}
		ps, ret := l.get()
		switch ret {
		case nvml.SUCCESS:
			answered++
		case nvml.ERROR_NOT_SUPPORTED:
			continue
		default:
			return nil, realError(l.op, i, ret)
		}
		for _, p := range ps {
			q := Process{PID: p.Pid, GIID: realInstanceID(p.GpuInstanceId), CIID: realInstanceID(p.ComputeInstanceId)}
			if seen[q] {
				continue
			}
			seen[q] = true
			if g.hasSymbol("nvmlSystemGetProcessName") {
				if name, ret := g.lib.SystemGetProcessName(int(p.Pid)); ret == nvml.SUCCESS {
					q.Name = name
				}
			}
			out = append(out, q)
		}
	}
	if answered == 0 {
		// No list answered: "no processes" would be a guess. The stray
		// process check fails closed on this (the change waits, retried).
		return nil, fmt.Errorf("%w: GPU %d: every process list answered NOT_SUPPORTED", ErrProcessesUnknown, i)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].PID < out[b].PID })
	return out, nil
}

// realInstanceID maps NVML's "not available" id to -1.
func realInstanceID(id uint32) int {
	if id == realNotAvailable {
		return -1
	}
	return int(id)
}

// gpuInstanceByID finds GPU instance giID of GPU i (the caller holds g.mu).
func (g *realGPU) gpuInstanceByID(i, giID int) (nvml.GpuInstance, error) {
	dev, err := g.device(i)
	if err != nil {
		return nil, err
	}
	gi, ret := dev.GetGpuInstanceById(giID)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GPU instance %d: %w", giID, realError("GetGpuInstanceById", i, ret))
	}
	return gi, nil
}
