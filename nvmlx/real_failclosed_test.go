package nvmlx

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/migagent/mig-agent/profiles"
)

// The real backend fails closed (issue finding 11), read against go-nvml's
// mock servers (the fake NVML of real_fake_test.go is built on them).

// The static catalogue stands in for NVML only for the profile that is the
// same: id, index and slice count. A profile whose id is another's in the
// catalogue does not take that one's placements.
func TestRealStaticMatchNeedsIndexAndSlices(t *testing.T) {
	f := newFakeNVML("h200")
	fg := f.gpus[0]
	// NVML cannot list placements (an old driver): the catalogue fills in.
	fg.dev.GetGpuInstancePossiblePlacementsFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	g := newTestReal(t, f)
	if _, err := g.Devices(); err != nil {
		t.Fatalf("the same profiles as the catalogue: %v", err)
	}
	// The 1-slice profile reported with the 2-slice profile's id.
	two, _ := fg.model.Catalogue.ByIndex(profiles.Index2Slice)
	info := fg.infos[profiles.Index1Slice]
	info.Id = uint32(two.ID)
	fg.infos[profiles.Index1Slice] = info
	f2 := newTestReal(t, f)
	_, err := f2.Devices()
	if err == nil || !strings.Contains(err.Error(), "placements of profile 1g") {
		t.Fatalf("Devices: %v, want the 1-slice profile's placements refused (not the 2-slice profile's)", err)
	}
}

// Two profiles with the same canonical name are refused with a clear error.
func TestRealDuplicateProfileNames(t *testing.T) {
	f := newFakeNVML("h200")
	fg := f.gpus[0]
	// NVML reports index 1's profile again at index 0 (same slices and
	// memory, another id): both are named alike.
	a, b := fg.infos[profiles.Index1Slice], fg.infos[profiles.Index2Slice]
	dup := b
	dup.Id = a.Id + 100
	fg.infos[profiles.Index1Slice] = dup
	fg.dev.GetGpuInstancePossiblePlacementsFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		return []nvml.GpuInstancePlacement{{Start: 0, Size: 2}}, nvml.SUCCESS
	}
	g := newTestReal(t, f)
	_, err := g.Devices()
	if err == nil || !strings.Contains(err.Error(), "two MIG profiles with the same name") {
		t.Fatalf("Devices: %v, want duplicate names refused", err)
	}
}

// A MIG device whose UUID cannot be read does not fail the read of the
// GPUs: its UUID is empty (the change that takes it away stops there).
func TestRealMigUUIDOptional(t *testing.T) {
	f := newFakeNVML("h200")
	fg := f.gpus[0]
	g := newTestReal(t, f)
	if _, err := g.SetMigMode(0, true); err != nil {
		t.Fatal(err)
	}
	giID, err := g.CreateGPUInstance(0, 9, profiles.Placement{Start: 4, Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.CreateComputeInstance(0, giID, 0); err != nil {
		t.Fatal(err)
	}
	handles := fg.dev.GetMigDeviceHandleByIndexFunc
	fg.dev.GetMigDeviceHandleByIndexFunc = func(k int) (nvml.Device, nvml.Return) {
		d, ret := handles(k)
		if ret != nvml.SUCCESS {
			return d, ret
		}
		m := d.(*mock.Device)
		m.GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
		return m, ret
	}
	gis, err := g.Instances(0)
	if err != nil {
		t.Fatalf("Instances with an unreadable MIG UUID: %v", err)
	}
	if len(gis) != 1 || len(gis[0].ComputeInstances) != 1 || gis[0].ComputeInstances[0].UUID != "" {
		t.Fatalf("instances %+v, want one with an empty UUID", gis)
	}
	if !strings.Contains(g.logs.String(), "reading a MIG device's UUID failed") {
		t.Errorf("not logged:\n%s", g.logs)
	}
}

// NOT_SUPPORTED from every process list is "cannot tell", an error, not
// "no processes"; one list that answers is enough.
func TestRealProcessesUnknown(t *testing.T) {
	f := newFakeNVML("h200")
	d := f.gpus[0].dev
	none := func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	d.GetComputeRunningProcessesFunc, d.GetGraphicsRunningProcessesFunc, d.GetMPSComputeRunningProcessesFunc = none, none, none
	g := newTestReal(t, f)
	ps, err := g.Processes(0)
	if !errors.Is(err, ErrProcessesUnknown) {
		t.Fatalf("Processes = %v, %v; want ErrProcessesUnknown", ps, err)
	}
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	if ps, err := g.Processes(0); err != nil || len(ps) != 0 {
		t.Fatalf("one list answering: %v %v", ps, err)
	}
}
