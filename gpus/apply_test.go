package gpus_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/profiles"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

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
	f := testsupport.ParseSpec(t, `version: v1
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
			s := testsupport.NewSim(t, "h200x1", nvmlsim.Options{})
			if _, err := testsupport.ApplyConfig(t, s, f, "all-1g.18gb", gpus.ApplyOptions{}); err != nil {
				t.Fatal(err)
			}
			before := s.Mutations()
			res, err := testsupport.ApplyConfig(t, s, f, tc.to, gpus.ApplyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			d := mutationsSince(before, s.Mutations())
			if d[nvmlsim.OpGpuInstanceDestroy] != tc.destroys || d[nvmlsim.OpCreateGpuInstanceWithPlacement] != tc.creates || d[nvmlsim.OpSetMigMode] != 0 {
				t.Fatalf("mutations %v, want %d destroys and %d creates", d, tc.destroys, tc.creates)
			}
			if len(res.Changed) != 1 {
				t.Fatalf("changed %v", res.Changed)
			}
			// Applying again changes nothing.
			before = s.Mutations()
			if _, err := testsupport.ApplyConfig(t, s, f, tc.to, gpus.ApplyOptions{}); err != nil {
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
	f := testsupport.ParseSpec(t, `version: v1
mig-configs:
  gpu1:
    - devices: [1]
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
`)
	s := testsupport.NewSim(t, "a100-40gbx2", nvmlsim.Options{})
	res, err := testsupport.ApplyConfig(t, s, f, "gpu1", gpus.ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Reset) != 1 || res.Reset[0] != 1 || len(res.RebootGPUs) != 0 {
		t.Fatalf("reset %v reboot %v, want reset [1]", res.Reset, res.RebootGPUs)
	}

	noReset := testsupport.NewSim(t, "a100-40gbx2", nvmlsim.Options{NoReset: true})
	res, err = testsupport.ApplyConfig(t, noReset, f, "gpu1", gpus.ApplyOptions{})
	if !errors.Is(err, gpus.ErrRebootRequired) || len(res.RebootGPUs) != 1 || res.RebootGPUs[0] != 1 {
		t.Fatalf("err %v reboot %v, want ErrRebootRequired on GPU 1", err, res.RebootGPUs)
	}
	if d := noReset.Mutations(); d[nvmlsim.OpCreateGpuInstanceWithPlacement] != 0 {
		t.Fatalf("created instances before the reboot: %v", d)
	}
	// Why no reset happened reaches the result and the error.
	if why := res.NoReset[1]; why == "" || !strings.Contains(err.Error(), "GPU 1: "+why) {
		t.Errorf("no-reset reason %q, error %v", why, err)
	}

	// A reset the settings forbid says so.
	off := testsupport.NewSim(t, "a100-40gbx2", nvmlsim.Options{})
	res, err = testsupport.ApplyConfig(t, off, f, "gpu1", gpus.ApplyOptions{NoReset: true})
	if !errors.Is(err, gpus.ErrRebootRequired) || res.NoReset[1] != "GPU reset disabled" || len(res.Reset) != 0 {
		t.Errorf("reset disabled: err %v, why %q, reset %v", err, res.NoReset[1], res.Reset)
	}
}

// Hopper changes mode at once: no reset, no reboot.
func TestApplyHopperModeChange(t *testing.T) {
	s := testsupport.NewSim(t, "h100-80gbx2", nvmlsim.Options{NoReset: true})
	res, err := testsupport.ApplyConfig(t, s, nil, "all-balanced", gpus.ApplyOptions{})
	if err != nil || len(res.Reset) != 0 || len(res.RebootGPUs) != 0 {
		t.Fatalf("err %v reset %v reboot %v", err, res.Reset, res.RebootGPUs)
	}
}

// An NVML failure mid-GPU names the GPU and how far it got; a retry
// re-plans from what is there and converges.
func TestApplyFaultThenRetry(t *testing.T) {
	s := testsupport.NewSim(t, "h200x2", nvmlsim.Options{Faults: "CreateGpuInstanceWithPlacement:6=ERROR_INSUFFICIENT_RESOURCES"})
	_, err := testsupport.ApplyConfig(t, s, nil, "all-balanced", gpus.ApplyOptions{})
	var pe *gpus.PartialError
	if !errors.As(err, &pe) || pe.GPU != 1 || pe.Created != 1 || !errors.Is(err, nvmlx.ErrInsufficientResources) {
		t.Fatalf("err %v, want a partialError on GPU 1 after 1 create", err)
	}
	if _, err := testsupport.ApplyConfig(t, s, nil, "all-balanced", gpus.ApplyOptions{}); err != nil {
		t.Fatalf("retry: %v", err)
	}
}

// A failed compute-instance create leaves no GPU instance behind.
func TestApplyComputeFaultUndoesGPUInstance(t *testing.T) {
	s := testsupport.NewSim(t, "h200x1", nvmlsim.Options{Faults: "CreateComputeInstance:1=ERROR_UNKNOWN"})
	if _, err := testsupport.ApplyConfig(t, s, nil, "all-7g.141gb", gpus.ApplyOptions{}); err == nil {
		t.Fatal("want an error")
	}
	insts, err := s.Instances(0)
	if err != nil || len(insts) != 0 {
		t.Fatalf("instances %v err %v, want none", insts, err)
	}
}

// sharedGI lists geometries with GPU instances that hold several compute
// instances, as nvidia-mig-parted's apply walk packs them (geometry's
// TestPackMigParted derives each).
const sharedGI = `version: v1
mig-configs:
  seven-1c:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.7g.141gb": 7}
  two-1c-3g:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.71gb": 2}
  overflow:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.71gb": 4}
  mixed-c:
    - devices: all
      mig-enabled: true
      mig-devices: {"2c.3g.71gb": 2, "1c.3g.71gb": 2}
  mixed-7g:
    - devices: all
      mig-enabled: true
      mig-devices: {"2c.7g.141gb": 3, "1c.7g.141gb": 1}
  mixed-gi:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.4g.71gb": 2, "2c.4g.71gb": 1, "1c.3g.71gb": 1, "2c.3g.71gb": 1}
  with-full:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.71gb": 1, "1c.3g.71gb": 3}
`

// geometryOf is every GPU's instances, exactly: profile, placement and
// compute instances.
func geometryOf(t *testing.T, g nvmlx.GPU) string {
	t.Helper()
	n, err := gpus.Discover(g)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, gpu := range n.GPUs {
		fmt.Fprintf(&b, "GPU %d mig %v:", gpu.Index, gpu.ModePending)
		for _, in := range gpu.Instances {
			fmt.Fprintf(&b, " %s@%d:%d", in.Name(), in.Start, in.Size)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// exportApply applies config name of f on a fresh sim of spec, exports the
// result and applies the export on another fresh sim; both must end with
// the same geometry, and the export must already hold on the first.
func exportApply(t *testing.T, spec string, f *gpus.ConfigFile, name string) {
	t.Helper()
	s := testsupport.NewSim(t, spec, nvmlsim.Options{})
	if _, err := testsupport.ApplyConfig(t, s, f, name, gpus.ApplyOptions{}); err != nil {
		t.Fatalf("%s on %s: %v", name, spec, err)
	}
	n, err := gpus.Discover(s)
	if err != nil {
		t.Fatal(err)
	}
	data, err := n.Export(gpus.ExportName).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	exported := testsupport.ParseSpec(t, string(data))
	plan, err := geometry.BuildPlan(exported.Spec, gpus.ExportName, n.GPUs)
	if err != nil {
		t.Fatal(err)
	}
	for _, gp := range plan.GPUs {
		if gp.Action != geometry.ActionUntouched {
			t.Fatalf("%s on %s: the export does not hold where it was read: %+v\n%s", name, spec, gp, data)
		}
	}
	fresh := testsupport.NewSim(t, spec, nvmlsim.Options{})
	if _, err := testsupport.ApplyConfig(t, fresh, exported, gpus.ExportName, gpus.ApplyOptions{}); err != nil {
		t.Fatalf("%s on %s: applying the export: %v\n%s", name, spec, err, data)
	}
	if want, got := geometryOf(t, s), geometryOf(t, fresh); want != got {
		t.Fatalf("%s on %s: export then apply gives\n%s, the original\n%s\nexport:\n%s", name, spec, got, want, data)
	}
}

// export then apply reproduces every geometry of NVIDIA's config files
// (geometry/testdata) on every simulated model they select, and every
// shared-GPU-instance geometry.
func TestExportApplyReproduces(t *testing.T) {
	files, err := filepath.Glob("../geometry/testdata/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no config files: %v", err)
	}
	done := 0
	for _, file := range files {
		f, err := gpus.LoadConfigFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range profiles.Models() {
			if !m.MigCapable {
				continue
			}
			spec := m.Key + "x2"
			n, err := gpus.Discover(testsupport.NewSim(t, spec, nvmlsim.Options{}))
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range f.Spec.Names {
				if _, err := geometry.BuildPlan(f.Spec, name, n.GPUs); err != nil {
					continue // meant for other GPUs, or does not fit them
				}
				exportApply(t, spec, f, name)
				done++
			}
		}
	}
	shared := testsupport.ParseSpec(t, sharedGI)
	for _, name := range shared.Spec.Names {
		exportApply(t, "h200x2", shared, name)
		done++
	}
	if done < 50 {
		t.Fatalf("only %d geometries checked", done)
	}
}

// A change that only adds or removes compute instances inside GPU
// instances that stay touches only those compute instances: no GPU
// instance is destroyed or created, the other compute instances keep their
// MIG device UUIDs, and what would be evicted is the removed one alone.
func TestApplyComputeOnlyChange(t *testing.T) {
	f := testsupport.ParseSpec(t, `version: v1
mig-configs:
  two:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.71gb": 2, "3g.71gb": 1}
  three:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.71gb": 3, "3g.71gb": 1}
`)
	s := testsupport.NewSim(t, "h200x1", nvmlsim.Options{})
	if _, err := testsupport.ApplyConfig(t, s, f, "two", gpus.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	uuids := func() []string {
		n, _ := gpus.Discover(s)
		var out []string
		for u := range n.MIGDevices() {
			out = append(out, u)
		}
		slices.Sort(out)
		return out
	}
	before, m0 := uuids(), s.Mutations()
	if _, err := testsupport.ApplyConfig(t, s, f, "three", gpus.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	after := uuids()
	d := mutationsSince(m0, s.Mutations())
	if len(d) != 1 || d[nvmlsim.OpCreateComputeInstance] != 1 {
		t.Fatalf("adding a compute instance: mutations %v, want 1 compute instance create", d)
	}
	if len(after) != 4 || len(common(before, after)) != 3 {
		t.Fatalf("MIG devices %v → %v: the old ones must stay", before, after)
	}

	// Back to two: the plan destroys one compute instance, the newest, and
	// that MIG device is all that would be evicted.
	n, _ := gpus.Discover(s)
	plan, err := geometry.BuildPlan(f.Spec, "two", n.GPUs)
	if err != nil {
		t.Fatal(err)
	}
	targets, migs := gpus.Takes(n, plan)
	added := minusStrings(after, before)
	if len(targets) != 1 || len(migs) != 1 || migs[0] != added[0] {
		t.Fatalf("targets %v %v; want the GPU and the added MIG device %v", targets, migs, added)
	}
	m1 := s.Mutations()
	if _, err := gpus.ApplyAndVerify(s, n, plan, f, "two", gpus.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := mutationsSince(m1, s.Mutations()); len(d) != 1 || d[nvmlsim.OpComputeInstanceDestroy] != 1 {
		t.Fatalf("removing a compute instance: mutations %v", d)
	}
	if got := uuids(); strings.Join(got, " ") != strings.Join(before, " ") {
		t.Fatalf("MIG devices %v; want %v", got, before)
	}
}

func common(a, b []string) []string {
	var out []string
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func minusStrings(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
