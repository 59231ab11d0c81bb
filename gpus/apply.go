package gpus

import (
	"errors"
	"fmt"
	"strings"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/profiles"
)

// ErrRebootRequired: a MIG mode change is still pending after a GPU reset
// was tried or is impossible; only a reboot makes it take effect.
var ErrRebootRequired = errors.New("a reboot is required for the MIG mode change to take effect")

// partialError says a GPU was left partly changed, and how far it got.
type partialError struct {
	GPU                int
	Step               string
	Destroyed, Created int
	ToDestroy          int
	ToCreate           int
	Err                error
}

func (e *partialError) Error() string {
	return fmt.Sprintf("GPU %d: %s: %v (GPU %d left partly applied: destroyed %d of %d, created %d of %d; the next attempt re-plans from what is there)",
		e.GPU, e.Step, e.Err, e.GPU, e.Destroyed, e.ToDestroy, e.Created, e.ToCreate)
}

func (e *partialError) Unwrap() error { return e.Err }

// ApplyOptions tunes ApplyPlan.
type ApplyOptions struct {
	// NoReset forbids GPU resets (a pending mode change then needs a reboot).
	NoReset bool
	// Step is called before each NVML mutation with a description, so the
	// journal and the progress status can follow; an error stops the apply.
	Step func(gpu int, what string) error
}

// ApplyResult says what ApplyPlan did.
type ApplyResult struct {
	// RebootGPUs lists the GPUs whose MIG mode change is still pending.
	RebootGPUs []int
	// Reset lists the GPUs that were reset.
	Reset []int
	// NoReset says, for each GPU of RebootGPUs, why no GPU reset applied
	// its mode change.
	NoReset map[int]string
}

// NoResetReason says why the GPUs of RebootGPUs were not reset, for the
// record, the log and the error: "GPU 0: reset disabled; GPU 2: …".
func NoResetReason(gpus []int, why map[int]string) string {
	parts := make([]string, 0, len(gpus))
	for _, i := range gpus {
		parts = append(parts, fmt.Sprintf("GPU %d: %s", i, why[i]))
	}
	return strings.Join(parts, "; ")
}

// ApplyPlan executes a plan on the GPUs, GPU by GPU in index order:
// destroy what goes (compute instances before their GPU instance), change
// the MIG mode (resetting only the GPUs that need it), create what comes at
// the planned placements. It stops at the first failure. A GPU whose mode
// change stays pending is reported in RebootGPUs (its creates wait for the
// reboot) and the error wraps ErrRebootRequired.
func ApplyPlan(g nvmlx.GPU, node *Inventory, plan *geometry.Plan, o ApplyOptions) (ApplyResult, error) {
	var res ApplyResult
	step := o.Step
	if step == nil {
		step = func(int, string) error { return nil }
	}
	for _, gp := range plan.GPUs {
		if gp.Action != geometry.ActionChange {
			continue
		}
		dev, insts, ok := node.Device(gp.Index)
		if !ok {
			return res, fmt.Errorf("GPU %d is in the plan but not on the node", gp.Index)
		}
		a := &gpuApply{g: g, step: step, noReset: o.NoReset, res: &res, gp: gp, dev: dev, insts: insts,
			pe: &partialError{GPU: gp.Index, ToDestroy: len(gp.Destroy) + len(gp.DestroyCompute), ToCreate: len(gp.Create) + len(gp.CreateCompute)}}
		if err := a.run(); err != nil {
			return res, err
		}
	}
	if len(res.RebootGPUs) > 0 {
		return res, fmt.Errorf("GPUs %v (no reset: %s): %w", res.RebootGPUs, NoResetReason(res.RebootGPUs, res.NoReset), ErrRebootRequired)
	}
	return res, nil
}

// gpuApply is ApplyPlan on one GPU: its plan, what discovery found on it,
// and how far it got (pe, the error of a GPU left partly changed). An error
// of step stops the apply as it is; an NVML failure returns pe.
type gpuApply struct {
	g       nvmlx.GPU
	step    func(gpu int, what string) error
	noReset bool
	res     *ApplyResult
	gp      geometry.GPUPlan
	dev     *nvmlx.Device
	insts   []nvmlx.GPUInstance
	pe      *partialError
}

// run destroys, changes the MIG mode and, where MIG is on and no reboot is
// pending, creates.
func (a *gpuApply) run() error {
	if err := a.destroy(); err != nil {
		return err
	}
	pending, err := a.setMode()
	if err != nil || pending || !a.gp.MigEnabled {
		return err
	}
	return a.create()
}

// fail records the step that failed in the partial error.
func (a *gpuApply) fail(what string, err error) error {
	a.pe.Step, a.pe.Err = what, err
	return a.pe
}

// destroy destroys the compute instances that go from GPU instances that
// stay, then the GPU instances that go with their compute instances.
func (a *gpuApply) destroy() error {
	g, gpu := a.g, a.gp.Index
	for _, d := range doomedCompute(a.insts, a.gp) {
		what := fmt.Sprintf("destroying compute instance %s in %s@%d", d.CI.Profile, d.GI.Profile, d.GI.Placement.Start)
		if err := a.step(gpu, what); err != nil {
			return err
		}
		if err := g.DestroyComputeInstance(gpu, d.GI.ID, d.CI.ID); err != nil && !errors.Is(err, nvmlx.ErrNotFound) {
			return a.fail(what, err)
		}
		a.pe.Destroyed++
	}
	for _, in := range a.gp.Destroy {
		gi, ok := findGI(a.insts, in.ProfileID, in.Start)
		if !ok {
			continue // already gone: a resumed apply
		}
		what := fmt.Sprintf("destroying %s@%d", in.Profile, in.Start)
		if err := a.step(gpu, what); err != nil {
			return err
		}
		for _, ci := range gi.ComputeInstances {
			if err := g.DestroyComputeInstance(gpu, gi.ID, ci.ID); err != nil && !errors.Is(err, nvmlx.ErrNotFound) {
				return a.fail(what, err)
			}
		}
		if err := g.DestroyGPUInstance(gpu, gi.ID); err != nil && !errors.Is(err, nvmlx.ErrNotFound) {
			return a.fail(what, err)
		}
		a.pe.Destroyed++
	}
	return nil
}

// setMode changes the MIG mode where the plan does and, where the change
// is pending, resets the GPU if it may. pending: the change still waits
// for a reboot (recorded in the result).
func (a *gpuApply) setMode() (pending bool, err error) {
	enabled := a.gp.MigEnabled
	mode := nvmlx.MigMode{Current: a.dev.MigMode.Current, Pending: a.dev.MigMode.Pending}
	if a.gp.ModeChange != geometry.ModeNone {
		what := "enabling MIG mode"
		if !enabled {
			what = "disabling MIG mode"
		}
		if err := a.step(a.gp.Index, what); err != nil {
			return false, err
		}
		m, err := a.g.SetMigMode(a.gp.Index, enabled)
		if err != nil && !errors.Is(err, nvmlx.ErrResetRequired) {
			return false, a.fail(what, err)
		}
		mode = m
	}
	if mode.Current == enabled {
		return false, nil
	}
	if mode.Pending != enabled {
		return false, a.fail("changing MIG mode", fmt.Errorf("MIG mode reads back current=%v pending=%v after asking for %v", mode.Current, mode.Pending, enabled))
	}
	mode, why, err := a.reset(mode)
	if err != nil || mode.Current == enabled {
		return false, err
	}
	if why == "" {
		why = "MIG mode still pending after the GPU reset"
	}
	if a.res.NoReset == nil {
		a.res.NoReset = map[int]string{}
	}
	a.res.NoReset[a.gp.Index] = why
	a.res.RebootGPUs = append(a.res.RebootGPUs, a.gp.Index)
	return true, nil
}

// reset resets the GPU for its pending mode change where it can and may,
// and returns the mode after it and why the mode may still be pending (no
// reset, or the reset's error).
func (a *gpuApply) reset(mode nvmlx.MigMode) (nvmlx.MigMode, string, error) {
	canReset, why := a.g.CanReset(a.gp.Index)
	if a.noReset {
		return mode, "GPU reset disabled", nil
	}
	if !canReset {
		return mode, why, nil
	}
	if err := a.step(a.gp.Index, "resetting the GPU"); err != nil {
		return mode, "", err
	}
	if err := a.g.ResetGPU(a.gp.Index); errors.Is(err, nvmlx.ErrNVMLNotBack) {
		// The reset may have worked: nothing to judge (and no reboot to
		// ask for) until NVML answers again.
		return mode, "", a.fail("resetting the GPU", err)
	} else if err != nil {
		return mode, err.Error(), nil
	}
	a.res.Reset = append(a.res.Reset, a.gp.Index)
	mode, err := readMode(a.g, a.gp.Index)
	if err != nil {
		return mode, "", a.fail("reading MIG mode after reset", err)
	}
	return mode, why, nil
}

// create creates the GPU instances that come at their planned placements,
// then the compute instances that come into GPU instances that stay.
func (a *gpuApply) create() error {
	gpu := a.gp.Index
	for _, in := range a.gp.Create {
		what := fmt.Sprintf("creating %s@%d", in.Name(), in.Start)
		if err := a.step(gpu, what); err != nil {
			return err
		}
		if err := createInstance(a.g, gpu, &a.dev.Catalogue, in); err != nil {
			return a.fail(what, err)
		}
		a.pe.Created++
	}
	for _, c := range a.gp.CreateCompute {
		what := fmt.Sprintf("creating compute instance %s in %s@%d", c.Compute, c.Profile, c.Start)
		if err := a.step(gpu, what); err != nil {
			return err
		}
		gi, ok := findGI(a.insts, c.ProfileID, c.Start)
		if !ok {
			return a.fail(what, fmt.Errorf("GPU instance %s@%d is gone", c.Profile, c.Start))
		}
		cp, err := computeProfile(&a.dev.Catalogue, c.ProfileID, c.Compute, gpu)
		if err != nil {
			return a.fail(what, err)
		}
		if _, err := a.g.CreateComputeInstance(gpu, gi.ID, cp.Index); err != nil {
			return a.fail(what, err)
		}
		a.pe.Created++
	}
	return nil
}

// doomed is a compute instance a plan destroys inside a GPU instance it keeps.
type doomed struct {
	GI nvmlx.GPUInstance
	CI nvmlx.ComputeInstance
}

// doomedCompute lists the compute instances gp destroys inside the GPU
// instances it keeps: of each profile it names there, the compute
// instances with the highest ids (the newest). ApplyPlan destroys exactly
// these, and the pods on them are the ones evicted.
func doomedCompute(insts []nvmlx.GPUInstance, gp geometry.GPUPlan) []doomed {
	var out []doomed
	taken := map[[2]int]bool{}
	for _, c := range gp.DestroyCompute {
		gi, ok := findGI(insts, c.ProfileID, c.Start)
		if !ok {
			continue
		}
		want, err := profiles.Parse(c.Compute)
		if err != nil {
			continue
		}
		best := -1
		for i, ci := range gi.ComputeInstances {
			n, err := profiles.Parse(ci.Profile)
			if err != nil || !n.Equal(want) || taken[[2]int{gi.ID, ci.ID}] {
				continue
			}
			if best < 0 || ci.ID > gi.ComputeInstances[best].ID {
				best = i
			}
		}
		if best >= 0 {
			ci := gi.ComputeInstances[best]
			taken[[2]int{gi.ID, ci.ID}] = true
			out = append(out, doomed{GI: gi, CI: ci})
		}
	}
	return out
}

// computeProfile finds compute profile name inside the GPU instance
// profile with id giProfileID.
func computeProfile(cat *profiles.Catalogue, giProfileID int, name string, gpu int) (*profiles.ComputeProfile, error) {
	p, ok := cat.ByID(giProfileID)
	if !ok {
		return nil, fmt.Errorf("profile id %d not offered by GPU %d", giProfileID, gpu)
	}
	n, err := profiles.Parse(name)
	if err != nil {
		return nil, err
	}
	cp, ok := p.Compute(n)
	if !ok {
		return nil, fmt.Errorf("compute profile %s not offered inside %s on GPU %d", name, p.Name, gpu)
	}
	return cp, nil
}

// createInstance creates a GPU instance at its planned placement and the
// compute instances it holds, largest first (the order nvidia-mig-parted
// creates them in).
func createInstance(g nvmlx.GPU, gpu int, cat *profiles.Catalogue, in geometry.Instance) error {
	p, ok := cat.ByID(in.ProfileID)
	if !ok {
		return fmt.Errorf("profile id %d (%s) not offered by GPU %d", in.ProfileID, in.Profile, gpu)
	}
	cis := in.Compute
	if cis == nil {
		cis = []string{in.Profile}
	}
	var cps []*profiles.ComputeProfile
	for _, name := range cis {
		cp, err := computeProfile(cat, p.ID, name, gpu)
		if err != nil {
			return err
		}
		cps = append(cps, cp)
	}
	giID, err := g.CreateGPUInstance(gpu, p.ID, placementOf(cat, in))
	if err != nil {
		return err
	}
	for _, cp := range cps {
		if _, err := g.CreateComputeInstance(gpu, giID, cp.Index); err != nil {
			// Leave no GPU instance without its compute instances: undo it
			// (best effort; a leftover is destroyed by the next plan).
			if insts, lerr := g.Instances(gpu); lerr == nil {
				for _, gi := range insts {
					if gi.ID == giID {
						for _, ci := range gi.ComputeInstances {
							_ = g.DestroyComputeInstance(gpu, giID, ci.ID)
						}
					}
				}
			}
			_ = g.DestroyGPUInstance(gpu, giID)
			return err
		}
	}
	return nil
}

// readMode reads the MIG mode of GPU gpu afresh.
func readMode(g nvmlx.GPU, gpu int) (nvmlx.MigMode, error) {
	devs, _, err := nvmlx.SplitUnusable(g.Devices())
	if err != nil {
		return nvmlx.MigMode{}, err
	}
	for _, d := range devs {
		if d.Index == gpu {
			return d.MigMode, nil
		}
	}
	return nvmlx.MigMode{}, fmt.Errorf("GPU %d vanished", gpu)
}
