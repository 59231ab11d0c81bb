package geometry

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/profiles"
)

// withInstances returns g with MIG on and the instances of layout, written
// as layout prints them: "1g.18gb@0 1c.3g.71gb@4", a GPU instance holding
// several compute instances as "2c.3g.71gb+1c.3g.71gb@0" or "3×1c.3g.71gb@4",
// one holding none as "3g.71gb[none]@0".
func withInstances(t testing.TB, g GPU, l string) GPU {
	t.Helper()
	g.ModeCurrent, g.ModePending = true, true
	g.Instances = nil
	for _, f := range strings.Fields(l) {
		name, start, _ := strings.Cut(f, "@")
		var s int
		fmt.Sscan(start, &s)
		var cis []string
		var gi profiles.Name
		empty := false
		if base, ok := strings.CutSuffix(name, "[none]"); ok {
			name, empty = base, true
		}
		for _, part := range strings.Split(name, "+") {
			count := 1
			if c, rest, ok := strings.Cut(part, "×"); ok {
				fmt.Sscan(c, &count)
				part = rest
			}
			n, err := profiles.Parse(part)
			if err != nil {
				t.Fatal(err)
			}
			gi = n.GI()
			for range count {
				cis = append(cis, part)
			}
		}
		p, ok := g.Catalogue.ByName(gi)
		if !ok {
			t.Fatalf("no %s", name)
		}
		in := Instance{Profile: p.Name, ProfileID: p.ID, Start: s, Size: p.Placements[0].Size, Compute: cis}
		if empty {
			in.Compute = []string{}
		}
		g.Instances = append(g.Instances, in)
	}
	return g
}

// ciLayout prints compute instance changes as "1c.3g.71gb@4".
func ciLayout(cs []ComputeChange) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprintf("%s@%d", c.Compute, c.Start)
	}
	return strings.Join(parts, " ")
}

const seven1g = "1g.18gb@0 1g.18gb@1 1g.18gb@2 1g.18gb@3 1g.18gb@4 1g.18gb@5 1g.18gb@6"

func TestPlanGPUMinimalDiff(t *testing.T) {
	h := modelGPU(t, "h200", 0)
	tests := []struct {
		name                  string
		from                  string
		devices               []DeviceCount
		keep, destroy, create string
		ciDestroy, ciCreate   string // compute instances inside kept GPU instances
	}{
		{"7×1g → 2×1g + 2g + 3g", seven1g, dc("1g.18gb=2", "2g.35gb=1", "3g.71gb=1"),
			"1g.18gb@2 1g.18gb@3", "1g.18gb@0 1g.18gb@1 1g.18gb@4 1g.18gb@5 1g.18gb@6", "2g.35gb@0 3g.71gb@4", "", ""},
		{"7×1g → 4×1g + 3g", seven1g, dc("1g.18gb=4", "3g.71gb=1"),
			"1g.18gb@0 1g.18gb@1 1g.18gb@2 1g.18gb@3", "1g.18gb@4 1g.18gb@5 1g.18gb@6", "3g.71gb@4", "", ""},
		{"keeps a 1g at 6", "1g.18gb@6 3g.71gb@0", dc("1g.18gb=1", "2g.35gb=1", "4g.71gb=1"),
			"1g.18gb@6", "3g.71gb@0", "4g.71gb@0 2g.35gb@4", "", ""},
		{"same geometry", "3g.71gb@0 3g.71gb@4", dc("3g.71gb=2"), "3g.71gb@0 3g.71gb@4", "", "", "", ""},
		{"compute profile differs: the GPU instance stays, its compute instance changes", "3g.71gb@0 3g.71gb@4", dc("3g.71gb=1", "1c.3g.71gb=1"),
			"3g.71gb@0 1c.3g.71gb@4", "", "", "3g.71gb@4", "1c.3g.71gb@4"},
		{"moves 2g to keep 3g at 0", "3g.71gb@0", dc("3g.71gb=1", "2g.35gb=2"), "", "3g.71gb@0", "2g.35gb@0 2g.35gb@2 3g.71gb@4", "", ""},
		{"empty request destroys all", "1g.18gb@0 2g.35gb@2", nil, "", "1g.18gb@0 2g.35gb@2", "", "", ""},
		// Compute instances inside a kept GPU instance: only they change.
		{"adds a compute instance inside a kept GPU instance", "2×1c.3g.71gb@0 3g.71gb@4", dc("1c.3g.71gb=3", "3g.71gb=1"),
			"3×1c.3g.71gb@0 3g.71gb@4", "", "", "", "1c.3g.71gb@0"},
		{"removes a compute instance inside a kept GPU instance", "3×1c.3g.71gb@0 3g.71gb@4", dc("1c.3g.71gb=2", "3g.71gb=1"),
			"2×1c.3g.71gb@0 3g.71gb@4", "", "", "1c.3g.71gb@0", ""},
		{"2c+1c → 3×1c keeps the 1c", "2c.3g.71gb+1c.3g.71gb@4", dc("1c.3g.71gb=3"),
			"3×1c.3g.71gb@4", "", "", "2c.3g.71gb@4", "1c.3g.71gb@4 1c.3g.71gb@4"},
		{"a second 3g for the overflow, the first untouched", "3×1c.3g.71gb@4", dc("1c.3g.71gb=4"),
			"3×1c.3g.71gb@4", "", "1c.3g.71gb@0", "", ""},
		{"the same counts in other GPU instances are applied (mig-parted's assert)", "1c.3g.71gb@0 1c.3g.71gb@4", dc("1c.3g.71gb=2"),
			"1c.3g.71gb@0 1c.3g.71gb@4", "", "", "", ""},
		{"an empty GPU instance is filled", "3g.71gb[none]@0", dc("1c.3g.71gb=2"),
			"2×1c.3g.71gb@0", "", "", "", "1c.3g.71gb@0 1c.3g.71gb@0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := withInstances(t, h, tc.from)
			p, err := PlanGPU(g, &Request{GPU: 0, MigEnabled: true, Devices: tc.devices})
			if err != nil {
				t.Fatal(err)
			}
			got := [5]string{layout(p.Keep), layout(p.Destroy), layout(p.Create), ciLayout(p.DestroyCompute), ciLayout(p.CreateCompute)}
			if want := [5]string{tc.keep, tc.destroy, tc.create, tc.ciDestroy, tc.ciCreate}; got != want {
				t.Fatalf("keep/destroy/create/ci destroy/ci create %q; want %q", got, want)
			}
			wantAction := ActionChange
			if tc.destroy == "" && tc.create == "" && tc.ciDestroy == "" && tc.ciCreate == "" {
				wantAction = ActionUntouched
			}
			if p.Action != wantAction || p.ModeChange != ModeNone || p.ResetNeeded || !p.MigEnabled {
				t.Fatalf("plan %+v", p)
			}
			again, err := PlanGPU(apply(g, p), &Request{GPU: 0, MigEnabled: true, Devices: tc.devices})
			if err != nil || again.Action != ActionUntouched {
				t.Fatalf("after apply: %+v, %v", again, err)
			}
		})
	}
}

func TestPlanGPUModes(t *testing.T) {
	hopper := modelGPU(t, "h200", 0)
	ampere := hopper // same catalogue, Ampere rules
	ampere.Architecture = profiles.ArchAmpere
	on := func(g GPU) GPU { return withInstances(t, g, "3g.71gb@0 3g.71gb@4") }
	pending := func(g GPU, p bool) GPU { g.ModePending = p; return g }
	enable := &Request{MigEnabled: true, Devices: dc("3g.71gb=2")}
	tests := []struct {
		name     string
		gpu      GPU
		req      *Request
		mode     string
		reset    bool
		destroy  int
		create   int
		action   string
		migAfter bool
	}{
		{"no request", on(hopper), nil, ModeNone, false, 0, 0, ActionUntouched, true},
		{"enable on Hopper", hopper, enable, ModeEnable, false, 0, 2, ActionChange, true},
		{"enable on Ampere", ampere, enable, ModeEnable, true, 0, 2, ActionChange, true},
		{"enable already pending on Ampere", pending(ampere, true), enable, ModeEnable, true, 0, 2, ActionChange, true},
		{"disable with instances", on(hopper), &Request{}, ModeDisable, false, 2, 0, ActionChange, false},
		{"disable on Ampere", on(ampere), &Request{}, ModeDisable, true, 2, 0, ActionChange, false},
		{"cancel a pending disable", pending(on(ampere), false), enable, ModeEnable, false, 0, 0, ActionChange, true},
		{"already disabled", hopper, &Request{}, ModeNone, false, 0, 0, ActionUntouched, false},
		{"already applied", on(ampere), enable, ModeNone, false, 0, 0, ActionUntouched, true},
		{"no MIG GPU, off", l40s(0), &Request{}, ModeNone, false, 0, 0, ActionUntouched, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := PlanGPU(tc.gpu, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if p.ModeChange != tc.mode || p.ResetNeeded != tc.reset || len(p.Destroy) != tc.destroy ||
				len(p.Create) != tc.create || p.Action != tc.action || p.MigEnabled != tc.migAfter {
				t.Fatalf("plan %+v", p)
			}
			again, err := PlanGPU(apply(tc.gpu, p), tc.req)
			if err != nil || again.Action != ActionUntouched {
				t.Fatalf("after apply: %+v, %v", again, err)
			}
		})
	}
}

func TestBuildPlanOneOfEight(t *testing.T) {
	gpus := node(t, "h200", 8)
	for i := range gpus {
		gpus[i] = withInstances(t, gpus[i], seven1g)
	}
	spec := mustParse(t, `version: v1
mig-configs:
  one-changes:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 7}
    - devices: [5]
      mig-enabled: true
      mig-devices: {"1g.18gb": 4, "3g.71gb": 1}
`)
	p, err := BuildPlan(spec, "one-changes", gpus)
	if err != nil {
		t.Fatal(err)
	}
	for _, gp := range p.GPUs {
		want := ActionUntouched
		if gp.Index == 5 {
			want = ActionChange
		}
		if gp.Action != want || gp.UUID != gpus[gp.Index].UUID {
			t.Fatalf("GPU %d: %+v", gp.Index, gp)
		}
	}
	if p.RebootNeeded || len(p.GPUs) != 8 || p.Config != "one-changes" || len(p.Hash) != 64 {
		t.Fatalf("plan %+v", p)
	}
	if g := p.GPUs[5]; len(g.Destroy) != 3 || len(g.Create) != 1 || len(g.Keep) != 4 {
		t.Fatalf("GPU 5: %+v", g)
	}
}

func TestBuildPlanReboot(t *testing.T) {
	gpus := node(t, "h200", 2)
	for i := range gpus {
		gpus[i].Architecture = profiles.ArchAmpere
	}
	gpus[1].CanReset = false
	spec := Generate(gpus)
	p, err := BuildPlan(spec, "all-balanced", gpus)
	if err != nil {
		t.Fatal(err)
	}
	if !p.RebootNeeded || !p.GPUs[0].ResetNeeded || !p.GPUs[1].ResetNeeded {
		t.Fatalf("plan %+v", p)
	}
	gpus[1].CanReset = true
	if p, _ = BuildPlan(spec, "all-balanced", gpus); p.RebootNeeded {
		t.Fatal("reboot needed with resettable GPUs")
	}
	_, err = BuildPlan(mustParse(t, "version: v1\nmig-configs: {x: [{devices: [1], mig-enabled: true, mig-devices: {\"4g.71gb\": 2}}]}\n"), "x", gpus)
	if err == nil || !strings.Contains(err.Error(), "GPU 1 (NVIDIA H200): MIG devices do not fit on this GPU: 4g.71gb + 4g.71gb: needs 8 compute slices of 7") {
		t.Fatalf("error %v", err)
	}
}

// TestPlanApplyPlan walks every model through random sequences of configs
// (NVIDIA's defaults, generated ones and random requests): each plan,
// applied, leaves nothing to do, and keeps what it says it keeps.
func TestPlanApplyPlan(t *testing.T) {
	d := readSpec(t, "config-default.yaml")
	for _, m := range migModels() {
		r := rand.New(rand.NewPCG(7, uint64(m.PCIDeviceID)))
		g := gpuOf(m, 0)
		var reqs []*Request
		for _, s := range []*Spec{d, Generate([]GPU{g})} {
			for _, name := range s.Names {
				rs, _, err := s.Resolve(name, []GPU{g})
				if err == nil && Validate(g, rs[0]) == nil {
					reqs = append(reqs, &rs[0])
				}
			}
		}
		for range 300 {
			req := &Request{MigEnabled: true, Devices: randomRequest(r, &g.Catalogue)}
			if Validate(g, *req) == nil {
				reqs = append(reqs, req)
			}
		}
		for step := range 2000 {
			req := reqs[r.IntN(len(reqs))]
			p, err := PlanGPU(g, req)
			if err != nil {
				t.Fatalf("%s step %d: %v", m.Key, step, err)
			}
			kept := map[giKey]bool{}
			for _, k := range p.Keep {
				kept[giKey{canonical(k.Profile), k.Start}] = true
			}
			if len(p.Keep)+len(p.Destroy) != len(g.Instances) || len(p.Keep)+len(p.Create) != len(p.Desired) {
				t.Fatalf("%s step %d: plan does not add up: %+v", m.Key, step, p)
			}
			checkInstances(t, &g.Catalogue, p.Desired)
			g = apply(g, p)
			again, err := PlanGPU(g, req)
			if err != nil || again.Action != ActionUntouched || len(again.Keep) != len(g.Instances) {
				t.Fatalf("%s step %d: after apply %+v, %v", m.Key, step, again, err)
			}
			for k := range kept {
				found := false
				for _, in := range g.Instances {
					found = found || giKey{canonical(in.Profile), in.Start} == k
				}
				if !found {
					t.Fatalf("%s step %d: kept %+v is gone", m.Key, step, k)
				}
			}
		}
	}
}

// TestPlanKeepsMost checks the planner's keep count against brute force:
// no placement of the desired multiset keeps more existing instances.
func TestPlanKeepsMost(t *testing.T) {
	for _, m := range migModels() {
		r := rand.New(rand.NewPCG(3, uint64(m.PCIDeviceID)))
		g := gpuOf(m, 0)
		g.ModeCurrent, g.ModePending = true, true
		for range 500 {
			from, to := randomRequest(r, &g.Catalogue), randomRequest(r, &g.Catalogue)
			cur, err := Fit(&g.Catalogue, from)
			if err != nil || Validate(g, Request{MigEnabled: true, Devices: to}) != nil {
				continue
			}
			g.Instances = cur
			p, err := PlanGPU(g, &Request{MigEnabled: true, Devices: to})
			if err != nil {
				t.Fatal(err)
			}
			if best := bruteKeep(&g.Catalogue, to, cur); len(p.Keep) != best {
				t.Fatalf("%s: %s → %v keeps %d, brute force %d", m.Key, layout(cur), to, len(p.Keep), best)
			}
		}
	}
}

func bruteKeep(cat *profiles.Catalogue, to []DeviceCount, cur []Instance) int {
	var items []*profiles.Profile
	for _, d := range to {
		n, _ := profiles.Parse(d.Profile)
		p, _ := cat.ByName(n)
		for range d.Count {
			items = append(items, p)
		}
	}
	has := map[string]bool{}
	for _, in := range cur {
		has[fmt.Sprintf("%s@%d", in.Profile, in.Start)] = true
	}
	best := -1
	var rec func(k int, used uint64, kept int)
	rec = func(k int, used uint64, kept int) {
		if k == len(items) {
			best = max(best, kept)
			return
		}
		for _, pl := range items[k].Placements {
			m := uint64(1<<pl.Size-1) << pl.Start
			if used&m == 0 {
				gain := 0
				if has[fmt.Sprintf("%s@%d", items[k].Name, pl.Start)] {
					gain = 1
				}
				rec(k+1, used|m, kept+gain)
			}
		}
	}
	rec(0, 0, 0)
	return best
}

func TestHash(t *testing.T) {
	a := []Request{
		{GPU: 1, MigEnabled: true, Devices: dc("3g.71gb=1", "1g.18gb=2", "2g.35gb=1")},
		{GPU: 0, MigEnabled: false},
	}
	b := []Request{
		{GPU: 0},
		{GPU: 1, MigEnabled: true, Devices: dc("2g.35gb=1", "1g.18gb=2", "3g.71gb=1", "7g.141gb=0")},
	}
	if Hash(a) != Hash(b) {
		t.Fatal("hash depends on order or zero counts")
	}
	c := []Request{{GPU: 0}, {GPU: 1, MigEnabled: true, Devices: dc("1g.18gb=3", "2g.35gb=1", "3g.71gb=1")}}
	d := []Request{{GPU: 0}, {GPU: 2, MigEnabled: true, Devices: dc("1g.18gb=2", "2g.35gb=1", "3g.71gb=1")}}
	e := []Request{{GPU: 0, MigEnabled: true}, {GPU: 1, MigEnabled: true, Devices: dc("1g.18gb=2", "2g.35gb=1", "3g.71gb=1")}}
	for i, x := range [][]Request{c, d, e} {
		if Hash(x) == Hash(a) {
			t.Fatalf("case %d hashes like a different geometry", i)
		}
	}
	if x, y := Hash([]Request{{GPU: 0, MigEnabled: true, Devices: dc("1g.24gb+me,gfx=1")}}),
		Hash([]Request{{GPU: 0, MigEnabled: true, Devices: dc("1g.24gb+gfx,me=1")}}); x != y {
		t.Fatal("hash depends on attribute order")
	}
}
