package nvmlsim_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/profiles"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

var (
	gpuUUIDPattern = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	migUUIDPattern = regexp.MustCompile(`^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// wantNVML fails unless err is an *Error with NVML return ret.
func wantNVML(t *testing.T, err error, ret string) {
	t.Helper()
	var e *nvmlx.Error
	if !errors.As(err, &e) || e.Return != ret {
		t.Fatalf("error %v, want NVML %s", err, ret)
	}
	if !errors.Is(err, &nvmlx.Error{Return: ret}) {
		t.Fatalf("errors.Is(%v, %s) is false", err, ret)
	}
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// enabled returns a simulator with MIG on (current) on every MIG GPU.
func enabled(t *testing.T, spec string, o nvmlsim.Options) *nvmlx.Sim {
	t.Helper()
	s := testsupport.NewSim(t, spec, o)
	devs, _ := s.Devices()
	for _, d := range devs {
		if !d.MigCapable {
			continue
		}
		if _, err := s.SetMigMode(d.Index, true); err != nil {
			t.Fatal(err)
		}
		if d.Architecture == profiles.ArchAmpere {
			if err := s.ResetGPU(d.Index); err != nil {
				t.Fatal(err)
			}
		}
	}
	return s
}

func profileID(t *testing.T, s *nvmlx.Sim, gpu int, name string) int {
	t.Helper()
	devs, _ := s.Devices()
	n, err := profiles.Parse(name)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := devs[gpu].Catalogue.ByName(n)
	if !ok {
		t.Fatalf("GPU %d has no %s", gpu, name)
	}
	return p.ID
}

func TestParseSpec(t *testing.T) {
	good := []struct {
		spec string
		want []string
	}{
		{"h200x8", slices.Repeat([]string{"h200"}, 8)},
		{"a100-40gbx2,h100-80gbx1", []string{"a100-40gb", "a100-40gb", "h100-80gb"}},
		{" sim:a30x1 , l40sx1", []string{"a30", "l40s"}},
		{"a100-80gbx1,b200x1", []string{"a100-80gb", "b200"}},
	}
	for _, tc := range good {
		ms, err := nvmlsim.ParseSpec(tc.spec)
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		var got []string
		for _, m := range ms {
			got = append(got, m.Key)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: %v, want %v", tc.spec, got, tc.want)
		}
	}
	for _, spec := range []string{"", "sim:", "h200", "h200x0", "h200x-1", "h200xx", "x2", "h200x2,", "h100x2",
		"H200x2", "h200x8;a30x1", "h200x65", "h200x1.5"} {
		_, err := nvmlsim.ParseSpec(spec)
		if !errors.Is(err, nvmlsim.ErrBadSpec) {
			t.Errorf("%q: error %v, want ErrBadSpec", spec, err)
			continue
		}
		if !strings.Contains(err.Error(), "a100-40gb, a100-80gb, a30, b200, gb200, gh200, gh200-144gb, h100-80gb, h200, l40s") {
			t.Errorf("%q: error does not list the models: %v", spec, err)
		}
	}
	if _, err := nvmlx.NewSim("nopex2", nvmlsim.Options{}); !errors.Is(err, nvmlsim.ErrBadSpec) || !strings.Contains(err.Error(), `unknown model "nope"`) {
		t.Errorf("NewSim(nope): %v", err)
	}
}

func TestParseFaults(t *testing.T) {
	plan, err := nvmlsim.ParseFaults("CreateGpuInstance:2=ERROR_INSUFFICIENT_RESOURCES, SetMigMode:1=ERROR_IN_USE,ResetGpu:3=ERROR_RESET_REQUIRED,GpuInstance.Destroy:1=ERROR_GPU_IS_LOST,ComputeInstance.Destroy:4=ERROR_TIMEOUT,CreateComputeInstance:1=ERROR_UNKNOWN,CreateGpuInstanceWithPlacement:1=ERROR_NOT_SUPPORTED")
	if err != nil {
		t.Fatal(err)
	}
	if plan[nvmlsim.OpCreateGpuInstance][2] != "ERROR_INSUFFICIENT_RESOURCES" || plan[nvmlsim.OpSetMigMode][1] != "ERROR_IN_USE" ||
		plan[nvmlsim.OpResetGpu][3] != "ERROR_RESET_REQUIRED" || plan[nvmlsim.OpComputeInstanceDestroy][4] != "ERROR_TIMEOUT" || len(plan) != 7 {
		t.Errorf("plan %v", plan)
	}
	if plan, err := nvmlsim.ParseFaults(""); err != nil || len(plan) != 0 {
		t.Errorf("empty: %v %v", plan, err)
	}
	for _, spec := range []string{"SetMigMode", "SetMigMode:1", "SetMigMode=ERROR_IN_USE", "SetMigMode:0=ERROR_IN_USE",
		"SetMigMode:x=ERROR_IN_USE", "Destroy:1=ERROR_IN_USE", "SetMigMode:1=IN_USE", "SetMigMode:1=SUCCESS",
		"SetMigMode:1=ERROR_IN_USE,SetMigMode:1=ERROR_UNKNOWN", "SetMigMode:1=ERROR_IN_USE,", "setmigmode:1=ERROR_IN_USE"} {
		if _, err := nvmlsim.ParseFaults(spec); !errors.Is(err, nvmlsim.ErrBadFaults) {
			t.Errorf("%q: error %v, want ErrBadFaults", spec, err)
		}
	}
	if _, err := nvmlx.NewSim("h200x1", nvmlsim.Options{Faults: "Bogus:1=ERROR_IN_USE"}); !errors.Is(err, nvmlsim.ErrBadFaults) ||
		!strings.Contains(err.Error(), "GpuInstance.Destroy") {
		t.Errorf("NewSim with bad faults: %v", err)
	}
}

func TestSimDevices(t *testing.T) {
	s := testsupport.NewSim(t, "a100-40gbx1,h200x2,l40sx1", nvmlsim.Options{})
	devs := must[[]nvmlx.Device](t)(s.Devices())
	if len(devs) != 4 {
		t.Fatalf("%d devices", len(devs))
	}
	want := []struct {
		name, pci, arch string
		mib             uint64
		mig             bool
	}{
		{"NVIDIA A100-SXM4-40GB", "0x20B010DE", "ampere", 40960, true},
		{"NVIDIA H200", "0x233510DE", "hopper", 143771, true},
		{"NVIDIA H200", "0x233510DE", "hopper", 143771, true},
		{"NVIDIA L40S", "0x26B910DE", "ada", 46068, false},
	}
	uuids, buses := map[string]bool{}, map[string]bool{}
	for i, d := range devs {
		w := want[i]
		if d.Index != i || d.Name != w.name || d.PCIDeviceIDString() != w.pci || d.Architecture != w.arch ||
			d.MemoryMiB != w.mib || d.MigCapable != w.mig || d.MigMode != (nvmlx.MigMode{}) {
			t.Errorf("GPU %d: %+v", i, d)
		}
		if !gpuUUIDPattern.MatchString(d.UUID) || uuids[d.UUID] || buses[d.PCIBusID] ||
			!regexp.MustCompile(`^00000000:[0-9A-F]{2}:00\.0$`).MatchString(d.PCIBusID) {
			t.Errorf("GPU %d: UUID %q bus %q not well formed or not distinct", i, d.UUID, d.PCIBusID)
		}
		uuids[d.UUID], buses[d.PCIBusID] = true, true
		m, _ := profiles.ModelByPCIID(d.PCIDeviceID)
		if len(d.Catalogue.Profiles) != len(m.Catalogue.Profiles) || d.Catalogue.MemorySlices != m.Catalogue.MemorySlices {
			t.Errorf("GPU %d: catalogue differs from the model's", i)
		}
		if gis := must[[]nvmlx.GPUInstance](t)(s.Instances(i)); len(gis) != 0 {
			t.Errorf("GPU %d: instances at start: %v", i, gis)
		}
	}
	// The catalogue is a copy: changing it does not change the simulator.
	devs[0].Catalogue.Profiles[0].MaxCount = 99
	if again := must[[]nvmlx.Device](t)(s.Devices()); again[0].Catalogue.Profiles[0].MaxCount == 99 {
		t.Error("Devices shares the model table")
	}
	if v, _ := s.DriverVersion(); v != nvmlsim.DriverVersion {
		t.Errorf("driver %q", v)
	}
	if _, err := s.Instances(4); err == nil {
		t.Error("Instances(4) on 4 GPUs worked")
	}
	wantNVML(t, s.ResetGPU(9), "ERROR_INVALID_ARGUMENT")
}

func TestSimEnforces(t *testing.T) {
	type step struct {
		name string
		do   func(t *testing.T, s *nvmlx.Sim) error
		ret  string // "" = success
	}
	gi := func(gpu int, profile string, start, size int) func(t *testing.T, s *nvmlx.Sim) error {
		return func(t *testing.T, s *nvmlx.Sim) error {
			_, err := s.CreateGPUInstance(gpu, profileID(t, s, gpu, profile), profiles.Placement{Start: start, Size: size})
			return err
		}
	}
	ci := func(gpu, giID, ciProfile int) func(t *testing.T, s *nvmlx.Sim) error {
		return func(t *testing.T, s *nvmlx.Sim) error {
			_, err := s.CreateComputeInstance(gpu, giID, ciProfile)
			return err
		}
	}
	tests := []struct {
		name    string
		spec    string
		enabled bool
		steps   []step
	}{
		{"GI needs MIG mode", "h200x1", false, []step{
			{"1g", gi(0, "1g.18gb", 0, 1), "ERROR_NOT_SUPPORTED"},
			{"raw id", func(t *testing.T, s *nvmlx.Sim) error {
				_, err := s.CreateGPUInstance(0, 19, profiles.Placement{Start: 0, Size: 1})
				return err
			}, "ERROR_NOT_SUPPORTED"},
		}},
		{"no MIG on L40S", "l40sx1", false, []step{
			{"mode", func(t *testing.T, s *nvmlx.Sim) error { _, err := s.SetMigMode(0, true); return err }, "ERROR_NOT_SUPPORTED"},
			{"gi", func(t *testing.T, s *nvmlx.Sim) error {
				_, err := s.CreateGPUInstance(0, 0, profiles.Placement{Start: 0, Size: 8})
				return err
			}, "ERROR_NOT_SUPPORTED"},
		}},
		{"profiles and placements", "h200x1", true, []step{
			{"unknown id", func(t *testing.T, s *nvmlx.Sim) error {
				_, err := s.CreateGPUInstance(0, 21, profiles.Placement{Start: 0, Size: 1})
				return err
			}, "ERROR_NOT_FOUND"}, // the backend's own check: NVML lists no such profile
			{"1g at 7", gi(0, "1g.18gb", 7, 1), "ERROR_INVALID_ARGUMENT"},
			{"2g at 1", gi(0, "2g.35gb", 1, 2), "ERROR_INVALID_ARGUMENT"},
			{"3g wrong size", gi(0, "3g.71gb", 0, 3), "ERROR_INVALID_ARGUMENT"},
			{"GPU out of range", func(t *testing.T, s *nvmlx.Sim) error {
				_, err := s.CreateGPUInstance(1, 19, profiles.Placement{Start: 0, Size: 1})
				return err
			}, "ERROR_INVALID_ARGUMENT"},
		}},
		{"4g+3g fits, nothing more", "h200x1", true, []step{
			{"4g", gi(0, "4g.71gb", 0, 4), ""},
			{"3g at 0 overlaps", gi(0, "3g.71gb", 0, 4), "ERROR_INSUFFICIENT_RESOURCES"},
			{"3g at 4", gi(0, "3g.71gb", 4, 4), ""},
			{"1g at 3 overlaps", gi(0, "1g.18gb", 3, 1), "ERROR_INSUFFICIENT_RESOURCES"},
		}},
		{"max counts", "h200x1", true, []step{
			{"1g+me", gi(0, "1g.18gb+me", 0, 1), ""},
			{"second 1g+me", gi(0, "1g.18gb+me", 1, 1), "ERROR_INSUFFICIENT_RESOURCES"},
			{"3g", gi(0, "3g.71gb", 4, 4), ""},
			{"4g (max 1) overlaps anyway", gi(0, "4g.71gb", 0, 4), "ERROR_INSUFFICIENT_RESOURCES"},
		}},
		{"4x 1g.35gb then 1g.18gb", "h200x1", true, []step{
			{"0", gi(0, "1g.35gb", 0, 2), ""}, {"2", gi(0, "1g.35gb", 2, 2), ""},
			{"4", gi(0, "1g.35gb", 4, 2), ""}, {"6", gi(0, "1g.35gb", 6, 2), ""},
			{"1g.18gb", gi(0, "1g.18gb", 6, 1), "ERROR_INSUFFICIENT_RESOURCES"},
		}},
		{"2g x3 + 1g at 6", "a100-40gbx1", true, []step{
			{"0", gi(0, "2g.10gb", 0, 2), ""}, {"2", gi(0, "2g.10gb", 2, 2), ""}, {"4", gi(0, "2g.10gb", 4, 2), ""},
			{"1g", gi(0, "1g.5gb", 6, 1), ""},
			{"another 2g", gi(0, "2g.10gb", 4, 2), "ERROR_INSUFFICIENT_RESOURCES"},
		}},
		{"A30 media engines are one", "a30x1", true, []step{
			{"1g+me", gi(0, "1g.6gb+me", 0, 1), ""},
			{"2g+me", gi(0, "2g.12gb+me", 2, 2), "ERROR_INSUFFICIENT_RESOURCES"},
			{"2g", gi(0, "2g.12gb", 2, 2), ""},
			{"1g", gi(0, "1g.6gb", 1, 1), ""},
		}},
		{"compute capacity", "h200x1", true, []step{
			{"3g", gi(0, "3g.71gb", 0, 4), ""}, // GI 1
			{"2c", ci(0, 1, 1), ""},
			{"second 2c", ci(0, 1, 1), "ERROR_INSUFFICIENT_RESOURCES"},
			{"1c", ci(0, 1, 0), ""},
			{"1c over slices", ci(0, 1, 0), "ERROR_INSUFFICIENT_RESOURCES"},
			{"4c not offered in 3g", ci(0, 1, 3), "ERROR_NOT_FOUND"}, // NVML offers no such compute profile
			{"unknown GI", ci(0, 7, 0), "ERROR_NOT_FOUND"},
			{"4g", gi(0, "4g.71gb", 0, 4), "ERROR_INSUFFICIENT_RESOURCES"},
			{"1g at 4", gi(0, "1g.18gb", 4, 1), ""}, // GI 11: 7 + placement
			{"full 1g", ci(0, 11, 0), ""},
			{"second in 1g", ci(0, 11, 0), "ERROR_INSUFFICIENT_RESOURCES"},
		}},
		{"full CI leaves no room", "a100-80gbx1", true, []step{
			{"7g", gi(0, "7g.80gb", 0, 8), ""}, // GI 0: the whole GPU
			{"7c", ci(0, 0, 4), ""},
			{"1c", ci(0, 0, 0), "ERROR_INSUFFICIENT_RESOURCES"},
		}},
		{"destroy order and processes", "h200x1", true, []step{
			{"3g", gi(0, "3g.71gb", 0, 4), ""},
			{"1c a", ci(0, 1, 0), ""}, // CI 0
			{"1c b", ci(0, 1, 0), ""}, // CI 1
			{"GI with CIs", func(t *testing.T, s *nvmlx.Sim) error { return s.DestroyGPUInstance(0, 1) }, "ERROR_IN_USE"},
			{"process on CI 1", func(t *testing.T, s *nvmlx.Sim) error {
				return s.AddProcess(0, nvmlx.Process{PID: 42, GIID: 1, CIID: 1, Name: "python"})
			}, ""},
			{"CI with process", func(t *testing.T, s *nvmlx.Sim) error { return s.DestroyComputeInstance(0, 1, 1) }, "ERROR_IN_USE"},
			{"CI without", func(t *testing.T, s *nvmlx.Sim) error { return s.DestroyComputeInstance(0, 1, 0) }, ""},
			{"CI gone", func(t *testing.T, s *nvmlx.Sim) error { return s.DestroyComputeInstance(0, 1, 0) }, "ERROR_NOT_FOUND"},
			{"GI gone", func(t *testing.T, s *nvmlx.Sim) error { return s.DestroyGPUInstance(0, 5) }, "ERROR_NOT_FOUND"},
			{"disable with instances", func(t *testing.T, s *nvmlx.Sim) error { _, err := s.SetMigMode(0, false); return err }, "ERROR_IN_USE"},
			{"process exits", func(t *testing.T, s *nvmlx.Sim) error { return s.RemoveProcess(0, 42) }, ""},
			{"CI", func(t *testing.T, s *nvmlx.Sim) error { return s.DestroyComputeInstance(0, 1, 1) }, ""},
			{"GI", func(t *testing.T, s *nvmlx.Sim) error { return s.DestroyGPUInstance(0, 1) }, ""},
			{"disable", func(t *testing.T, s *nvmlx.Sim) error { _, err := s.SetMigMode(0, false); return err }, ""},
		}},
		{"process on GI blocks GI destroy", "h200x1", true, []step{
			{"1g", gi(0, "1g.18gb", 0, 1), ""}, // GI 7
			{"ci", ci(0, 7, 0), ""},
			{"proc", func(t *testing.T, s *nvmlx.Sim) error {
				return s.AddProcess(0, nvmlx.Process{PID: 7, GIID: 7, CIID: 0})
			}, ""},
			{"GI", func(t *testing.T, s *nvmlx.Sim) error { return s.DestroyGPUInstance(0, 7) }, "ERROR_IN_USE"},
			{"reset", func(t *testing.T, s *nvmlx.Sim) error { return s.ResetGPU(0) }, "ERROR_IN_USE"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s *nvmlx.Sim
			if tc.enabled {
				s = enabled(t, tc.spec, nvmlsim.Options{})
			} else {
				s = testsupport.NewSim(t, tc.spec, nvmlsim.Options{})
			}
			for _, st := range tc.steps {
				before := must[[]nvmlx.GPUInstance](t)(s.Instances(0))
				err := st.do(t, s)
				if st.ret == "" {
					if err != nil {
						t.Fatalf("%s: %v", st.name, err)
					}
					continue
				}
				wantNVML(t, err, st.ret)
				if after := must[[]nvmlx.GPUInstance](t)(s.Instances(0)); !equalJSON(before, after) {
					t.Fatalf("%s failed but changed the instances: %v → %v", st.name, before, after)
				}
			}
		})
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func TestSimIDsAndUUIDs(t *testing.T) {
	s := enabled(t, "h200x2", nvmlsim.Options{})
	at := func(i int) profiles.Placement { return profiles.Placement{Start: i, Size: 1} }
	var ids []int
	for i := range 3 {
		ids = append(ids, must[int](t)(s.CreateGPUInstance(0, 19, at(i))))
	}
	// GI ids by placement: 1g at p is 7+p (dra-driver issue 933, H100).
	if !slices.Equal(ids, []int{7, 8, 9}) {
		t.Errorf("GI ids %v", ids)
	}
	must[struct{}](t)(struct{}{}, s.DestroyGPUInstance(0, 8))
	if id := must[int](t)(s.CreateGPUInstance(0, 19, at(5))); id != 12 {
		t.Errorf("GI id of 1g at 5: %d, want 12", id)
	}
	// A 3g elsewhere gets compute instances 0, 1, 2.
	g3 := must[int](t)(s.CreateGPUInstance(1, 9, profiles.Placement{Start: 4, Size: 4}))
	var cis []nvmlx.ComputeInstance
	for range 3 {
		cis = append(cis, must[nvmlx.ComputeInstance](t)(s.CreateComputeInstance(1, g3, 0)))
	}
	seen := map[string]bool{}
	for i, c := range cis {
		if c.ID != i || c.Profile != "1c.3g.71gb" || !migUUIDPattern.MatchString(c.UUID) || seen[c.UUID] {
			t.Errorf("compute instance %d: %+v", i, c)
		}
		seen[c.UUID] = true
	}
	gis := must[[]nvmlx.GPUInstance](t)(s.Instances(1))
	if len(gis) != 1 || gis[0].Profile != "3g.71gb" || gis[0].Placement != (profiles.Placement{Start: 4, Size: 4}) ||
		len(gis[0].ComputeInstances) != 3 || gis[0].ComputeInstances[2].UUID != cis[2].UUID {
		t.Errorf("Instances(1) = %+v", gis)
	}

	// The same instance recreated has the same MIG UUID; another place,
	// another GPU or another compute profile has another.
	full := func(s *nvmlx.Sim, gpu, start int) string {
		gi := must[int](t)(s.CreateGPUInstance(gpu, 19, at(start)))
		return must[nvmlx.ComputeInstance](t)(s.CreateComputeInstance(gpu, gi, 0)).UUID
	}
	first := full(s, 0, 6)
	gis = must[[]nvmlx.GPUInstance](t)(s.Instances(0))
	last := gis[len(gis)-1]
	must[struct{}](t)(struct{}{}, s.DestroyComputeInstance(0, last.ID, 0))
	must[struct{}](t)(struct{}{}, s.DestroyGPUInstance(0, last.ID))
	if again := full(s, 0, 6); again != first {
		t.Errorf("recreated 1g at 6: UUID %s, was %s", again, first)
	}
	if other := full(s, 0, 3); other == first {
		t.Error("1g at 3 has the UUID of 1g at 6")
	}
	if other := full(s, 1, 0); other == first || seen[other] {
		t.Error("GPU 1's UUID repeats GPU 0's")
	}

	// GPU UUIDs depend on position and model only.
	a := must[[]nvmlx.Device](t)(testsupport.NewSim(t, "h200x2", nvmlsim.Options{}).Devices())
	b := must[[]nvmlx.Device](t)(testsupport.NewSim(t, "h200x2,a30x1", nvmlsim.Options{}).Devices())
	c := must[[]nvmlx.Device](t)(testsupport.NewSim(t, "a30x1,h200x1", nvmlsim.Options{}).Devices())
	if a[0].UUID != b[0].UUID || a[1].UUID != b[1].UUID || a[0].UUID == a[1].UUID || c[0].UUID == a[0].UUID || c[1].UUID != a[1].UUID {
		t.Errorf("GPU UUIDs: %s %s / %s %s / %s %s", a[0].UUID, a[1].UUID, b[0].UUID, b[1].UUID, c[0].UUID, c[1].UUID)
	}
}

func TestSimAmperePendingUntilReset(t *testing.T) {
	s := testsupport.NewSim(t, "a100-40gbx1,a30x1", nvmlsim.Options{})
	for gpu := range 2 {
		mode := must[nvmlx.MigMode](t)(s.SetMigMode(gpu, true))
		if mode != (nvmlx.MigMode{Current: false, Pending: true}) {
			t.Fatalf("GPU %d after enable: %+v", gpu, mode)
		}
		_, err := s.CreateGPUInstance(gpu, 0, profiles.Placement{Start: 0, Size: must[[]nvmlx.Device](t)(s.Devices())[gpu].Catalogue.MemorySlices})
		wantNVML(t, err, "ERROR_NOT_SUPPORTED")
		if ok, why := s.CanReset(gpu); !ok || why != "" {
			t.Fatalf("CanReset: %v %q", ok, why)
		}
		must[struct{}](t)(struct{}{}, s.AddProcess(gpu, nvmlx.Process{PID: 100, GIID: -1}))
		wantNVML(t, s.ResetGPU(gpu), "ERROR_IN_USE")
		must[struct{}](t)(struct{}{}, s.RemoveProcess(gpu, 100))
		must[struct{}](t)(struct{}{}, s.ResetGPU(gpu))
		devs := must[[]nvmlx.Device](t)(s.Devices())
		if devs[gpu].MigMode != (nvmlx.MigMode{Current: true, Pending: true}) {
			t.Fatalf("GPU %d after reset: %+v", gpu, devs[gpu].MigMode)
		}
	}
	// A30 4g.24gb is id 0 at {0}:4.
	gi := must[int](t)(s.CreateGPUInstance(1, 0, profiles.Placement{Start: 0, Size: 4}))
	must[nvmlx.ComputeInstance](t)(s.CreateComputeInstance(1, gi, 3))
	// Disabling: refused while instances exist, then pending until reset,
	// which drops nothing else.
	_, err := s.SetMigMode(1, false)
	wantNVML(t, err, "ERROR_IN_USE")
	must[struct{}](t)(struct{}{}, s.DestroyComputeInstance(1, gi, 0))
	must[struct{}](t)(struct{}{}, s.DestroyGPUInstance(1, gi))
	if mode := must[nvmlx.MigMode](t)(s.SetMigMode(1, false)); mode != (nvmlx.MigMode{Current: true, Pending: false}) {
		t.Fatalf("after disable: %+v", mode)
	}
	must[struct{}](t)(struct{}{}, s.ResetGPU(1))
	if devs := must[[]nvmlx.Device](t)(s.Devices()); devs[1].MigMode != (nvmlx.MigMode{}) || devs[0].MigMode != (nvmlx.MigMode{Current: true, Pending: true}) {
		t.Fatalf("after reset: %+v %+v", devs[0].MigMode, devs[1].MigMode)
	}
	if m := s.Mutations(); m[nvmlsim.OpSetMigMode] != 3 || m[nvmlsim.OpResetGpu] != 3 || m[nvmlsim.OpCreateGpuInstanceWithPlacement] != 1 ||
		m[nvmlsim.OpCreateComputeInstance] != 1 || m[nvmlsim.OpComputeInstanceDestroy] != 1 || m[nvmlsim.OpGpuInstanceDestroy] != 1 {
		t.Errorf("Mutations %v", m)
	}
}

func TestSimHopperImmediate(t *testing.T) {
	for _, spec := range []string{"h200x1", "h100-80gbx1", "b200x1", "gh200x1", "gh200-144gbx1", "gb200x1"} {
		t.Run(spec, func(t *testing.T) {
			s := testsupport.NewSim(t, spec, nvmlsim.Options{NoReset: true})
			if mode := must[nvmlx.MigMode](t)(s.SetMigMode(0, true)); mode != (nvmlx.MigMode{Current: true, Pending: true}) {
				t.Fatalf("enable: %+v", mode)
			}
			if gi := must[int](t)(s.CreateGPUInstance(0, 0, profiles.Placement{Start: 0, Size: 8})); gi != 0 {
				t.Errorf("7g is GI %d, want 0", gi)
			}
			must[struct{}](t)(struct{}{}, s.DestroyGPUInstance(0, 0))
			// Busy GPU: the unbind fails (activation IN_USE) and the change
			// stays pending for a reset or reboot.
			must[struct{}](t)(struct{}{}, s.AddProcess(0, nvmlx.Process{PID: 9, GIID: -1}))
			mode, err := s.SetMigMode(0, false)
			if err != nil || mode != (nvmlx.MigMode{Current: true, Pending: false}) {
				t.Fatalf("busy disable: %+v %v", mode, err)
			}
			must[struct{}](t)(struct{}{}, s.RemoveProcess(0, 9))
			if mode := must[nvmlx.MigMode](t)(s.SetMigMode(0, false)); mode != (nvmlx.MigMode{}) {
				t.Fatalf("idle disable: %+v", mode)
			}
			if s.Mutations()[nvmlsim.OpSetMigMode] != 3 {
				t.Errorf("Mutations %v", s.Mutations())
			}
		})
	}
}

func TestSimNoReset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	s := testsupport.NewSim(t, "a100-80gbx2", nvmlsim.Options{StatePath: path, NoReset: true})
	ok, why := s.CanReset(0)
	if ok || !strings.Contains(why, "no PCI reset") {
		t.Errorf("CanReset: %v %q", ok, why)
	}
	mode, err := s.SetMigMode(0, true)
	if err != nil || mode != (nvmlx.MigMode{Current: false, Pending: true}) {
		t.Fatalf("SetMigMode: %+v %v", mode, err)
	}
	wantNVML(t, s.ResetGPU(0), "ERROR_NOT_SUPPORTED")
	if err := nvmlsim.Reboot(path); err != nil {
		t.Fatal(err)
	}
	s2 := testsupport.NewSim(t, "a100-80gbx2", nvmlsim.Options{StatePath: path, NoReset: true})
	devs := must[[]nvmlx.Device](t)(s2.Devices())
	if devs[0].MigMode != (nvmlx.MigMode{Current: true, Pending: true}) || devs[1].MigMode != (nvmlx.MigMode{}) || s2.BootCount() != 1 {
		t.Errorf("after reboot: %+v %+v boot %d", devs[0].MigMode, devs[1].MigMode, s2.BootCount())
	}
}

func TestSimStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "state.json")
	s := enabled(t, "h200x1,a30x1,l40sx1", nvmlsim.Options{StatePath: path})
	gi := must[int](t)(s.CreateGPUInstance(0, 9, profiles.Placement{Start: 4, Size: 4}))
	c := must[nvmlx.ComputeInstance](t)(s.CreateComputeInstance(0, gi, 1))
	must[struct{}](t)(struct{}{}, s.AddProcess(0, nvmlx.Process{PID: 5, GIID: gi, CIID: c.ID, Name: "train"}))
	must[nvmlx.MigMode](t)(s.SetMigMode(1, false)) // A30: pending disable
	wantDevs := must[[]nvmlx.Device](t)(s.Devices())
	wantGIs := must[[]nvmlx.GPUInstance](t)(s.Instances(0))

	// Another process (a new NewSim) sees the same hardware.
	s2 := testsupport.NewSim(t, "h200x1,a30x1,l40sx1", nvmlsim.Options{StatePath: path})
	if got := must[[]nvmlx.Device](t)(s2.Devices()); !equalJSON(got, wantDevs) || got[1].MigMode != (nvmlx.MigMode{Current: true, Pending: false}) {
		t.Errorf("devices after restart: %+v", got)
	}
	if got := must[[]nvmlx.GPUInstance](t)(s2.Instances(0)); !equalJSON(got, wantGIs) || got[0].ComputeInstances[0].UUID != c.UUID {
		t.Errorf("instances after restart: %+v, want %+v", got, wantGIs)
	}
	if ps := must[[]nvmlx.Process](t)(s2.Processes(0)); len(ps) != 1 || ps[0].PID != 5 || ps[0].GIID != gi {
		t.Errorf("processes after restart: %+v", ps)
	}
	// In-memory sims start fresh.
	if gis := must[[]nvmlx.GPUInstance](t)(testsupport.NewSim(t, "h200x1,a30x1,l40sx1", nvmlsim.Options{}).Instances(0)); len(gis) != 0 {
		t.Errorf("in-memory sim sees %v", gis)
	}
	// No temporary files are left behind: the state and its NVML session
	// counts.
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 2 || entries[0].Name() != filepath.Base(path) ||
		entries[1].Name() != filepath.Base(nvmlsim.SessionsPath(path)) {
		t.Errorf("state dir holds %v", entries)
	}

	bad := []struct {
		name, spec, content string
	}{
		{"other GPUs", "h200x2", ""},
		{"other order", "a30x1,h200x1,l40sx1", ""},
		{"not JSON", "h200x1", "{"},
		{"unknown field", "h200x1", `{"version":1,"gpus":[],"extra":1}`},
		{"wrong version", "h200x1", `{"version":2,"gpus":[{"model":"h200","uuid":"GPU-1","pciBusId":"x"}]}`},
		{"unknown model", "h200x1", `{"version":1,"gpus":[{"model":"h300","uuid":"GPU-1","pciBusId":"x"}]}`},
		{"instance with MIG off", "h200x1", `{"version":1,"gpus":[{"model":"h200","uuid":"GPU-1","pciBusId":"x","gpuInstances":[{"id":1,"profileId":19,"placement":{"start":0,"size":1}}]}]}`},
		{"overlap", "h200x1", `{"version":1,"gpus":[{"model":"h200","uuid":"GPU-1","pciBusId":"x","migCurrent":true,"gpuInstances":[{"id":1,"profileId":19,"placement":{"start":0,"size":1}},{"id":2,"profileId":0,"placement":{"start":0,"size":8}}]}]}`},
	}
	for _, tc := range bad {
		p := path
		if tc.content != "" {
			p = filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".json")
			if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		_, err := nvmlx.NewSim(tc.spec, nvmlsim.Options{StatePath: p})
		if !errors.Is(err, nvmlsim.ErrState) {
			t.Errorf("%s: error %v, want ErrState", tc.name, err)
		}
		if tc.name == "other GPUs" && (err == nil || !strings.Contains(err.Error(), "holds GPUs h200x1,a30x1,l40sx1, the spec asks for h200x2")) {
			t.Errorf("mismatch message: %v", err)
		}
	}
}

func TestSimStateFileFixture(t *testing.T) {
	// testdata/state-v1.json is a version-1 state file as written by the
	// simulator: the format others may read.
	raw, err := os.ReadFile(filepath.Join("testdata", "state-v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	s := testsupport.NewSim(t, "h200x1,a100-40gbx1", nvmlsim.Options{StatePath: path})
	devs := must[[]nvmlx.Device](t)(s.Devices())
	if devs[0].MigMode != (nvmlx.MigMode{Current: true, Pending: true}) || devs[1].MigMode != (nvmlx.MigMode{Current: false, Pending: true}) {
		t.Errorf("modes %+v %+v", devs[0].MigMode, devs[1].MigMode)
	}
	gis := must[[]nvmlx.GPUInstance](t)(s.Instances(0))
	if len(gis) != 2 || gis[0].Profile != "4g.71gb" || gis[1].Profile != "3g.71gb" || gis[1].ComputeInstances[0].Profile != "3g.71gb" {
		t.Errorf("instances %+v", gis)
	}
	// What the simulator writes for the same hardware is the fixture (the
	// NVML session counts live beside it).
	must[struct{}](t)(struct{}{}, s.AddProcess(0, nvmlx.Process{PID: 1, GIID: -1}))
	must[struct{}](t)(struct{}{}, s.RemoveProcess(0, 1))
	written, _ := os.ReadFile(path)
	if string(written) != string(raw) {
		t.Errorf("rewritten state differs from the fixture:\n%s", written)
	}
}

func TestSimAtomicWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	s := enabled(t, "h200x8", nvmlsim.Options{StatePath: path})
	done := make(chan struct{})
	var wg sync.WaitGroup
	var reads, bad int
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			raw, err := os.ReadFile(path)
			reads++
			var st nvmlsim.State
			if err != nil || json.Unmarshal(raw, &st) != nil || len(st.GPUs) != 8 {
				bad++
			}
		}
	})
	for range 8 {
		for gpu := range 8 {
			id := must[int](t)(s.CreateGPUInstance(gpu, 0, profiles.Placement{Start: 0, Size: 8}))
			must[nvmlx.ComputeInstance](t)(s.CreateComputeInstance(gpu, id, 4))
			must[struct{}](t)(struct{}{}, s.DestroyComputeInstance(gpu, id, 0))
			must[struct{}](t)(struct{}{}, s.DestroyGPUInstance(gpu, id))
		}
	}
	close(done)
	wg.Wait()
	if bad != 0 || reads == 0 {
		t.Errorf("%d of %d concurrent reads did not parse", bad, reads)
	}
	if n := s.Mutations()[nvmlsim.OpCreateGpuInstanceWithPlacement]; n != 64 {
		t.Errorf("creates %d", n)
	}
}

func TestSimFaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	s := testsupport.NewSim(t, "h200x2", nvmlsim.Options{StatePath: path,
		Faults: "SetMigMode:1=ERROR_IN_USE,CreateGpuInstance:2=ERROR_INSUFFICIENT_RESOURCES,CreateComputeInstance:2=ERROR_UNKNOWN,GpuInstance.Destroy:1=ERROR_GPU_IS_LOST,ComputeInstance.Destroy:2=ERROR_TIMEOUT,ResetGpu:1=ERROR_RESET_REQUIRED"})
	// SetMigMode #1 fails and changes nothing; #2 works.
	mode, err := s.SetMigMode(0, true)
	wantNVML(t, err, "ERROR_IN_USE")
	var e *nvmlx.Error
	if errors.As(err, &e); e.Op != nvmlsim.OpSetMigMode || e.GPU != 0 || mode != (nvmlx.MigMode{}) {
		t.Errorf("fault %+v mode %+v", e, mode)
	}
	must[nvmlx.MigMode](t)(s.SetMigMode(0, true))
	must[nvmlx.MigMode](t)(s.SetMigMode(1, true))

	// CreateGpuInstance #2 fails (as ...WithPlacement too), #1 and #3 work.
	at := func(i int) profiles.Placement { return profiles.Placement{Start: i, Size: 1} }
	g1 := must[int](t)(s.CreateGPUInstance(0, 19, at(0)))
	before, _ := os.ReadFile(path)
	_, err = s.CreateGPUInstance(0, 19, at(1))
	wantNVML(t, err, "ERROR_INSUFFICIENT_RESOURCES")
	if errors.As(err, &e); e.Op != nvmlsim.OpCreateGpuInstanceWithPlacement {
		t.Errorf("fault op %q", e.Op)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("failed create changed the state file")
	}
	if gis := must[[]nvmlx.GPUInstance](t)(s.Instances(0)); len(gis) != 1 {
		t.Errorf("instances after fault: %v", gis)
	}
	g2 := must[int](t)(s.CreateGPUInstance(0, 19, at(1)))

	// Faults count NVML calls: a call the backend refuses before NVML
	// (no such GI) does not count; #2 is the injected fault although valid.
	_, err = s.CreateComputeInstance(0, 99, 0)
	wantNVML(t, err, "ERROR_NOT_FOUND")
	must[nvmlx.ComputeInstance](t)(s.CreateComputeInstance(0, g1, 0))
	_, err = s.CreateComputeInstance(0, g2, 0)
	wantNVML(t, err, "ERROR_UNKNOWN")
	must[nvmlx.ComputeInstance](t)(s.CreateComputeInstance(0, g2, 0))

	wantNVML(t, s.DestroyGPUInstance(0, g2), "ERROR_GPU_IS_LOST") // fires before the IN_USE check
	must[struct{}](t)(struct{}{}, s.DestroyComputeInstance(0, g1, 0))
	wantNVML(t, s.DestroyComputeInstance(0, g2, 0), "ERROR_TIMEOUT")
	must[struct{}](t)(struct{}{}, s.DestroyComputeInstance(0, g2, 0))
	must[struct{}](t)(struct{}{}, s.DestroyGPUInstance(0, g2))
	// The reset is `nvidia-smi -r`: its injected failure is in its message.
	if err := s.ResetGPU(1); err == nil || !strings.Contains(err.Error(), "ERROR_RESET_REQUIRED") {
		t.Errorf("ResetGPU with a fault: %v", err)
	}
	must[struct{}](t)(struct{}{}, s.ResetGPU(1))

	want := map[string]int{nvmlsim.OpSetMigMode: 2, nvmlsim.OpCreateGpuInstanceWithPlacement: 2, nvmlsim.OpCreateComputeInstance: 2,
		nvmlsim.OpGpuInstanceDestroy: 1, nvmlsim.OpComputeInstanceDestroy: 2, nvmlsim.OpResetGpu: 1}
	if got := s.Mutations(); !equalJSON(got, want) {
		t.Errorf("Mutations %v, want %v", got, want)
	}
	// Counting is per process: a new simulator on the same state starts at 1.
	s2 := testsupport.NewSim(t, "h200x2", nvmlsim.Options{StatePath: path, Faults: "SetMigMode:1=ERROR_UNKNOWN"})
	_, err = s2.SetMigMode(0, false)
	wantNVML(t, err, "ERROR_UNKNOWN")
}

func TestReboot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	s := enabled(t, "h200x1,a100-40gbx1", nvmlsim.Options{StatePath: path})
	g := must[int](t)(s.CreateGPUInstance(0, 0, profiles.Placement{Start: 0, Size: 8}))
	c := must[nvmlx.ComputeInstance](t)(s.CreateComputeInstance(0, g, 4))
	must[struct{}](t)(struct{}{}, s.AddProcess(0, nvmlx.Process{PID: 3, GIID: g, CIID: c.ID}))
	g1 := must[int](t)(s.CreateGPUInstance(1, 19, profiles.Placement{Start: 0, Size: 1}))
	// GPU 1 (Ampere) cannot disable with instances; destroy, then disable (pending).
	must[struct{}](t)(struct{}{}, s.DestroyGPUInstance(1, g1))
	must[nvmlx.MigMode](t)(s.SetMigMode(1, false))
	if err := nvmlsim.Reboot(path); err != nil {
		t.Fatal(err)
	}
	s2 := testsupport.NewSim(t, "h200x1,a100-40gbx1", nvmlsim.Options{StatePath: path})
	devs := must[[]nvmlx.Device](t)(s2.Devices())
	if devs[0].MigMode != (nvmlx.MigMode{Current: true, Pending: true}) || devs[1].MigMode != (nvmlx.MigMode{}) {
		t.Errorf("modes after reboot: %+v %+v", devs[0].MigMode, devs[1].MigMode)
	}
	for gpu := range 2 {
		if gis := must[[]nvmlx.GPUInstance](t)(s2.Instances(gpu)); len(gis) != 0 {
			t.Errorf("GPU %d instances after reboot: %v", gpu, gis)
		}
		if ps := must[[]nvmlx.Process](t)(s2.Processes(gpu)); len(ps) != 0 {
			t.Errorf("GPU %d processes after reboot: %v", gpu, ps)
		}
	}
	if s2.BootCount() != 1 {
		t.Errorf("boot count %d", s2.BootCount())
	}
	if err := nvmlsim.Reboot(path); err != nil || testsupport.NewSim(t, "h200x1,a100-40gbx1", nvmlsim.Options{StatePath: path}).BootCount() != 2 {
		t.Errorf("second reboot: %v", err)
	}
	for _, p := range []string{"", filepath.Join(t.TempDir(), "missing.json")} {
		if err := nvmlsim.Reboot(p); !errors.Is(err, nvmlsim.ErrState) {
			t.Errorf("Reboot(%q): %v", p, err)
		}
	}
}
