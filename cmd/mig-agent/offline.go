package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/viper"
	"sigs.k8s.io/yaml"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/internal/kclient/restclient"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
)

// openGPUs opens the GPU backend the settings name, with NVML initialized
// until Close (a command's lifetime).
func openGPUs(s *settings.Settings, log *slog.Logger) (nvmlx.GPU, error) {
	return openBackend(s, log, false)
}

// openBackend opens the GPU backend; idle (the daemon) defers opening NVML
// to each pass and closes it after, so an idle agent holds no NVML session.
func openBackend(s *settings.Settings, log *slog.Logger, idle bool) (nvmlx.GPU, error) {
	g, err := nvmlx.Open(nvmlx.Options{
		Backend: s.NVML, Library: s.NVMLLibrary, Logger: log, Idle: idle,
		Sim: nvmlsim.Options{StatePath: s.SimState, Faults: s.SimFaults, NoReset: s.SimNoReset},
	})
	if err != nil {
		if strings.HasPrefix(s.NVML, "sim:") || (s.NVML != "real") {
			return nil, badInput(err)
		}
		return nil, err
	}
	return g, nil
}

// withNode loads settings, opens the GPUs and discovers them.
func withNode(cmd *cobra.Command, fn func(s *settings.Settings, log *slog.Logger, g nvmlx.GPU, n *gpus.Inventory) error) error {
	s, err := loadSettings(cmd)
	if err != nil {
		return err
	}
	log := newLogger(s)
	g, err := openGPUs(s, log)
	if err != nil {
		return err
	}
	defer g.Close()
	n, err := gpus.Discover(g)
	if err != nil {
		return err
	}
	return fn(s, log, g, n)
}

func output(w io.Writer, format string, v any) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return badInput(fmt.Errorf("unknown output format %q", format))
}

func profilesCmd() *cobra.Command {
	var format string
	c := &cobra.Command{
		Use:   "profiles",
		Short: "List the MIG profiles of each GPU and the named configs generated from them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "yaml" && format != "json" {
				return badInput(fmt.Errorf("-o must be yaml or json"))
			}
			return withNode(cmd, func(_ *settings.Settings, _ *slog.Logger, _ nvmlx.GPU, n *gpus.Inventory) error {
				r, err := profilesReport(n)
				if err != nil {
					return err
				}
				return output(cmd.OutOrStdout(), format, r)
			})
		},
	}
	c.Flags().StringVarP(&format, "output", "o", "yaml", "yaml or json")
	return c
}

// configFlags adds -f and -c.
func configFlags(c *cobra.Command) {
	c.Flags().StringP("config-file", "f", "", "MIG config file (nvidia-mig-parted v1 format)")
	c.Flags().StringP("selected-config", "c", "", "config name (default the file's only config)")
}

// values reads a command's own flags the way every setting is read: flag >
// MIG_AGENT_* variable (or nvidia-mig-parted's, compat.go) > settings file >
// default.
type values struct{ v *viper.Viper }

func commandValues(cmd *cobra.Command) (values, error) {
	v, err := settingsViper(cmd, true)
	return values{v}, err
}

func (x values) str(k string) string { return x.v.GetString(k) }

func (x values) boolean(k string) (bool, error) {
	r := &reader{v: x.v}
	b := r.boolean(k)
	return b, r.err()
}

// selectedConfig is -c, or the file's only config when -c is not given
// (as nvidia-mig-parted selects it).
func selectedConfig(f *gpus.ConfigFile, name string) (string, error) {
	if name != "" {
		return name, nil
	}
	if f != nil && len(f.Spec.Names) == 1 {
		return f.Spec.Names[0], nil
	}
	return "", badInput(errors.New("-c/--selected-config is required"))
}

func loadFile(path string) (*gpus.ConfigFile, error) {
	f, err := gpus.LoadConfigFile(path)
	if err != nil {
		return nil, badInput(err)
	}
	return f, nil
}

// pickConfig loads the config file -f names and picks the config -c names
// (selectedConfig): the first half of the offline commands' opening.
func pickConfig(vals values) (*gpus.ConfigFile, string, error) {
	f, err := loadFile(vals.str("config-file"))
	if err != nil {
		return nil, "", err
	}
	name, err := selectedConfig(f, vals.str("selected-config"))
	if err != nil {
		return nil, "", err
	}
	return f, name, nil
}

// nodePlan is what an offline command works on: the settings, the GPUs
// and what discovery found on them, and the plan of config name of file.
type nodePlan struct {
	s    *settings.Settings
	log  *slog.Logger
	g    nvmlx.GPU
	node *gpus.Inventory
	file *gpus.ConfigFile
	name string
	plan *geometry.Plan
}

// withPlan opens and discovers the GPUs (withNode) and plans config name
// of f on them: the second half of the offline commands' opening.
func withPlan(cmd *cobra.Command, f *gpus.ConfigFile, name string, fn func(p *nodePlan) error) error {
	return withNode(cmd, func(s *settings.Settings, log *slog.Logger, g nvmlx.GPU, n *gpus.Inventory) error {
		plan, _, err := buildPlan(f, name, n)
		if err != nil {
			return err
		}
		return fn(&nodePlan{s: s, log: log, g: g, node: n, file: f, name: name, plan: plan})
	})
}

// warnConfig logs the plan's config warnings.
func (p *nodePlan) warnConfig() {
	for _, w := range p.plan.Warnings {
		p.log.Warn("config warning", "config", p.name, "warning", w)
	}
}

func validateCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "validate -f FILE [-c NAME]",
		Short: "Parse a config file strictly; with -c, check that the config fits this node's GPUs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vals, err := commandValues(cmd)
			if err != nil {
				return err
			}
			file, name := vals.str("config-file"), vals.str("selected-config")
			if file == "" {
				return badInput(errors.New("-f/--config-file is required"))
			}
			f, err := loadFile(file)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if name == "" {
				fmt.Fprintf(out, "%s: valid, %d configs: %s\n", file, len(f.Spec.Names), strings.Join(f.Spec.Names, ", "))
				return nil
			}
			return withPlan(cmd, f, name, func(p *nodePlan) error {
				for _, w := range p.plan.Warnings {
					p.log.Warn("config warning", "config", name, "warning", w)
					fmt.Fprintln(out, "warning:", w)
				}
				var indices []string
				for _, g := range p.plan.GPUs {
					indices = append(indices, fmt.Sprint(g.Index))
				}
				fmt.Fprintf(out, "%s: config %q fits this node (GPUs %s)\n", file, name, strings.Join(indices, ","))
				return nil
			})
		},
	}
	configFlags(c)
	return c
}

// buildPlan looks the config up (file, then generated) and plans it.
func buildPlan(f *gpus.ConfigFile, name string, n *gpus.Inventory) (*geometry.Plan, string, error) {
	spec, source, err := gpus.Lookup(f, name, n.GPUs)
	if err != nil {
		return nil, "", badInput(err)
	}
	plan, err := geometry.BuildPlan(spec, name, n.GPUs)
	if err != nil {
		return nil, "", badInput(err)
	}
	return plan, source, nil
}

func planCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "plan -f FILE -c NAME",
		Short: "Dry run: the steps apply would take on each GPU; changes nothing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vals, err := commandValues(cmd)
			if err != nil {
				return err
			}
			format, strategy := vals.str("output"), vals.str("strategy")
			if format != "text" && format != "json" {
				return badInput(errors.New("-o must be text or json"))
			}
			f, name, err := pickConfig(vals)
			if err != nil {
				return err
			}
			return withPlan(cmd, f, name, func(p *nodePlan) error {
				if err := checkStrategy(f, name, p.node, strategy); err != nil {
					return err
				}
				p.plan.Strategy = strategy
				p.warnConfig()
				if p.s.NodeName != "" {
					if err := previewEvictions(cmd.Context(), p); err != nil {
						return err
					}
				}
				if format == "json" {
					return output(cmd.OutOrStdout(), "json", p.plan)
				}
				return writePlanText(cmd.OutOrStdout(), p.plan)
			})
		},
	}
	configFlags(c)
	c.Flags().StringP("output", "o", "text", "text or json")
	c.Flags().String("strategy", "", "check the config against this MIG strategy (none, single, mixed), as the daemon does with the node label "+record.LabelStrategy)
	addFlags(c.Flags(), previewSettings())
	return c
}

// previewSettings are plan's flags for --node-name: the daemon's own
// settings (runSettings) that decide which pods a change evicts, so that
// loadSettings reads them for plan as it does for run.
func previewSettings() []setting {
	usage := map[string]string{
		"node-name":            "also list the pods each GPU's change would evict on this Node",
		"kubeconfig":           "kubeconfig for --node-name (default $KUBECONFIG, else in-cluster)",
		"pod-resources-socket": "kubelet PodResources API socket for --node-name",
		"gpu-client-selector":  "label selector of pods on the node that use the GPUs without requesting a GPU resource, listed with the pods a change evicts (as run --gpu-client-selector)",
	}
	var out []setting
	for _, st := range runSettings {
		if u, ok := usage[st.name]; ok {
			st.usage = u
			out = append(out, st)
		}
	}
	return out
}

// previewEvictions fills the plan with the pods each GPU's change would
// evict on Node p.s.NodeName, found by the daemon's Disruptor
// (newDisruptor) from the same settings.
func previewEvictions(ctx context.Context, p *nodePlan) error {
	kubeconfig := p.s.Kubeconfig
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	cfg, err := kubeConfig(kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes client config: %w", err)
	}
	client, err := restclient.New(cfg)
	if err != nil {
		return err
	}
	how, err := gpus.PreviewEvictions(ctx, newDisruptor(client, p.log, p.s, nil), p.node, p.plan)
	if err != nil {
		return fmt.Errorf("listing the pods the change would evict: %w", err)
	}
	if how != "" {
		p.log.Info("pods found", "how", how)
	}
	return nil
}

// checkStrategy checks config name against a MIG strategy ("" checks
// nothing), as the daemon checks it against the node's label.
func checkStrategy(f *gpus.ConfigFile, name string, n *gpus.Inventory, strategy string) error {
	if strategy == "" {
		return nil
	}
	spec, _, err := gpus.Lookup(f, name, n.GPUs)
	if err != nil {
		return badInput(err)
	}
	reqs, _, err := spec.Resolve(name, n.GPUs)
	if err != nil {
		return badInput(err)
	}
	if err := geometry.CheckStrategy(strategy, n.GPUs, reqs); err != nil {
		return badInput(fmt.Errorf("config %q under MIG strategy %q: %w", name, strategy, err))
	}
	return nil
}

func applyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "apply -f FILE -c NAME",
		Short: "Apply a config on this host now (no Kubernetes); exit 3 when a reboot is needed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vals, err := commandValues(cmd)
			if err != nil {
				return err
			}
			skipReset, err := vals.boolean("skip-reset")
			if err != nil {
				return err
			}
			modeOnly, err := vals.boolean("mode-only")
			if err != nil {
				return err
			}
			f, name, err := pickConfig(vals)
			if err != nil {
				return err
			}
			hooks, err := gpus.LoadHooks(vals.str("hooks-file"))
			if err != nil {
				return badInput(err)
			}
			env := gpus.HookEnv{ConfigFile: vals.str("config-file"), SelectedConfig: name, HooksFile: vals.str("hooks-file"), SkipReset: skipReset, ModeOnly: modeOnly}
			return withPlan(cmd, f, name, func(p *nodePlan) error {
				return applyPlan(cmd, p, hooks, env)
			})
		},
	}
	configFlags(c)
	c.Flags().StringP("hooks-file", "k", "", "nvidia-mig-parted hooks file (apply-start, pre-apply-mode, pre-apply-config, apply-exit)")
	c.Flags().BoolP("skip-reset", "s", false, "never reset a GPU: a MIG mode change that needs a reset then needs a reboot (exit 3)")
	c.Flags().BoolP("mode-only", "m", false, "apply only the MIG mode of the config, no MIG devices")
	return c
}

// applyPlan applies the plan between the hooks and prints what changed.
func applyPlan(cmd *cobra.Command, p *nodePlan, hooks gpus.Hooks, env gpus.HookEnv) error {
	o := gpus.ApplyOptions{NoReset: env.SkipReset, Step: func(gpu int, what string) error {
		p.log.Info("applying", "gpu", gpu, "step", what)
		return nil
	}}
	a := gpus.NewPlanApplier(p.g, p.file, p.name, o, p.node, p.plan)
	if err := gpus.ApplyWithHooks(cmd.Context(), p.log, hooks, env, env.ModeOnly, a); err != nil {
		return err
	}
	res := a.Result
	fmt.Fprintf(cmd.OutOrStdout(), "applied %q: GPUs changed %v, untouched %v\n", p.name, res.Changed, res.Untouched)
	// GPUs NVML cannot open were left alone: a config that names them is
	// not applied, whatever the others hold.
	if spec, _, err := gpus.Lookup(p.file, p.name, p.node.GPUs); err == nil {
		if named := gpus.UnusableNamed(spec, p.name, p.node.Unusable); len(named) > 0 {
			return gpus.UnusableError(p.name, named)
		}
	}
	return nil
}

// errNotApplied is assert's failure (exit 1).
var errNotApplied = errors.New("assertion failure: selected configuration not currently applied")

func assertCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "assert -f FILE -c NAME",
		Short: "Exit 0 when the GPUs already hold the config, 1 when they do not or on any error (as nvidia-mig-parted assert)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vals, err := commandValues(cmd)
			if err != nil {
				return err
			}
			modeOnly, err := vals.boolean("mode-only")
			if err != nil {
				return err
			}
			validOnly, err := vals.boolean("valid-config")
			if err != nil {
				return err
			}
			f, name, err := pickConfig(vals)
			if err != nil {
				return err
			}
			if validOnly {
				// nvidia-mig-parted assert --valid-config: the file parses
				// and has the selected config; the GPUs are not read.
				if f == nil {
					return badInput(errors.New("--valid-config needs -f/--config-file"))
				}
				if _, ok := f.Spec.Configs[name]; !ok {
					return fmt.Errorf("%w: %q is not in %s", geometry.ErrUnknownConfig, name, f.Path)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "config %q of %s is valid\n", name, f.Path)
				return nil
			}
			return withPlan(cmd, f, name, func(p *nodePlan) error {
				var differ []string
				for _, g := range p.plan.GPUs {
					if g.ModeChange != geometry.ModeNone || !modeOnly && g.Action != geometry.ActionUntouched {
						differ = append(differ, fmt.Sprint(g.Index))
						p.log.Debug("GPU does not hold the config", "gpu", g.Index, "modeChange", g.ModeChange,
							"destroy", len(g.Destroy), "create", len(g.Create), "destroyCompute", len(g.DestroyCompute), "createCompute", len(g.CreateCompute))
					}
				}
				if len(differ) > 0 {
					return fmt.Errorf("%w: config %q, GPUs %s differ", errNotApplied, name, strings.Join(differ, ","))
				}
				if modeOnly {
					fmt.Fprintf(cmd.OutOrStdout(), "the MIG mode of config %q is applied\n", name)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "config %q is applied\n", name)
				}
				return nil
			})
		},
	}
	configFlags(c)
	c.Flags().BoolP("mode-only", "m", false, "check only the MIG mode of the config")
	c.Flags().BoolP("valid-config", "a", false, "check only that the config file is valid and holds the selected config (the GPUs are not read)")
	return c
}

func exportCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "export",
		Short: "Print the current geometry as a config file that apply reproduces (-c current, or --config-name)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vals, err := commandValues(cmd)
			if err != nil {
				return err
			}
			format, name := vals.str("output"), vals.str("config-name")
			if name == "" || strings.ContainsAny(name, " \t\n:") {
				return badInput(fmt.Errorf("--config-name %q: want a config name", name))
			}
			return withNode(cmd, func(_ *settings.Settings, _ *slog.Logger, _ nvmlx.GPU, n *gpus.Inventory) error {
				spec := n.Export(name)
				switch format {
				case "yaml":
					b, err := spec.Marshal()
					if err != nil {
						return err
					}
					_, err = cmd.OutOrStdout().Write(b)
					return err
				case "json":
					b, err := spec.Marshal()
					if err != nil {
						return err
					}
					j, err := yaml.YAMLToJSON(b)
					if err != nil {
						return err
					}
					_, err = fmt.Fprintln(cmd.OutOrStdout(), string(j))
					return err
				}
				return badInput(errors.New("-o must be yaml or json"))
			})
		},
	}
	c.Flags().StringP("output", "o", "yaml", "yaml or json (also --output-format, nvidia-mig-parted's name)")
	c.Flags().StringP("config-name", "l", gpus.ExportName, "name of the config written (also --config-label, nvidia-mig-parted's name)")
	c.Flags().SetNormalizeFunc(migPartedFlagNames)
	return c
}

func simCmd() *cobra.Command {
	sim := &cobra.Command{Use: "sim", Short: "Simulated-GPU tools"}
	reboot := &cobra.Command{
		Use:   "reboot --sim-state PATH",
		Short: "Simulate a node reboot: pending MIG modes take effect, all instances are gone",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := loadSettings(cmd)
			if err != nil {
				return err
			}
			if s.SimState == "" {
				return badInput(errors.New("--sim-state is required"))
			}
			if err := nvmlsim.Reboot(s.SimState); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "simulated reboot of", s.SimState)
			return nil
		},
	}
	sim.AddCommand(reboot)
	return sim
}
