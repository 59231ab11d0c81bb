package agent

import (
	"errors"
	"testing"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/nvmlx"
)

func newSim(t *testing.T, spec string, o nvmlx.SimOptions) *nvmlx.Sim {
	t.Helper()
	s, err := nvmlx.NewSim(spec, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func parseSpec(t *testing.T, y string) *ConfigFile {
	t.Helper()
	spec, err := geometry.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return &ConfigFile{Path: "test.yaml", SHA256: "x", Spec: spec}
}

// applyConfig plans config name on the sim and applies it.
func applyConfig(t *testing.T, g nvmlx.GPU, f *ConfigFile, name string, o ApplyOptions) (*Applied, error) {
	t.Helper()
	n, err := Discover(g)
	if err != nil {
		t.Fatal(err)
	}
	spec, _, err := Lookup(f, name, n.GPUs)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := geometry.BuildPlan(spec, name, n.GPUs)
	if err != nil {
		t.Fatal(err)
	}
	return ApplyAndVerify(g, n, plan, f, name, o)
}

func mutationsSince(before, after map[string]int) map[string]int {
	d := map[string]int{}
	for k, v := range after {
		if v-before[k] != 0 {
			d[k] = v - before[k]
		}
	}
	return d
}

// The planner's minimal diff is what reaches NVML: 7×1g → 2×1g+2g+3g costs
// 5 destroys and 2 creates; 7×1g → 4×1g+3g costs 3 and 1.
func TestApplyMinimalMutations(t *testing.T) {
	f := parseSpec(t, `version: v1
mig-configs:
  four-plus-three:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 4, "3g.71gb": 1}
`)
	for _, tc := range []struct {
		to                string
		destroys, creates int
	}{
		{"all-balanced", 5, 2},
		{"four-plus-three", 3, 1},
	} {
		t.Run(tc.to, func(t *testing.T) {
			s := newSim(t, "h200x1", nvmlx.SimOptions{})
			if _, err := applyConfig(t, s, f, "all-1g.18gb", ApplyOptions{}); err != nil {
				t.Fatal(err)
			}
			before := s.Mutations()
			res, err := applyConfig(t, s, f, tc.to, ApplyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			d := mutationsSince(before, s.Mutations())
			if d[nvmlx.OpGpuInstanceDestroy] != tc.destroys || d[nvmlx.OpCreateGpuInstanceWithPlacement] != tc.creates || d[nvmlx.OpSetMigMode] != 0 {
				t.Fatalf("mutations %v, want %d destroys and %d creates", d, tc.destroys, tc.creates)
			}
			if len(res.Changed) != 1 {
				t.Fatalf("changed %v", res.Changed)
			}
			// Applying again changes nothing.
			before = s.Mutations()
			if _, err := applyConfig(t, s, f, tc.to, ApplyOptions{}); err != nil {
				t.Fatal(err)
			}
			if d := mutationsSince(before, s.Mutations()); len(d) != 0 {
				t.Fatalf("second apply mutated %v", d)
			}
		})
	}
}

// Ampere: a mode change takes effect through a reset of just that GPU; with
// no reset possible it needs a reboot (ErrRebootRequired), creates wait.
func TestApplyAmpereModeChange(t *testing.T) {
	f := parseSpec(t, `version: v1
mig-configs:
  gpu1:
    - devices: [1]
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
`)
	s := newSim(t, "a100-40gbx2", nvmlx.SimOptions{})
	res, err := applyConfig(t, s, f, "gpu1", ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Reset) != 1 || res.Reset[0] != 1 || len(res.RebootGPUs) != 0 {
		t.Fatalf("reset %v reboot %v, want reset [1]", res.Reset, res.RebootGPUs)
	}

	noReset := newSim(t, "a100-40gbx2", nvmlx.SimOptions{NoReset: true})
	res, err = applyConfig(t, noReset, f, "gpu1", ApplyOptions{})
	if !errors.Is(err, ErrRebootRequired) || len(res.RebootGPUs) != 1 || res.RebootGPUs[0] != 1 {
		t.Fatalf("err %v reboot %v, want ErrRebootRequired on GPU 1", err, res.RebootGPUs)
	}
	if d := noReset.Mutations(); d[nvmlx.OpCreateGpuInstanceWithPlacement] != 0 {
		t.Fatalf("created instances before the reboot: %v", d)
	}
}

// Hopper changes mode at once: no reset, no reboot.
func TestApplyHopperModeChange(t *testing.T) {
	s := newSim(t, "h100-80gbx2", nvmlx.SimOptions{NoReset: true})
	res, err := applyConfig(t, s, nil, "all-balanced", ApplyOptions{})
	if err != nil || len(res.Reset) != 0 || len(res.RebootGPUs) != 0 {
		t.Fatalf("err %v reset %v reboot %v", err, res.Reset, res.RebootGPUs)
	}
}

// An NVML failure mid-GPU names the GPU and how far it got; a retry
// re-plans from what is there and converges.
func TestApplyFaultThenRetry(t *testing.T) {
	s := newSim(t, "h200x2", nvmlx.SimOptions{Faults: "CreateGpuInstanceWithPlacement:6=ERROR_INSUFFICIENT_RESOURCES"})
	_, err := applyConfig(t, s, nil, "all-balanced", ApplyOptions{})
	var pe *PartialError
	if !errors.As(err, &pe) || pe.GPU != 1 || pe.Created != 1 || !errors.Is(err, nvmlx.ErrInsufficientResources) {
		t.Fatalf("err %v, want a PartialError on GPU 1 after 1 create", err)
	}
	if _, err := applyConfig(t, s, nil, "all-balanced", ApplyOptions{}); err != nil {
		t.Fatalf("retry: %v", err)
	}
}

// A failed compute-instance create leaves no GPU instance behind.
func TestApplyComputeFaultUndoesGPUInstance(t *testing.T) {
	s := newSim(t, "h200x1", nvmlx.SimOptions{Faults: "CreateComputeInstance:1=ERROR_UNKNOWN"})
	if _, err := applyConfig(t, s, nil, "all-7g.141gb", ApplyOptions{}); err == nil {
		t.Fatal("want an error")
	}
	insts, err := s.Instances(0)
	if err != nil || len(insts) != 0 {
		t.Fatalf("instances %v err %v, want none", insts, err)
	}
}

// export renders a geometry that apply reproduces on fresh GPUs.
func TestExportRoundTrip(t *testing.T) {
	f := parseSpec(t, `version: v1
mig-configs:
  mixed:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    - devices: [1]
      mig-enabled: false
    - devices: [2]
      mig-enabled: true
      mig-devices: {"1c.3g.71gb": 2}
`)
	s := newSim(t, "h200x3", nvmlx.SimOptions{})
	if _, err := applyConfig(t, s, f, "mixed", ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	n, err := Discover(s)
	if err != nil {
		t.Fatal(err)
	}
	data, err := n.Export().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	exported := parseSpec(t, string(data))
	fresh := newSim(t, "h200x3", nvmlx.SimOptions{})
	if _, err := applyConfig(t, fresh, exported, ExportName, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	m, _ := Discover(fresh)
	want, got := n.GeometryOf(), m.GeometryOf()
	for k := range want {
		if len(want[k]) != len(got[k]) {
			t.Fatalf("GPU %s: exported+applied %v, original %v\n%s", k, got[k], want[k], data)
		}
	}
}
