package gpus

import (
	"context"
	"fmt"
	"slices"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/nvmlx"
)

// What a plan takes away, in one place: the GPUs that change, the MIG
// devices destroyed, the pods and processes on them. The drain step, the
// stray-process check, ApplyPlan and the dry run (plan --node-name) all
// read it from here.

// PodFinder finds the pods holding whole GPUs or MIG devices (by UUID).
type PodFinder interface {
	Affected(ctx context.Context, gpuUUIDs, migUUIDs []string) (pods []string, how string, err error)
}

// PlanChanges tells whether the plan changes any GPU.
func PlanChanges(p *geometry.Plan) bool {
	for _, g := range p.GPUs {
		if g.Action == geometry.ActionChange {
			return true
		}
	}
	return false
}

// Indices lists the GPUs the plan changes and those it leaves untouched.
func Indices(p *geometry.Plan) (changed, untouched []int) {
	changed, untouched = []int{}, []int{}
	for _, g := range p.GPUs {
		if g.Action == geometry.ActionChange {
			changed = append(changed, g.Index)
		} else {
			untouched = append(untouched, g.Index)
		}
	}
	return changed, untouched
}

// Takes lists what the plan takes away: whole GPUs that change (by GPU
// UUID), MIG devices whose GPU instance is destroyed and MIG devices (compute
// instances) destroyed inside a GPU instance that stays.
func Takes(n *Inventory, p *geometry.Plan) (gpuUUIDs, migUUIDs []string) {
	for _, gp := range p.GPUs {
		g, m := takenBy(n, gp)
		gpuUUIDs, migUUIDs = append(gpuUUIDs, g...), append(migUUIDs, m...)
	}
	return gpuUUIDs, migUUIDs
}

// takenBy is Takes for one GPU's plan.
func takenBy(n *Inventory, gp geometry.GPUPlan) (gpuUUIDs, migUUIDs []string) {
	if gp.Action != geometry.ActionChange {
		return nil, nil
	}
	dev, insts, ok := n.Device(gp.Index)
	if !ok {
		return nil, nil
	}
	gpuUUIDs = append(gpuUUIDs, dev.UUID)
	for _, in := range gp.Destroy {
		if gi, ok := findGI(insts, in.ProfileID, in.Start); ok {
			for _, ci := range gi.ComputeInstances {
				migUUIDs = append(migUUIDs, ci.UUID)
			}
		}
	}
	for _, d := range doomedCompute(insts, gp) {
		migUUIDs = append(migUUIDs, d.CI.UUID)
	}
	return gpuUUIDs, migUUIDs
}

// PreviewEvictions fills each changing GPU's Evict with the pods the change
// would evict, as the daemon would find them; it returns how they were
// found (PodResources, or every GPU pod of the node and why).
func PreviewEvictions(ctx context.Context, d PodFinder, n *Inventory, p *geometry.Plan) (string, error) {
	how := ""
	for i, gp := range p.GPUs {
		gpuUUIDs, migUUIDs := takenBy(n, gp)
		if len(gpuUUIDs) == 0 {
			continue
		}
		pods, h, err := d.Affected(ctx, gpuUUIDs, migUUIDs)
		if err != nil {
			return "", fmt.Errorf("GPU %d: %w", gp.Index, err)
		}
		p.GPUs[i].Evict, how = pods, h
	}
	return how, nil
}

// Blockers lists NVML processes on what the plan takes away.
func Blockers(g nvmlx.GPU, n *Inventory, p *geometry.Plan) ([]string, error) {
	var out []string
	for _, gp := range p.GPUs {
		if gp.Action != geometry.ActionChange {
			continue
		}
		procs, err := g.Processes(gp.Index)
		if err != nil {
			return nil, err
		}
		_, insts, _ := n.Device(gp.Index)
		doomed := map[int]bool{}
		for _, in := range gp.Destroy {
			if gi, ok := findGI(insts, in.ProfileID, in.Start); ok {
				doomed[gi.ID] = true
			}
		}
		doomedCI := map[[2]int]bool{}
		for _, d := range doomedCompute(insts, gp) {
			doomedCI[[2]int{d.GI.ID, d.CI.ID}] = true
		}
		for _, pr := range procs {
			if gp.ModeChange != geometry.ModeNone || pr.GIID < 0 || doomed[pr.GIID] || doomedCI[[2]int{pr.GIID, pr.CIID}] {
				out = append(out, fmt.Sprintf("pid %d (%s) on GPU %d", pr.PID, pr.Name, gp.Index))
			}
		}
	}
	return out, nil
}

// ModeChanges tells whether the plan changes the MIG mode of any GPU.
func ModeChanges(p *geometry.Plan) bool {
	return slices.ContainsFunc(p.GPUs, func(g geometry.GPUPlan) bool { return g.ModeChange != geometry.ModeNone })
}

// AllIndices lists every GPU of the plan.
func AllIndices(p *geometry.Plan) []int {
	out := []int{}
	for _, g := range p.GPUs {
		out = append(out, g.Index)
	}
	return out
}

// ModeChangeGPUs lists the GPUs whose MIG mode the plan changes.
func ModeChangeGPUs(p *geometry.Plan) []int {
	var out []int
	for _, g := range p.GPUs {
		if g.ModeChange != geometry.ModeNone {
			out = append(out, g.Index)
		}
	}
	return out
}
