package main

import (
	"fmt"
	"sort"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/profiles"
)

// mutationTransitions is the fixed set of changes the NVML mutation
// figures are summed over, applied in this order on one simulated H200x8
// node (each starts where the previous one ended).
func mutationTransitions() []string {
	return []string{
		"all-balanced",   // from MIG off
		"all-1g.18gb",    // balanced → seven small
		"one-gpu",        // one GPU of eight to balanced
		"all-balanced",   // the other seven follow
		"all-3g.71gb",    // balanced → two halves
		"all-balanced",   // and back
		"all-2g.35gb",    // balanced → three 2g
		"all-1g.35gb",    // 2g → four 1g.35gb
		"all-disabled",   // MIG off
		"all-7g.141gb",   // one whole-GPU instance each
		"all-1g.18gb.me", // a media-engine slice each
	}
}

// oneGPUConfig changes GPU 0 of an all-1g.18gb H200 node and keeps the rest.
const oneGPUConfig = `version: v1
mig-configs:
  one-gpu:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 7}
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
`

// mutationFigures is what the NVML mutation benchmark measures, counted in
// GPU instance creations and destructions plus MIG mode changes (compute
// instances follow their GPU instance one to one in these configs).
type mutationFigures struct {
	Ours, Minimum, Teardown int
	PerTransition           []transitionMutations
}

type transitionMutations struct {
	To                       string
	Ours, Minimum, Teardown  int
	ComputeInstanceMutations int
}

type gi struct{ profile, start, size int }

// runMutations applies the transitions with mig-agent's own apply on an
// in-memory simulator and compares its mutations with the minimum and with
// a teardown (destroy everything on a changed GPU, create everything).
func runMutations(configFile string) (*mutationFigures, error) {
	sim, err := nvmlx.NewSim("h200x8", nvmlsim.Options{})
	if err != nil {
		return nil, err
	}
	file, err := gpus.LoadConfigFile(configFile)
	if err != nil {
		return nil, err
	}
	out := &mutationFigures{}
	for _, name := range mutationTransitions() {
		before, err := gpus.Discover(sim)
		if err != nil {
			return nil, err
		}
		m0 := sim.Mutations()
		spec, _, err := gpus.Lookup(file, name, before.GPUs)
		if err != nil {
			return nil, err
		}
		plan, err := geometry.BuildPlan(spec, name, before.GPUs)
		if err != nil {
			return nil, err
		}
		if _, err := gpus.ApplyAndVerify(sim, before, plan, file, name, gpus.ApplyOptions{}); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		m1 := sim.Mutations()
		d := func(op string) int { return m1[op] - m0[op] }
		after, err := gpus.Discover(sim)
		if err != nil {
			return nil, err
		}
		tm := transitionMutations{To: name,
			Ours:                     d(nvmlsim.OpCreateGpuInstanceWithPlacement) + d(nvmlsim.OpGpuInstanceDestroy) + d(nvmlsim.OpSetMigMode),
			ComputeInstanceMutations: d(nvmlsim.OpCreateComputeInstance) + d(nvmlsim.OpComputeInstanceDestroy),
		}
		for i := range before.Devices {
			cur, want := instancesOf(before.Instances[i]), instancesOf(after.Instances[i])
			modeChange := 0
			if before.Devices[i].MigMode.Current != after.Devices[i].MigMode.Current {
				modeChange = 1
			}
			if modeChange == 0 && sameInstances(cur, want) {
				continue
			}
			min, err := minimalDiff(before.Devices[i].Catalogue, cur, want)
			if err != nil {
				return nil, fmt.Errorf("%s: GPU %d: %w", name, i, err)
			}
			tm.Minimum += min + modeChange
			tm.Teardown += len(cur) + len(want) + modeChange
		}
		out.Ours += tm.Ours
		out.Minimum += tm.Minimum
		out.Teardown += tm.Teardown
		out.PerTransition = append(out.PerTransition, tm)
	}
	return out, nil
}

func instancesOf(in []nvmlx.GPUInstance) []gi {
	out := make([]gi, 0, len(in))
	for _, x := range in {
		out = append(out, gi{x.ProfileID, x.Placement.Start, x.Placement.Size})
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].start != out[b].start {
			return out[a].start < out[b].start
		}
		return out[a].profile < out[b].profile
	})
	return out
}

func sameInstances(a, b []gi) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// minimalDiff is the fewest GPU instance destructions plus creations that
// take a GPU from cur to some valid geometry with want's profiles (their
// placements chosen freely): |cur| + |want| − 2·k for the largest k such
// that k instances of cur can stay while the rest of want is placed
// around them. It searches every subset and every placement; validity is
// what the simulator (which enforces the hardware's rules) accepts. It
// shares no code with mig-agent's planner.
func minimalDiff(cat profiles.Catalogue, cur, want []gi) (int, error) {
	wantCount := map[int]int{}
	for _, w := range want {
		wantCount[w.profile]++
	}
	n := len(cur)
	best := -1
	for mask := range 1 << n {
		var keep []gi
		count := map[int]int{}
		ok := true
		for i := range n {
			if mask&(1<<i) != 0 {
				keep = append(keep, cur[i])
				count[cur[i].profile]++
				if count[cur[i].profile] > wantCount[cur[i].profile] {
					ok = false
				}
			}
		}
		if !ok || len(keep) <= best {
			continue
		}
		var rest []int
		for p, c := range wantCount {
			for range c - count[p] {
				rest = append(rest, p)
			}
		}
		sort.Ints(rest)
		fits, err := placeable(cat, keep, rest)
		if err != nil {
			return 0, err
		}
		if fits {
			best = len(keep)
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("the wanted geometry does not fit at all")
	}
	return len(cur) + len(want) - 2*best, nil
}

// placeable reports whether profiles rest can be placed on a GPU that
// holds keep, by backtracking over the catalogue's placements on a fresh
// one-GPU simulator of the same catalogue.
func placeable(cat profiles.Catalogue, keep []gi, rest []int) (bool, error) {
	model := ""
	for _, m := range profiles.Models() {
		if m.MigCapable && sameCatalogue(m.Catalogue, cat) {
			model = m.Key
			break
		}
	}
	if model == "" {
		return false, fmt.Errorf("no simulator model with this catalogue")
	}
	sim, err := nvmlx.NewSim(model+"x1", nvmlsim.Options{})
	if err != nil {
		return false, err
	}
	if _, err := sim.SetMigMode(0, true); err != nil {
		return false, err
	}
	for _, k := range keep {
		if _, err := sim.CreateGPUInstance(0, k.profile, profiles.Placement{Start: k.start, Size: k.size}); err != nil {
			return false, nil
		}
	}
	var try func(i int) bool
	try = func(i int) bool {
		if i == len(rest) {
			return true
		}
		p, ok := cat.ByID(rest[i])
		if !ok {
			return false
		}
		for _, pl := range p.Placements {
			id, err := sim.CreateGPUInstance(0, p.ID, pl)
			if err != nil {
				continue
			}
			if try(i + 1) {
				return true
			}
			if err := sim.DestroyGPUInstance(0, id); err != nil {
				return false
			}
		}
		return false
	}
	return try(0), nil
}

func sameCatalogue(a, b profiles.Catalogue) bool {
	if a.MemorySlices != b.MemorySlices || len(a.Profiles) != len(b.Profiles) {
		return false
	}
	for i := range a.Profiles {
		if a.Profiles[i].ID != b.Profiles[i].ID || a.Profiles[i].Name != b.Profiles[i].Name {
			return false
		}
	}
	return true
}
