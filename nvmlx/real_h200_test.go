package nvmlx

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
	"github.com/migagent/mig-agent/profiles"
)

// realH200Capture is a read-only capture from a real H200 (see
// real_hw_test.go and hack/h200-readonly-check.sh).
const realH200Capture = "testdata/h200-real-profiles.json"

func loadRealCapture(t *testing.T, path string) realCapture {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read capture: %v", err)
	}
	var c realCapture
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	if len(c.GPUs) == 0 || len(c.GPUs) != len(c.Raw) {
		t.Fatalf("%s: %d GPUs and %d raw records", path, len(c.GPUs), len(c.Raw))
	}
	return c
}

// fakeFromRaw replays one GPU's recorded NVML answers.
func fakeFromRaw(t *testing.T, r realRawGPU) *fakeNVML {
	t.Helper()
	pciID, err := parsePCIDeviceID(r.PCIDeviceID)
	if err != nil {
		t.Fatalf("pciDeviceId %q: %v", r.PCIDeviceID, err)
	}
	m, ok := profiles.ModelByPCIID(pciID)
	if !ok {
		t.Fatalf("no model for %s", r.PCIDeviceID)
	}
	f := newFakeNVML(m.Key)
	g := f.gpus[0]
	g.uuid = r.UUID
	g.migCur, g.migPend = r.MigMode.Current, r.MigMode.Pending
	g.infos, g.infoRet = map[int]nvml.GpuInstanceProfileInfo{}, map[int]nvml.Return{}
	placements := map[uint32][]nvml.GpuInstancePlacement{}
	if len(r.Profiles) != nvml.GPU_INSTANCE_PROFILE_COUNT {
		t.Fatalf("%d profile indices recorded, want %d", len(r.Profiles), nvml.GPU_INSTANCE_PROFILE_COUNT)
	}
	for _, p := range r.Profiles {
		ret, ok := nvmlreturn.ByName(p.Return)
		if !ok {
			t.Fatalf("unknown NVML return %q", p.Return)
		}
		if ret != nvml.SUCCESS {
			g.infoRet[p.Index] = ret
			continue
		}
		if p.Info == nil || p.PlacementsReturn != "SUCCESS" {
			t.Fatalf("index %d: SUCCESS without info or placements (%s)", p.Index, p.PlacementsReturn)
		}
		g.infos[p.Index] = *p.Info
		placements[p.Info.Id] = p.Placements
	}
	d := g.dev
	d.GetNameFunc = func() (string, nvml.Return) { return r.Name, nvml.SUCCESS }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		return nvml.PciInfo{PciDeviceId: pciID, BusId: cBusID(r.PCIBusID)}, nvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{Total: r.MemoryTotalBytes}, nvml.SUCCESS
	}
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) {
		return nvml.DeviceArchitecture(r.Architecture), nvml.SUCCESS
	}
	d.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		pls, ok := placements[info.Id]
		if !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return pls, nvml.SUCCESS
	}
	return f
}

// sameProfiles compares two catalogues profile by profile (by id): name,
// max count, memory and placements, both ways.
func sameProfiles(t *testing.T, what string, got, want profiles.Catalogue) {
	t.Helper()
	if len(got.Profiles) != len(want.Profiles) {
		t.Errorf("%s: %d profiles [%s], want %d [%s]", what, len(got.Profiles), got.Names(), len(want.Profiles), want.Names())
	}
	for _, w := range want.Profiles {
		g, ok := got.ByID(w.ID)
		if !ok {
			t.Errorf("%s: no profile id %d (%s)", what, w.ID, w.Name)
			continue
		}
		if g.Name != w.Name || g.MaxCount != w.MaxCount || g.MemoryMiB != w.MemoryMiB || !reflect.DeepEqual(g.Placements, w.Placements) {
			t.Errorf("%s: profile id %d:\ngot  %s max %d %d MiB %v\nwant %s max %d %d MiB %v", what, w.ID,
				g.Name, g.MaxCount, g.MemoryMiB, g.Placements, w.Name, w.MaxCount, w.MemoryMiB, w.Placements)
		}
	}
	if got.MemorySlices != want.MemorySlices {
		t.Errorf("%s: %d memory slices, want %d", what, got.MemorySlices, want.MemorySlices)
	}
}

// TestRealH200Capture: what the real backend read on a real H200 is what
// the simulator claims for "h200", and the recorded NVML answers, replayed,
// build the same catalogue again.
func TestRealH200Capture(t *testing.T) {
	c := loadRealCapture(t, realH200Capture)
	sim := simDeviceOf(t, "h200")
	for i, gpu := range c.GPUs {
		if gpu.PCIDeviceID != sim.PCIDeviceIDString() || gpu.Name != sim.Name || gpu.MemoryMiB != sim.MemoryMiB ||
			gpu.Architecture != sim.Architecture || !gpu.MigCapable {
			t.Errorf("GPU %d: %s %s %d MiB %s MIG %v; simulator: %s %s %d MiB %s", i, gpu.Name, gpu.PCIDeviceID,
				gpu.MemoryMiB, gpu.Architecture, gpu.MigCapable, sim.Name, sim.PCIDeviceIDString(), sim.MemoryMiB, sim.Architecture)
		}
		sameProfiles(t, "captured vs simulator", gpu.Catalogue, sim.Catalogue)
		if !reflect.DeepEqual(gpu.Catalogue, sim.Catalogue) {
			t.Errorf("GPU %d: captured catalogue differs from the simulator's (engines, compute profiles or order):\ngot  %+v\nwant %+v",
				i, gpu.Catalogue, sim.Catalogue)
		}

		raw := c.Raw[i]
		g := newTestReal(t, fakeFromRaw(t, raw))
		ds, err := g.Devices()
		if err != nil {
			t.Fatalf("replay: Devices: %v", err)
		}
		rebuilt := ds[0]
		if !reflect.DeepEqual(rebuilt.Catalogue, gpu.Catalogue) {
			t.Errorf("replay: catalogue\ngot  %+v\nwant %+v", rebuilt.Catalogue, gpu.Catalogue)
		}
		if rebuilt.Name != gpu.Name || rebuilt.UUID != gpu.UUID || rebuilt.PCIBusID != gpu.PCIBusID ||
			rebuilt.MemoryMiB != gpu.MemoryMiB || rebuilt.Architecture != gpu.Architecture || rebuilt.MigMode != gpu.MigMode {
			t.Errorf("replay: device\ngot  %+v\nwant %+v", rebuilt, gpu.Device)
		}
	}
}
