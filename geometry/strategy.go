package geometry

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/migagent/mig-agent/profiles"
)

// ErrStrategy: the node's MIG strategy cannot serve the config.
var ErrStrategy = errors.New("the node's MIG strategy cannot serve this config")

// CheckStrategy checks that the geometry the node has once reqs are
// applied can be served under strategy. "single" exposes one resource type
// for the whole node, so every MIG-capable GPU must have the same mode, and
// when MIG is on, every GPU must hold devices of exactly one profile (GPU
// instance and compute profile), the same on all GPUs. GPUs without a
// request count with what they have now. "mixed", "none" (the device
// plugin ignores MIG) and "" (not declared) accept everything; any other
// value is an error.
func CheckStrategy(strategy string, gpus []GPU, reqs []Request) error {
	switch strategy {
	case "", profiles.StrategyMixed, profiles.StrategyNone:
		return nil
	case profiles.StrategySingle:
	default:
		return fmt.Errorf("unknown MIG strategy %q (want %s, %s or %s)", strategy, profiles.StrategyNone, profiles.StrategySingle, profiles.StrategyMixed)
	}
	byGPU := make(map[int]*Request, len(reqs))
	for i := range reqs {
		byGPU[reqs[i].GPU] = &reqs[i]
	}
	sorted := slices.Clone(gpus)
	sort.SliceStable(sorted, func(a, b int) bool { return sorted[a].Index < sorted[b].Index })
	var on, off []int
	holder, held := -1, ""
	for _, g := range sorted {
		if !g.MigCapable {
			continue
		}
		mig, kinds := g.ModeCurrent, []string{}
		addKind := func(k string) {
			if k = canonical(k); !slices.Contains(kinds, k) {
				kinds = append(kinds, k)
			}
		}
		if r := byGPU[g.Index]; r != nil {
			mig = r.MigEnabled
			for _, d := range r.Devices {
				if d.Count > 0 {
					addKind(d.Profile)
				}
			}
		} else {
			for _, in := range g.Instances {
				for _, c := range computeOf(in) {
					addKind(c)
				}
			}
		}
		if !mig {
			off = append(off, g.Index)
			continue
		}
		on = append(on, g.Index)
		switch {
		case len(kinds) == 0:
			return fmt.Errorf("%w: strategy single: GPU %d would have MIG enabled with no MIG device", ErrStrategy, g.Index)
		case len(kinds) > 1:
			return fmt.Errorf("%w: strategy single: GPU %d would hold %d profiles (%s); single needs one profile on every MIG GPU of the node",
				ErrStrategy, g.Index, len(kinds), strings.Join(kinds, ", "))
		case holder >= 0 && kinds[0] != held:
			return fmt.Errorf("%w: strategy single: GPU %d would hold %s and GPU %d %s; single needs the same profile on every MIG GPU of the node",
				ErrStrategy, holder, held, g.Index, kinds[0])
		}
		holder, held = g.Index, kinds[0]
	}
	if len(on) > 0 && len(off) > 0 {
		return fmt.Errorf("%w: strategy single: %s would have MIG enabled and %s not; single needs MIG on all MIG-capable GPUs of the node or on none",
			ErrStrategy, indexList(on), indexList(off))
	}
	return nil
}
