package geometry

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/migagent/mig-agent/profiles"
)

// PlanGPU plans the change of one GPU from what it has now (MIG mode current
// and pending, GPU instances with their compute instances) to what req
// asks; req nil leaves it untouched. It validates req first (see Validate).
//
// A GPU already holds req when its MIG mode is req's and its compute
// instances, counted per profile, are req's counts, whatever GPU
// instances they sit in (nvidia-mig-parted's assert and apply compare
// exactly these counts, MigConfig.Equals over GetMigConfig), and no GPU
// instance is empty: then the plan is untouched. Otherwise the plan is a
// minimal diff towards the GPU instances Fit packs: among all placements
// of them it takes one that keeps the most existing compute instances,
// then the most existing GPU instances (same GPU instance profile and
// start; ties: lowest placements first). A kept GPU instance loses only
// the compute instances the new geometry does not hold there and gains
// only those it lacks (DestroyCompute, CreateCompute); the others are
// destroyed (Destroy) and the missing ones created (Create). A mode change
// destroys everything when disabling and creates everything when enabling.
// A mode change on an Ampere GPU needs a GPU reset (ResetNeeded); also when
// the wanted mode is already pending there. On Hopper and later no reset
// is needed. A pending mode that differs from the wanted one, with the
// current mode right, is undone by setting the mode again (ModeChange, no
// reset).
func PlanGPU(gpu GPU, req *Request) (GPUPlan, error) {
	gp := GPUPlan{
		Index: gpu.Index, UUID: gpu.UUID, Action: ActionUntouched, ModeChange: ModeNone,
		Destroy: []Instance{}, Create: []Instance{}, Keep: []Instance{},
		DestroyCompute: []ComputeChange{}, CreateCompute: []ComputeChange{},
	}
	current := make([]Instance, len(gpu.Instances))
	for i, in := range gpu.Instances {
		in.Compute = computeOf(in)
		current[i] = in
	}
	sortInstances(current)
	if req == nil {
		gp.MigEnabled = gpu.ModeCurrent
		gp.Keep = append(gp.Keep, current...)
		gp.Desired = slices.Clone(current)
		return gp, nil
	}
	gp.MigEnabled = req.MigEnabled
	if req.MigEnabled != gpu.ModeCurrent || req.MigEnabled != gpu.ModePending {
		gp.ModeChange = ModeDisable
		if req.MigEnabled {
			gp.ModeChange = ModeEnable
		}
		gp.ResetNeeded = req.MigEnabled != gpu.ModeCurrent && gpu.Architecture == profiles.ArchAmpere
	}
	var existing map[giKey][]string
	if req.MigEnabled && gpu.ModeCurrent {
		existing = make(map[giKey][]string, len(current))
		for _, in := range current {
			existing[giKey{canonical(in.Profile), in.Start}] = in.Compute
		}
	}
	desired, err := place(&gpu, req, existing)
	if err != nil {
		return gp, err
	}
	if gp.ModeChange == ModeNone && req.MigEnabled && Holds(current, req.Devices) {
		gp.Keep = append(gp.Keep, current...)
		gp.Desired = slices.Clone(current)
		return gp, nil
	}
	gp.Desired = desired
	if desired == nil {
		gp.Desired = []Instance{}
	}
	kept := map[giKey]bool{}
	for _, d := range desired {
		k := giKey{canonical(d.Profile), d.Start}
		have, ok := existing[k]
		if !ok {
			gp.Create = append(gp.Create, d)
			continue
		}
		kept[k] = true
		gp.Keep = append(gp.Keep, d)
		for _, c := range minus(have, d.Compute) {
			gp.DestroyCompute = append(gp.DestroyCompute, ComputeChange{Profile: d.Profile, Start: d.Start, Compute: c, ProfileID: d.ProfileID})
		}
		for _, c := range minus(d.Compute, have) {
			gp.CreateCompute = append(gp.CreateCompute, ComputeChange{Profile: d.Profile, Start: d.Start, Compute: c, ProfileID: d.ProfileID})
		}
	}
	for _, in := range current {
		if !kept[giKey{canonical(in.Profile), in.Start}] {
			gp.Destroy = append(gp.Destroy, in)
		}
	}
	if gp.ModeChange != ModeNone || len(gp.Destroy)+len(gp.Create)+len(gp.DestroyCompute)+len(gp.CreateCompute) > 0 {
		gp.Action = ActionChange
	}
	return gp, nil
}

// Holds reports whether instances hold exactly the compute instances
// devices ask for, counted per profile (names canonical, zero counts
// ignored), with no GPU instance empty: nvidia-mig-parted's test of an
// applied config (MigConfig.Equals of GetMigConfig and the config).
func Holds(instances []Instance, devices []DeviceCount) bool {
	have := map[string]int{}
	for _, in := range instances {
		cis := computeOf(in)
		if len(cis) == 0 {
			return false
		}
		for _, c := range cis {
			have[c]++
		}
	}
	want := map[string]int{}
	for _, d := range devices {
		if d.Count != 0 {
			want[canonical(d.Profile)] += d.Count
		}
	}
	return maps.Equal(have, want)
}

// BuildPlan resolves config name against the node's GPUs, validates and
// plans every GPU (sorted by index; GPUs without a request untouched). The
// first invalid GPU fails the whole plan: nothing is applied by halves.
// RebootNeeded is set when a GPU needs a reset it cannot have.
func BuildPlan(s *Spec, name string, gpus []GPU) (*Plan, error) {
	reqs, warnings, err := s.Resolve(name, gpus)
	if err != nil {
		return nil, err
	}
	byGPU := make(map[int]*Request, len(reqs))
	for i := range reqs {
		byGPU[reqs[i].GPU] = &reqs[i]
	}
	sorted := slices.Clone(gpus)
	sort.SliceStable(sorted, func(a, b int) bool { return sorted[a].Index < sorted[b].Index })
	p := &Plan{Config: name, Warnings: warnings, Hash: Hash(reqs), GPUs: make([]GPUPlan, 0, len(sorted))}
	for _, g := range sorted {
		gp, err := PlanGPU(g, byGPU[g.Index])
		if err != nil {
			return nil, err
		}
		p.RebootNeeded = p.RebootNeeded || gp.ResetNeeded && !g.CanReset
		p.GPUs = append(p.GPUs, gp)
	}
	return p, nil
}

// Hash is the sha256 (hex) of a canonical form of the geometry reqs ask
// for: per GPU index, the MIG mode and the profile counts, independent of
// request order, profile order, attribute order and zero counts.
func Hash(reqs []Request) string {
	rs := slices.Clone(reqs)
	sort.SliceStable(rs, func(a, b int) bool { return rs[a].GPU < rs[b].GPU })
	h := sha256.New()
	for _, r := range rs {
		counts := map[string]int{}
		for _, d := range r.Devices {
			counts[canonical(d.Profile)] += d.Count
		}
		var parts []string
		for _, n := range slices.Sorted(maps.Keys(counts)) {
			if counts[n] != 0 {
				parts = append(parts, fmt.Sprintf("%s=%d", n, counts[n]))
			}
		}
		fmt.Fprintf(h, "gpu %d mig %t %s\n", r.GPU, r.MigEnabled, strings.Join(parts, ","))
	}
	return hex.EncodeToString(h.Sum(nil))
}
