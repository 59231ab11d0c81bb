package nvmlx

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
	"github.com/migagent/mig-agent/profiles"
)

// realA30PCIDeviceID is the A30, whose NVML InstanceCount values are wrong
// (NVIDIA's mig-parted hard-codes its profiles for that reason).
const realA30PCIDeviceID = 0x20B710DE

// realProfile is one GPU instance profile: NVML's info (what create and list
// calls take; only its Id reaches the driver) and the catalogue entry.
type realProfile struct {
	info nvml.GpuInstanceProfileInfo
	prof profiles.Profile
}

// Devices discovers every GPU NVML sees, with its MIG mode and catalogue.
func (g *realGPU) Devices() ([]Device, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	done, err := g.open("DeviceGetCount")
	if err != nil {
		return nil, err
	}
	defer done()
	n, ret := g.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, realError("DeviceGetCount", -1, ret)
	}
	out := make([]Device, 0, n)
	var unusable []UnusableGPU
	for i := range n {
		d, err := g.discover(i)
		if err == nil {
			out = append(out, d)
			continue
		}
		// NVML itself gone is no fault of this GPU: the whole call fails.
		if realWholeNVML(err) {
			return nil, fmt.Errorf("discover GPU %d: %w", i, err)
		}
		// nvml.h nvmlDeviceGetCount_v2: "the count can contain devices that
		// are not accessible" (NO_PERMISSION); a lost or broken GPU is left
		// alone the same way, and the others go on.
		delete(g.handles, i)
		u := UnusableGPU{Index: i, Return: "ERROR_UNKNOWN", Reason: err.Error(), Err: err}
		var ne *Error
		if errors.As(err, &ne) {
			u.Return = ne.Return
		}
		if g.firstTime("unusable/"+u.Return, i) {
			g.log.Warn("GPU cannot be read through NVML; leaving it alone", "gpu", i, "return", u.Return, "err", err)
		}
		unusable = append(unusable, u)
	}
	if len(unusable) > 0 {
		return out, &UnusableError{GPUs: unusable}
	}
	return out, nil
}

// realWholeNVML reports whether err means NVML as a whole cannot answer
// (not initialized, the driver unloaded, the library gone), as opposed to
// one GPU failing.
func realWholeNVML(err error) bool {
	for _, r := range []string{"ERROR_UNINITIALIZED", "ERROR_DRIVER_NOT_LOADED", "ERROR_LIBRARY_NOT_FOUND",
		"ERROR_LIB_RM_VERSION_MISMATCH"} {
		if errors.Is(err, &Error{Return: r}) {
			return true
		}
	}
	return false
}

// discover reads one GPU. Callers hold g.mu.
func (g *realGPU) discover(i int) (Device, error) {
	dev, err := g.device(i)
	if err != nil {
		return Device{}, err
	}
	d, total, err := g.facts(i, dev)
	if err != nil {
		return Device{}, err
	}
	d.MigMode, d.MigCapable, err = g.migMode(i, dev)
	if err != nil || !d.MigCapable {
		return d, err
	}
	gps, err := g.giProfiles(i, dev, d.PCIDeviceID, total)
	if err != nil {
		return Device{}, err
	}
	d.Catalogue = realCatalogueOf(gps)
	return d, nil
}

// facts reads what does not depend on MIG: identity, memory, architecture.
// It returns the total memory in bytes too, for profile names.
func (g *realGPU) facts(i int, dev nvml.Device) (Device, uint64, error) {
	d := Device{Index: i, UUID: g.handles[i].uuid}
	var ret nvml.Return
	if d.Name, ret = dev.GetName(); ret != nvml.SUCCESS {
		return d, 0, realError("GetName", i, ret)
	}
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return d, 0, realError("GetPciInfo", i, ret)
	}
	d.PCIDeviceID, d.PCISubsystemID, d.PCIBusID = pci.PciDeviceId, pci.PciSubSystemId, realBusID(pci.BusId)
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return d, 0, realError("GetMemoryInfo", i, ret)
	}
	d.MemoryMiB = mem.Total >> 20
	d.Architecture = "unknown"
	if g.hasSymbol("nvmlDeviceGetArchitecture") {
		if a, ret := dev.GetArchitecture(); ret == nvml.SUCCESS {
			d.Architecture = realArchName(a)
		} else {
			g.log.Debug("NVML architecture query failed", "gpu", i, "return", nvmlreturn.Name(ret))
		}
	}
	if m, ok := profiles.ModelByPCIID(d.PCIDeviceID); ok && d.Architecture == "unknown" {
		d.Architecture = m.Architecture
	}
	return d, mem.Total, nil
}

// realArchName maps NVML's architecture to the name mig-agent reports.
func realArchName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "volta"
	case nvml.DEVICE_ARCH_TURING:
		return "turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return profiles.ArchAmpere
	case nvml.DEVICE_ARCH_ADA:
		return profiles.ArchAda
	case nvml.DEVICE_ARCH_HOPPER:
		return profiles.ArchHopper
	case nvml.DEVICE_ARCH_BLACKWELL:
		return profiles.ArchBlackwell
	case nvml.DEVICE_ARCH_RUBIN:
		return "rubin"
	}
	return "unknown"
}

// migMode reads the MIG mode; a GPU is MIG capable iff GetMigMode
// succeeds. A driver without the entry point predates MIG.
func (g *realGPU) migMode(i int, dev nvml.Device) (MigMode, bool, error) {
	if !g.hasSymbol("nvmlDeviceGetMigMode") {
		g.log.Debug("NVML has no nvmlDeviceGetMigMode: driver predates MIG", "gpu", i)
		return MigMode{}, false, nil
	}
	cur, pend, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		return MigMode{Current: cur == nvml.DEVICE_MIG_ENABLE, Pending: pend == nvml.DEVICE_MIG_ENABLE}, true, nil
	case nvml.ERROR_NOT_SUPPORTED:
		return MigMode{}, false, nil
	}
	return MigMode{}, false, realError("GetMigMode", i, ret)
}

// giProfiles lists GPU i's GPU instance profiles. It walks every profile
// index and goes on past NOT_SUPPORTED and INVALID_ARGUMENT (drivers leave
// holes: 580 answers INVALID_ARGUMENT at 17 below the header's count).
// Names are computed from memory, never read from NVML. Where NVML cannot
// list profiles (old drivers with MIG disabled) or placements, or counts
// wrongly (A30), the static catalogue of the model fills in, with a log
// line. Callers hold g.mu.
func (g *realGPU) giProfiles(i int, dev nvml.Device, pciID uint32, total uint64) ([]realProfile, error) {
	var static *profiles.Catalogue
	model, known := profiles.ModelByPCIID(pciID)
	if known && model.MigCapable && len(model.Catalogue.Profiles) > 0 {
		static = &model.Catalogue
	}
	var out []realProfile
	for idx := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(idx)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
			continue
		default:
			return nil, realError("GetGpuInstanceProfileInfo", i, ret)
		}
		out = append(out, realProfile{info: info, prof: profiles.Profile{
			Name:            profiles.ProfileName(idx, info.MemorySizeMB, total),
			ID:              int(info.Id),
			Index:           idx,
			Slices:          int(info.SliceCount),
			MemoryMiB:       info.MemorySizeMB,
			MaxCount:        int(info.InstanceCount),
			Multiprocessors: int(info.MultiprocessorCount),
			CopyEngines:     int(info.CopyEngineCount),
			Decoders:        int(info.DecoderCount),
			Encoders:        int(info.EncoderCount),
			JPEGs:           int(info.JpegCount),
			OFAs:            int(info.OfaCount),
		}})
	}
	if len(out) == 0 {
		if static == nil {
			return nil, fmt.Errorf("MIG-capable GPU 0x%08X lists no MIG profiles (an old driver does so while MIG is disabled) "+
				"and mig-agent has no static catalogue for this model; upgrade the driver or enable MIG mode: %w",
				pciID, realError("GetGpuInstanceProfileInfo", i, nvml.ERROR_NOT_SUPPORTED))
		}
		if g.firstTime("static-catalogue", i) {
			g.log.Warn("NVML lists no MIG profiles; using the static catalogue of the model (old driver)",
				"gpu", i, "model", model.Key, "pciDeviceId", fmt.Sprintf("0x%08X", pciID))
		}
		return realStaticProfiles(static), nil
	}

	canPlace := g.hasSymbol("nvmlDeviceGetGpuInstancePossiblePlacements_v2", "nvmlDeviceGetGpuInstancePossiblePlacements")
	for k := range out {
		p := &out[k].prof
		pls, err := g.placements(i, dev, &out[k].info, canPlace)
		if err != nil {
			sp := realStaticMatch(static, *p)
			if sp == nil {
				return nil, fmt.Errorf("placements of profile %s: %w", p.Name, err)
			}
			if g.firstTime("static-placements/"+p.Name, i) {
				g.log.Warn("NVML lists no placements; using the static catalogue's",
					"gpu", i, "profile", p.Name, "model", model.Key, "error", err)
			}
			pls = slices.Clone(sp.Placements)
		}
		p.Placements = pls
	}

	if pciID == realA30PCIDeviceID {
		g.fixA30Counts(i, out, static)
	}
	kept := out[:0]
	for _, gp := range out {
		if gp.prof.MaxCount <= 0 {
			g.log.Debug("skipping a MIG profile NVML offers no instance of", "gpu", i, "profile", gp.prof.Name)
			continue
		}
		kept = append(kept, gp)
	}
	out = kept
	for k := range out {
		out[k].prof.ComputeProfiles = realComputeProfiles(out[k].prof, realStaticMatch(static, out[k].prof))
	}
	if err := realUniqueNames(i, out); err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(a, b int) bool {
		pa, pb := out[a].prof, out[b].prof
		if pa.Slices != pb.Slices {
			return pa.Slices < pb.Slices
		}
		if pa.MemoryMiB != pb.MemoryMiB {
			return pa.MemoryMiB < pb.MemoryMiB
		}
		return pa.Index < pb.Index
	})
	return out, nil
}

// fixA30Counts replaces NVML's instance counts on an A30 with the static
// catalogue's (NVML's GetGpuInstanceProfileInfo reports wrong InstanceCount
// values for this GPU).
func (g *realGPU) fixA30Counts(i int, gps []realProfile, static *profiles.Catalogue) {
	say := g.firstTime("a30", i)
	if static == nil {
		if say {
			g.log.Warn("A30: NVML's instance counts are known to be wrong and mig-agent has no static catalogue to correct them",
				"gpu", i)
		}
		return
	}
	if say {
		g.log.Info("A30: NVML's instance counts are known to be wrong; using the static catalogue's", "gpu", i)
	}
	for k := range gps {
		p := &gps[k].prof
		sp := realStaticMatch(static, *p)
		if sp == nil {
			if say {
				g.log.Warn("A30: profile not in the static catalogue; keeping NVML's count",
					"gpu", i, "profile", p.Name, "count", p.MaxCount)
			}
			continue
		}
		if say && sp.MaxCount != p.MaxCount {
			g.log.Info("A30: instance count corrected", "gpu", i, "profile", p.Name, "nvml", p.MaxCount, "catalogue", sp.MaxCount)
		}
		p.MaxCount = sp.MaxCount
	}
}

// placements lists where a profile's instances can sit.
func (g *realGPU) placements(i int, dev nvml.Device, info *nvml.GpuInstanceProfileInfo, available bool) ([]profiles.Placement, error) {
	const op = "GetGpuInstancePossiblePlacements"
	if !available {
		return nil, g.needSymbol(op, i, "nvmlDeviceGetGpuInstancePossiblePlacements_v2", "nvmlDeviceGetGpuInstancePossiblePlacements")
	}
	pls, ret := dev.GetGpuInstancePossiblePlacements(info)
	if ret != nvml.SUCCESS {
		return nil, realError(op, i, ret)
	}
	out := make([]profiles.Placement, len(pls))
	for k, pl := range pls {
		out[k] = profiles.Placement{Start: int(pl.Start), Size: int(pl.Size)}
	}
	return out, nil
}

// realStaticProfiles turns a static catalogue into realProfiles: the NVML info
// carries the profile id, which is all create and list calls pass on.
func realStaticProfiles(c *profiles.Catalogue) []realProfile {
	out := make([]realProfile, len(c.Profiles))
	for k, p := range c.Profiles {
		p.Placements = slices.Clone(p.Placements)
		p.ComputeProfiles = slices.Clone(p.ComputeProfiles)
		if len(p.ComputeProfiles) == 0 {
			p.ComputeProfiles = realComputeProfiles(p, nil)
		}
		out[k] = realProfile{prof: p, info: nvml.GpuInstanceProfileInfo{
			Id:            uint32(p.ID),
			SliceCount:    uint32(p.Slices),
			InstanceCount: uint32(p.MaxCount),
			MemorySizeMB:  p.MemoryMiB,
		}}
	}
	return out
}

// realStaticMatch is the static catalogue's profile that is p: the same
// profile id, index and slice count (nil when none is). An id alone is not
// enough: a driver or a GPU whose ids differ from the catalogue's would
// otherwise take another profile's placements, counts or compute profiles.
func realStaticMatch(c *profiles.Catalogue, p profiles.Profile) *profiles.Profile {
	if c == nil {
		return nil
	}
	sp, ok := c.ByID(p.ID)
	if !ok || sp.Index != p.Index || sp.Slices != p.Slices {
		return nil
	}
	return sp
}

// realUniqueNames refuses a profile list in which two profiles have the
// same canonical name: a config names profiles by name, so either could be
// created for it. NVML would have to report two profiles of the same
// slices and memory at different indices without an attribute that tells
// them apart (ProfileName names +me and the others by index).
func realUniqueNames(i int, gps []realProfile) error {
	seen := map[string]int{}
	for _, gp := range gps {
		if idx, dup := seen[gp.prof.Name]; dup {
			return fmt.Errorf("GPU %d: NVML reports two MIG profiles with the same name %s (profile indices %d and %d, ids differ or not): "+
				"a config could not say which one it means; refusing to manage this GPU", i, gp.prof.Name, idx, gp.prof.Index)
		}
		seen[gp.prof.Name] = gp.prof.Index
	}
	return nil
}

// realCatalogueOf builds the catalogue; the memory slice count is where the
// last placement ends.
func realCatalogueOf(gps []realProfile) profiles.Catalogue {
	c := profiles.Catalogue{Profiles: make([]profiles.Profile, len(gps))}
	for k, gp := range gps {
		c.Profiles[k] = gp.prof
		for _, pl := range gp.prof.Placements {
			c.MemorySlices = max(c.MemorySlices, pl.End())
		}
	}
	return c
}

// realComputeProfiles are the compute instance profiles of GPU instance
// profile p. NVML can only list them through an existing GPU instance, so
// they come from the model's static catalogue (static, matched by profile
// id) or else from NVIDIA's standard set; either way named after p.
func realComputeProfiles(p profiles.Profile, static *profiles.Profile) []profiles.ComputeProfile {
	n, err := profiles.Parse(p.Name)
	if err != nil {
		return nil
	}
	if static != nil && len(static.ComputeProfiles) > 0 {
		out := slices.Clone(static.ComputeProfiles)
		for k := range out {
			cn := n
			cn.C = out[k].Slices
			out[k].Name = cn.String()
		}
		return out
	}
	return profiles.StandardComputeProfiles(n)
}
