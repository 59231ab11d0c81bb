package gpus

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/migagent/mig-agent/internal/boundcmd"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/nvmlx"
)

// Hook points of an nvidia-mig-parted hooks file
// (cmd/nvidia-mig-parted/apply/hooks.go), in the order ApplyWithHooks
// runs them.
const (
	HookApplyStart     = "apply-start"
	HookPreApplyMode   = "pre-apply-mode"
	HookPreApplyConfig = "pre-apply-config"
	HookApplyExit      = "apply-exit"
)

// HookSpec is one command of a hook point (api/hooks/v1/hooks.go HookSpec).
type HookSpec struct {
	Command string            `json:"command"`
	Args    []string          `json:"args,omitempty"`
	Envs    map[string]string `json:"envs,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
}

// Hooks is a parsed hooks file: the commands of each hook point, run in
// file order.
type Hooks map[string][]HookSpec

// maxHookOutput bounds the output of a failing hook kept in its error.
const maxHookOutput = 4 << 10

// LoadHooks reads an nvidia-mig-parted hooks file (version v1, a hooks map
// of hook point to a list of command, args, envs, workdir). Empty path:
// no hooks. Stricter than mig-parted, which ignores what it does not
// know: unknown keys and hook points are errors (a misspelt hook point
// would never run).
func LoadHooks(path string) (Hooks, error) {
	if path == "" {
		return nil, nil
	}
	data, err := ReadUserFile(path, MaxUserFile)
	if err != nil {
		return nil, fmt.Errorf("hooks file: %w", err)
	}
	var spec struct {
		Version string `json:"version"`
		Hooks   Hooks  `json:"hooks"`
	}
	if err := yaml.UnmarshalStrict(data, &spec); err != nil {
		return nil, fmt.Errorf("hooks file %s: %w", path, err)
	}
	if spec.Version != "v1" {
		return nil, fmt.Errorf("hooks file %s: version %q, want v1", path, spec.Version)
	}
	known := []string{HookApplyStart, HookPreApplyMode, HookPreApplyConfig, HookApplyExit}
	for name, list := range spec.Hooks {
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("hooks file %s: unknown hook point %q (known: %s)", path, name, strings.Join(known, ", "))
		}
		for i, h := range list {
			if h.Command == "" {
				return nil, fmt.Errorf("hooks file %s: %s hook %d has no command", path, name, i+1)
			}
		}
	}
	if spec.Hooks == nil {
		spec.Hooks = Hooks{}
	}
	return spec.Hooks, nil
}

// HookEnv is what mig-parted hands every hook: the value of each apply
// flag that has an environment variable, under that variable
// (GetHooksEnvsMap in cmd/nvidia-mig-parted/apply/apply.go).
type HookEnv struct {
	ConfigFile, SelectedConfig, HooksFile string
	SkipReset, ModeOnly                   bool
	// Timeout bounds each hook command (--command-timeout; 0:
	// boundcmd.DefaultTimeout); it is no variable of the hook's.
	Timeout time.Duration
}

// Vars is the environment of a hook as mig-parted builds it.
func (e HookEnv) Vars() map[string]string {
	return map[string]string{
		"MIG_PARTED_CONFIG_FILE":      e.ConfigFile,
		"MIG_PARTED_SELECTED_CONFIG":  e.SelectedConfig,
		"MIG_PARTED_HOOKS_FILE":       e.HooksFile,
		"MIG_PARTED_SKIP_RESET":       fmt.Sprint(e.SkipReset),
		"MIG_PARTED_MODE_CHANGE_ONLY": fmt.Sprint(e.ModeOnly),
	}
}

// Run runs the commands of hook point name in order, stopping at the first
// that fails. As mig-parted's HookSpec.Run does, each command's whole
// environment is its envs with env's variables over them (nothing else
// is inherited), in its workdir. Output goes to the log; a failure's
// error carries the end of it.
func (h Hooks) Run(ctx context.Context, log *slog.Logger, name string, env HookEnv) error {
	for i, spec := range h[name] {
		vars := map[string]string{}
		for k, v := range spec.Envs {
			vars[k] = v
		}
		for k, v := range env.Vars() {
			vars[k] = v
		}
		list := make([]string, 0, len(vars))
		for k, v := range vars {
			list = append(list, k+"="+v)
		}
		sort.Strings(list)
		cmd := exec.Command(spec.Command, spec.Args...) //nolint:gosec // the operator's hooks file
		cmd.Env, cmd.Dir = list, spec.Workdir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := boundcmd.Run(ctx, env.Timeout, cmd)
		log.Info("hook ran", "hook", name, "index", i+1, "command", spec.Command, "err", err, "output", tail(out.String(), maxHookOutput))
		if err != nil {
			return fmt.Errorf("%s hook %d (%s): %w: output: %s", name, i+1, spec.Command, err, strings.TrimSpace(tail(out.String(), maxHookOutput)))
		}
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// Applier is what ApplyWithHooks drives, mig-parted's MigConfigApplier
// (cmd/nvidia-mig-parted/apply/apply.go).
type Applier interface {
	ModeApplied() (bool, error)
	ApplyMode() error
	ConfigApplied() (bool, error)
	ApplyConfig() error
}

// ApplyWithHooks runs a change between the hooks the way mig-parted's
// ApplyMigConfigWithHooks does: apply-start (its failure fails the change
// before anything else runs); then, when the MIG mode is not applied,
// pre-apply-mode and the mode change; unless modeOnly, when the MIG
// devices are not applied, pre-apply-config and their change; apply-exit
// always at the end once apply-start passed (its failure fails the change
// only when nothing failed before; else it is logged).
func ApplyWithHooks(ctx context.Context, log *slog.Logger, h Hooks, env HookEnv, modeOnly bool, a Applier) (err error) {
	if err := h.Run(ctx, log, HookApplyStart, env); err != nil {
		return fmt.Errorf("running apply-start hook: %w", err)
	}
	defer func() {
		exitErr := h.Run(ctx, log, HookApplyExit, env)
		switch {
		case exitErr != nil && err == nil:
			err = fmt.Errorf("running apply-exit hook: %w", exitErr)
		case exitErr != nil:
			log.Error("apply-exit hook failed", "err", exitErr)
		}
	}()
	ok, err := a.ModeApplied()
	if err != nil {
		return err
	}
	if !ok {
		if err := h.Run(ctx, log, HookPreApplyMode, env); err != nil {
			return fmt.Errorf("running pre-apply-mode hook: %w", err)
		}
		if err := a.ApplyMode(); err != nil {
			return err
		}
	}
	if modeOnly {
		return nil
	}
	if ok, err = a.ConfigApplied(); err != nil {
		return err
	}
	if !ok {
		if err := h.Run(ctx, log, HookPreApplyConfig, env); err != nil {
			return fmt.Errorf("running pre-apply-config hook: %w", err)
		}
		return a.ApplyConfig()
	}
	return nil
}

// PlanApplier applies a config in the two steps of ApplyWithHooks: the
// MIG mode first (with what a mode change destroys), then the MIG devices,
// re-planned from what the GPUs hold after the first. Result says what it
// did, as ApplyAndVerify does.
type PlanApplier struct {
	GPU     nvmlx.GPU
	File    *ConfigFile
	Name    string
	Options ApplyOptions
	GPUs    *Inventory // as read before the change
	Plan    *geometry.Plan
	Result  Applied
}

var _ Applier = (*PlanApplier)(nil)

// NewPlanApplier starts from a plan of name on gpus.
func NewPlanApplier(g nvmlx.GPU, f *ConfigFile, name string, o ApplyOptions, gpus *Inventory, plan *geometry.Plan) *PlanApplier {
	a := &PlanApplier{GPU: g, File: f, Name: name, Options: o, GPUs: gpus, Plan: plan}
	a.Result.Changed, a.Result.Untouched = Indices(plan)
	a.Result.After = gpus
	return a
}

func (a *PlanApplier) refresh() error {
	n, err := Discover(a.GPU)
	if err != nil {
		return fmt.Errorf("reading the GPUs: %w", err)
	}
	spec, _, err := Lookup(a.File, a.Name, n.GPUs)
	if err != nil {
		return err
	}
	p, err := geometry.BuildPlan(spec, a.Name, n.GPUs)
	if err != nil {
		return fmt.Errorf("re-planning: %w", err)
	}
	a.GPUs, a.Plan, a.Result.After = n, p, n
	return nil
}

// ModeApplied implements Applier.
func (a *PlanApplier) ModeApplied() (bool, error) { return !ModeChanges(a.Plan), nil }

// ApplyMode implements Applier: only the GPUs whose mode changes, only
// what the mode change itself destroys.
func (a *PlanApplier) ApplyMode() error {
	p := *a.Plan
	p.GPUs = nil
	for _, gp := range a.Plan.GPUs {
		if gp.ModeChange == geometry.ModeNone {
			gp.Action = geometry.ActionUntouched
		}
		gp.Create, gp.CreateCompute, gp.DestroyCompute = nil, nil, nil
		p.GPUs = append(p.GPUs, gp)
	}
	res, err := ApplyPlan(a.GPU, a.GPUs, &p, a.Options)
	a.Result.RebootGPUs = append(a.Result.RebootGPUs, res.RebootGPUs...)
	a.Result.Reset = append(a.Result.Reset, res.Reset...)
	if err != nil {
		return err
	}
	return a.refresh()
}

// ConfigApplied implements Applier.
func (a *PlanApplier) ConfigApplied() (bool, error) { return !PlanChanges(a.Plan), nil }

// ApplyConfig implements Applier.
func (a *PlanApplier) ApplyConfig() error {
	res, err := ApplyAndVerify(a.GPU, a.GPUs, a.Plan, a.File, a.Name, a.Options)
	a.Result.RebootGPUs = append(a.Result.RebootGPUs, res.RebootGPUs...)
	a.Result.Reset = append(a.Result.Reset, res.Reset...)
	if res.After != nil {
		a.Result.After = res.After
	}
	return err
}
