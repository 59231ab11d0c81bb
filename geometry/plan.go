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
// and pending, GPU instances) to what req asks; req nil leaves it untouched.
// It validates req first (see Validate).
//
// The plan is a minimal diff: among all placements of the requested GPU
// instances, it takes one that keeps the most existing instances in place
// (same GPU instance profile, start and compute profile), destroys the
// others and creates what is missing (ties: lowest placements first). A GPU
// instance holding several compute instances (ComputeCount > 1) is never
// kept, as configs ask for one each. A mode change destroys everything
// when disabling and creates everything when enabling. A mode change on an
// Ampere GPU needs a GPU reset (ResetNeeded); also when the wanted mode is
// already pending there. On Hopper and later no reset is needed. A pending
// mode that differs from the wanted one, with the current mode right, is
// undone by setting the mode again (ModeChange, no reset).
func PlanGPU(gpu GPU, req *Request) (GPUPlan, error) {
	gp := GPUPlan{
		Index: gpu.Index, UUID: gpu.UUID, Action: ActionUntouched, ModeChange: ModeNone,
		Destroy: []Instance{}, Create: []Instance{}, Keep: []Instance{},
	}
	current := slices.Clone(gpu.Instances)
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
	keys := make([]instKey, len(current))
	var existing map[instKey]bool
	if req.MigEnabled && gpu.ModeCurrent {
		existing = make(map[instKey]bool, len(current))
	}
	for i, in := range current {
		keys[i] = keyOf(in)
		if existing != nil && in.ComputeCount <= 1 {
			existing[keys[i]] = true
		}
	}
	desired, err := place(&gpu, req, existing)
	if err != nil {
		return gp, err
	}
	gp.Desired = desired
	if desired == nil {
		gp.Desired = []Instance{}
	}
	wanted := make(map[instKey]bool, len(desired))
	for _, d := range desired {
		k := instKey{canonical(d.Profile), d.Start, d.Compute}
		if existing[k] {
			wanted[k] = true
		} else {
			gp.Create = append(gp.Create, d)
		}
	}
	for i, in := range current {
		if wanted[keys[i]] && in.ComputeCount <= 1 {
			gp.Keep = append(gp.Keep, in)
			delete(wanted, keys[i]) // a second instance with the same key goes
		} else {
			gp.Destroy = append(gp.Destroy, in)
		}
	}
	if gp.ModeChange != ModeNone || len(gp.Destroy)+len(gp.Create) > 0 {
		gp.Action = ActionChange
	}
	return gp, nil
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
