package gpus

import (
	"errors"
	"fmt"
	"strings"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/nvmlx"
)

// Applied is the outcome of ApplyAndVerify.
type Applied struct {
	Changed, Untouched []int
	RebootGPUs         []int
	Reset              []int
	// NoReset says why each GPU of RebootGPUs was not reset (ApplyResult).
	NoReset map[int]string
	// After is the GPUs as read back after the apply.
	After *Inventory
}

// ApplyAndVerify applies a plan, reads the GPUs back and checks that a
// fresh plan of the same config has nothing left to do (except on GPUs
// that wait for a reboot). The error wraps ErrRebootRequired when a mode
// change waits for a reboot.
func ApplyAndVerify(g nvmlx.GPU, n *Inventory, plan *geometry.Plan, f *ConfigFile, name string, o ApplyOptions) (*Applied, error) {
	out := &Applied{}
	for _, gp := range plan.GPUs {
		if gp.Action == geometry.ActionChange {
			out.Changed = append(out.Changed, gp.Index)
		} else {
			out.Untouched = append(out.Untouched, gp.Index)
		}
	}
	res, applyErr := ApplyPlan(g, n, plan, o)
	out.RebootGPUs, out.Reset, out.NoReset = res.RebootGPUs, res.Reset, res.NoReset
	if applyErr != nil && !errors.Is(applyErr, ErrRebootRequired) {
		return out, applyErr
	}
	after, err := Discover(g)
	if err != nil {
		return out, fmt.Errorf("reading back after apply: %w", err)
	}
	out.After = after
	spec, _, err := Lookup(f, name, after.GPUs)
	if err != nil {
		return out, err
	}
	again, err := geometry.BuildPlan(spec, name, after.GPUs)
	if err != nil {
		return out, fmt.Errorf("re-planning after apply: %w", err)
	}
	var left []string
	for _, gp := range again.GPUs {
		if gp.Action == geometry.ActionChange && !contains(res.RebootGPUs, gp.Index) {
			left = append(left, fmt.Sprintf("GPU %d (%d to destroy, %d to create, %d compute instances to destroy, %d to create, mode %s)",
				gp.Index, len(gp.Destroy), len(gp.Create), len(gp.DestroyCompute), len(gp.CreateCompute), gp.ModeChange))
		}
	}
	if len(left) > 0 {
		return out, fmt.Errorf("read back after apply does not match config %q: %s", name, strings.Join(left, "; "))
	}
	return out, applyErr
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
