package main

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/internal/boundcmd"
	"github.com/migagent/mig-agent/settings"
)

// A setting is declared once, here: its flag (name, shorthand, default,
// usage) and the field of settings.Settings it fills. The same name is
// its settings-file key and, upper-cased with _ for -, its MIG_AGENT_*
// variable; flag > environment > file > default (settingsViper).
type setting struct {
	name, short string
	def         any // string, bool, int, time.Duration or []string
	usage       string
	field       func(s *settings.Settings) any // a pointer to the field
}

// globalSettings are the flags every command shares.
var globalSettings = []setting{
	{"nvml", "", "real", "GPU backend: real, or sim:SPEC (e.g. sim:h200x8)", func(s *settings.Settings) any { return &s.NVML }},
	{"nvml-library", "", "", "path of libnvidia-ml.so.1 or of a driver root holding it", func(s *settings.Settings) any { return &s.NVMLLibrary }},
	{"sim-state", "", "", "simulated GPU state file (with --nvml sim:SPEC)", func(s *settings.Settings) any { return &s.SimState }},
	{"sim-faults", "", "", "inject NVML failures: Op:N=ERROR_NAME,...", func(s *settings.Settings) any { return &s.SimFaults }},
	{"sim-no-reset", "", false, "simulate GPUs that cannot be reset", func(s *settings.Settings) any { return &s.SimNoReset }},
	{"log-level", "", "info", "debug, info, warn or error", func(s *settings.Settings) any { return &s.LogLevel }},
	{"log-format", "", "text", "text or json", func(s *settings.Settings) any { return &s.LogFormat }},
}

// podResourcesSocket is where the kubelet serves its PodResources API.
const podResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// runSettings are the daemon's flags (`mig-agent run`).
var runSettings = []setting{
	{"standalone", "", false, "no Kubernetes: apply -c NAME from -f FILE and hold it", func(s *settings.Settings) any { return &s.Standalone }},
	{"config-file", "f", "", "MIG config file (nvidia-mig-parted v1 format)", func(s *settings.Settings) any { return &s.ConfigFile }},
	{"selected-config", "c", "", "config name (standalone mode)", func(s *settings.Settings) any { return &s.SelectedConfig }},
	{"hooks-file", "k", "", "nvidia-mig-parted hooks file run around each change (standalone mode)", func(s *settings.Settings) any { return &s.HooksFile }},
	{"node-name", "", "", "this node's name (default $NODE_NAME)", func(s *settings.Settings) any { return &s.NodeName }},
	{"kubeconfig", "", "", "kubeconfig file (default in-cluster config)", func(s *settings.Settings) any { return &s.Kubeconfig }},
	{"namespace", "", "", "namespace of the ConfigMap and Leases (default the pod's own, else mig-agent)", func(s *settings.Settings) any { return &s.Namespace }},
	{"default-config", "", "", "config applied while the Node has no nvidia.com/mig.config label", func(s *settings.Settings) any { return &s.DefaultConfig }},
	{"metrics-address", "", ":9478", "address of /metrics, /healthz and /readyz (empty turns them off)", func(s *settings.Settings) any { return &s.MetricsAddress }},
	{"state-dir", "", "/var/lib/mig-agent", "directory of the journal that survives crashes and reboots", func(s *settings.Settings) any { return &s.StateDir }},
	{"drain-timeout", "", 5 * time.Minute, "how long evicted pods may take to go", func(s *settings.Settings) any { return &s.DrainTimeout }},
	{"eviction-retry-delay", "", 5 * time.Second, "delay between eviction retries blocked by a PodDisruptionBudget", func(s *settings.Settings) any { return &s.EvictionRetryDelay }},
	{"resource-wait-timeout", "", 2 * time.Minute, "wait for the node to advertise the new devices: the Node's allocatable (device plugin) or its gpu.nvidia.com ResourceSlices (DRA driver) (0 turns it off)", func(s *settings.Settings) any { return &s.ResourceWaitTimeout }},
	{"command-timeout", "", boundcmd.DefaultTimeout, "how long one external command of a change may run (the CDI step's nvidia-smi and nvidia-ctk, the CDI refresh unit's start, each hook); past it the command is killed and the change fails, naming the step", func(s *settings.Settings) any { return &s.CommandTimeout }},
	{"restart-device-plugin", "", true, "after the GPUs changed, restart the node's device plugin, GPU Feature Discovery and DRA kubelet plugin pods so they see the new MIG devices", func(s *settings.Settings) any { return &s.RestartDevicePlugin }},
	{"operand-selector", "", []string(nil), "NAME=SELECTOR: the label selector of an operand's pods on the node, NAME one of " + strings.Join(drain.OperandNames, ", ") + "; repeatable (a pod matching any of an operand's selectors is it); naming an operand replaces its default selectors, the others keep theirs", func(s *settings.Settings) any { return &s.OperandSelectors }},
	{"operand-namespace", "", []string(nil), "a namespace the operands (and --plugin-selector's pods) run in; repeatable; a selected pod elsewhere, or one no DaemonSet controls, is ignored with a warning (default: the agent's namespace, " + strings.Join(drain.DefaultOperandNamespaces, ", ") + ")", func(s *settings.Settings) any { return &s.OperandNamespaces }},
	{"plugin-selector", "", []string(nil), "label selector of other pods on the node restarted after a change so that they see the new MIG devices, besides the device plugin, GPU Feature Discovery, the validator and the DRA kubelet plugin; repeatable", func(s *settings.Settings) any { return &s.PluginSelectors }},
	{"pause-gpu-operator", "", false, "pause the GPU Operator's operands (nvidia.com/gpu.deploy.* labels) during a change", func(s *settings.Settings) any { return &s.PauseGPUOperator }},
	{"host-gpu-clients", "", []string(nil), "systemd units stopped before a MIG mode change and started after it", func(s *settings.Settings) any { return &s.HostGPUClients }},
	{"gpu-client-selector", "", "", "label selector of pods on the node that use the GPUs without requesting a GPU resource; they are evicted with the pods a change affects", func(s *settings.Settings) any { return &s.GPUClientSelector }},
	{"taint", "", true, "taint the node migagent.io/reconfiguring=true:NoSchedule during a change", func(s *settings.Settings) any { return &s.Taint }},
	{"startup-taint", "", []string(nil), "a taint key[=value]:effect the node joins with (Karpenter's startupTaints), removed once the node's geometry has converged; repeatable", func(s *settings.Settings) any { return &s.StartupTaints }},
	{"evict-unmanaged-pods", "", true, "evict pods with no controller that use a changing GPU (false: fail the change instead)", func(s *settings.Settings) any { return &s.EvictUnmanagedPods }},
	{"pod-resources-socket", "", podResourcesSocket, "kubelet PodResources API socket", func(s *settings.Settings) any { return &s.PodResourcesSocket }},
	{"reboot-method", "", "logind", "logind, systemctl, kured (write kured's reboot sentinel; kured drains and reboots), none or sim", func(s *settings.Settings) any { return &s.RebootMethod }},
	{"reboot-sentinel", "", "/var/run/reboot-required", "with --reboot-method kured: the file kured's --reboot-sentinel names, as the agent sees it", func(s *settings.Settings) any { return &s.RebootSentinel }},
	{"dbus-address", "", "", "D-Bus address for logind and systemd (default the system bus)", func(s *settings.Settings) any { return &s.DBusAddress }},
	// A count or a percentage: parsed by loadSettings itself (field nil).
	{"max-concurrent", "", "0", "at most N nodes of the cluster disrupted at once, or P% of the nodes running the agent (rounded down, at least 1) (Lease slots; 0 = no limit)", func(*settings.Settings) any { return nil }},
	{"lease-duration", "", 60 * time.Second, "duration of a rollout slot Lease; a crashed holder's slot expires after it", func(s *settings.Settings) any { return &s.LeaseDuration }},
	{"drift-interval", "", time.Minute, "how often the GPUs are compared with the applied config (0 turns it off)", func(s *settings.Settings) any { return &s.DriftInterval }},
	{"assignment-interval", "", 10 * time.Second, "how often the kubelet's PodResources (standalone: NVML's processes) are read for the assignment trail: which pod holds which MIG device, from when to when (0 turns the trail off)", func(s *settings.Settings) any { return &s.AssignmentInterval }},
	{"reapply-on-drift", "", false, "re-apply the config when the GPUs drift from it", func(s *settings.Settings) any { return &s.ReapplyOnDrift }},
	{"nvml-unavailable-restart", "", 5 * time.Minute, "after NVML has been unavailable this long, /healthz fails so that the container is restarted and gets the driver's library again (0: never)", func(s *settings.Settings) any { return &s.NVMLUnavailableRestart }},
	{"retry-backoff-max", "", 5 * time.Minute, "longest wait between retries of a failed change", func(s *settings.Settings) any { return &s.RetryBackoffMax }},
	{"allow-other-mig-manager", "", false, "act even where another MIG manager is detected (with a warning)", func(s *settings.Settings) any { return &s.AllowOtherMigManager }},
	{"cdi", "", "auto", "refresh CDI after a change: auto (where the CDI spec directory holds an NVIDIA spec, or standalone where the host has nvidia-cdi-refresh.service), on or off", func(s *settings.Settings) any { return &s.CDI }},
	{"cdi-spec-dir", "", "/var/run/cdi", "the CDI spec directory the management spec is written to", func(s *settings.Settings) any { return &s.CDISpecDir }},
	{"driver-root", "", "/", "the NVIDIA driver root on the host (/run/nvidia/driver for the GPU Operator's driver container)", func(s *settings.Settings) any { return &s.DriverRoot }},
	{"driver-root-mount", "", "", "where the agent sees --driver-root (default: the same path)", func(s *settings.Settings) any { return &s.DriverRootMount }},
	{"toolkit-dir", "", []string{"/usr/local/nvidia/toolkit"}, "directories nvidia-ctk is looked for in first (then the driver root's bin directories, then PATH)", func(s *settings.Settings) any { return &s.ToolkitDirs }},
	{"cdi-hook-path", "", "", "host path of nvidia-cdi-hook written into the management spec (default: nvidia-ctk's)", func(s *settings.Settings) any { return &s.CDIHookPath }},
}

// fileAliases are settings-file keys read as the flag they name: the
// chart's value names where the flag is singular because it repeats.
var fileAliases = map[string]string{"startupTaints": "startup-taint"}

// plannerSettings are `mig-agent planner`'s own flags; it shares
// plannerShared with run (the planner's --max-concurrent counts nodes
// whose change it started and that are still under way).
var plannerSettings = []setting{
	{"allowed-configs", "", []string{}, "configs of -f the planner may choose (required)", func(s *settings.Settings) any { return &s.AllowedConfigs }},
	{"hold-time", "", 10 * time.Minute, "a node the planner changed is not changed again within this time, idle or not: at most one planner change per node per hold time (0: no bound)", func(s *settings.Settings) any { return &s.HoldTime }},
	{"node-act-timeout", "", 10 * time.Minute, "a node whose agent has not acted on its nvidia.com/mig.config this long after the write stops counting against --max-concurrent, gets a MigPlannerNodeSilent Event, and is not planned for until it acts (0: never)", func(s *settings.Settings) any { return &s.NodeActTimeout }},
	{"planner-interval", "", 5 * time.Second, "how often the planner looks at pending pods", func(s *settings.Settings) any { return &s.PlannerInterval }},
	{"dry-run", "", false, "print what the planner would change and why, once, and change nothing", func(s *settings.Settings) any { return &s.DryRun }},
}

// plannerShared are the run flags the planner takes too.
var plannerShared = []string{"config-file", "kubeconfig", "namespace", "metrics-address", "max-concurrent", "lease-duration"}

// addPlannerFlags declares the planner's flags.
func addPlannerFlags(fs *pflag.FlagSet) {
	addFlags(fs, plannerSettings)
	for _, st := range runSettings {
		if slices.Contains(plannerShared, st.name) {
			addFlags(fs, []setting{st})
		}
	}
	// What the shared flags mean to the planner.
	for name, usage := range map[string]string{
		"max-concurrent": "at most N opted-in nodes changing at once (0: 1)",
		"lease-duration": "duration of the planner's leader Lease mig-agent-planner; a crashed leader's Lease expires after it",
		"namespace":      "the agents' namespace: their assignment trails and the planner's Lease (default the pod's own, else mig-agent)",
		"config-file":    "the MIG config file the agents use (nvidia-mig-parted v1 format)",
	} {
		fs.Lookup(name).Usage = usage
	}
}

// addFlags declares the flags of settings on fs.
func addFlags(fs *pflag.FlagSet, settings []setting) {
	for _, st := range settings {
		switch d := st.def.(type) {
		case string:
			fs.StringP(st.name, st.short, d, st.usage)
		case bool:
			fs.BoolP(st.name, st.short, d, st.usage)
		case int:
			fs.IntP(st.name, st.short, d, st.usage)
		case time.Duration:
			fs.DurationP(st.name, st.short, d, st.usage)
		case []string:
			fs.StringSliceP(st.name, st.short, d, st.usage)
		default:
			panic(fmt.Sprintf("setting %s: default of type %T", st.name, st.def))
		}
	}
}

// addGlobalFlags declares the flags every command shares.
func addGlobalFlags(fs *pflag.FlagSet) {
	fs.String("settings", "", "settings file (YAML, keys are flag names)")
	fs.BoolP("debug", "d", false, "--log-level debug (nvidia-mig-parted's --debug)")
	addFlags(fs, globalSettings)
}

// addRunFlags declares the daemon's flags.
func addRunFlags(fs *pflag.FlagSet) { addFlags(fs, runSettings) }

// knownKeys lists every flag name of the command tree (settings file keys).
func knownKeys(root *cobra.Command) []string {
	seen := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.PersistentFlags(), c.Flags()} {
			fs.VisitAll(func(f *pflag.Flag) { seen[f.Name] = true })
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// settingsViper merges defaults, the settings file, MIG_AGENT_* variables
// (and, where those are not given, nvidia-mig-parted's, see compat.go) and
// the command's flags (lowest to highest precedence). Every command reads
// its flags through it, so each can come from any of the four.
// With warn, a warning names each nvidia-mig-parted variable read.
func settingsViper(cmd *cobra.Command, warn bool) (*viper.Viper, error) {
	v := viper.New()
	v.SetEnvPrefix("MIG_AGENT")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()
	if err := v.BindPFlags(cmd.Flags()); err != nil {
		return nil, err
	}
	if err := bindMigPartedEnv(v, cmd, warn); err != nil {
		return nil, err
	}
	if f, d := cmd.Flags().Lookup("log-level"), cmd.Flags().Lookup("debug"); f != nil && !f.Changed && d != nil && d.Changed && d.Value.String() == "true" {
		v.Set("log-level", "debug")
	}
	if cmd.Flags().Lookup("state-dir") != nil { // the daemon
		if err := bindMigManagerEnv(v, cmd, warn); err != nil {
			return nil, err
		}
	}
	file := v.GetString("settings")
	if file != "" {
		data, err := gpus.ReadUserFile(file, gpus.MaxUserFile)
		if err != nil {
			return nil, badInput(fmt.Errorf("reading settings file: %w", err))
		}
		var m map[string]any
		if err := yaml.Unmarshal(data, &m); err != nil {
			return nil, badInput(fmt.Errorf("settings file %s: %w", file, err))
		}
		for alias, key := range fileAliases {
			if val, ok := m[alias]; ok {
				if _, both := m[key]; both {
					return nil, badInput(fmt.Errorf("settings file %s: %s and %s name the same setting: set one", file, alias, key))
				}
				m[key] = val
				delete(m, alias)
			}
		}
		known := knownKeys(cmd.Root())
		var unknown []string
		for k := range m {
			if !slices.Contains(known, k) || k == "settings" || k == "debug" {
				unknown = append(unknown, k)
			}
		}
		if len(unknown) > 0 {
			sort.Strings(unknown)
			return nil, badInput(fmt.Errorf("settings file %s: unknown keys %s", file, strings.Join(unknown, ", ")))
		}
		if err := v.MergeConfigMap(m); err != nil {
			return nil, badInput(fmt.Errorf("settings file %s: %w", file, err))
		}
	}
	return v, nil
}

// loadSettings merges defaults, the settings file, MIG_AGENT_* variables and
// flags (lowest to highest precedence) into Settings: the fields of the
// settings the command has flags for.
func loadSettings(cmd *cobra.Command) (*settings.Settings, error) {
	// Offline commands read (and warn about) their own flags through
	// commandValues; run reads them here.
	daemon := cmd.Flags().Lookup("state-dir") != nil
	v, err := settingsViper(cmd, daemon)
	if err != nil {
		return nil, err
	}
	r := &reader{v: v}
	s := &settings.Settings{}
	for _, st := range slices.Concat(globalSettings, runSettings, plannerSettings) {
		if cmd.Flags().Lookup(st.name) == nil {
			continue // not a flag of this command
		}
		switch f := st.field(s).(type) {
		case *string:
			*f = r.str(st.name)
		case *bool:
			*f = r.boolean(st.name)
		case *int:
			*f = r.integer(st.name)
		case *time.Duration:
			*f = r.duration(st.name)
		case *[]string:
			*f = r.list(st.name)
		}
	}
	if cmd.Flags().Lookup("gpu-client-selector") != nil {
		if _, err := labels.Parse(s.GPUClientSelector); err != nil {
			r.errs = append(r.errs, fmt.Sprintf("gpu-client-selector: %v", err))
		}
	}
	if _, err := drain.ParseSelectors(s.OperandSelectors, s.PluginSelectors); err != nil {
		r.errs = append(r.errs, err.Error())
	}
	if cmd.Flags().Lookup("max-concurrent") != nil {
		s.MaxConcurrent, s.MaxConcurrentPercent = r.countOrPercent("max-concurrent")
	}
	if daemon {
		if s.NodeName == "" {
			s.NodeName = os.Getenv("NODE_NAME")
		}
		if s.Namespace == "" {
			s.Namespace = podNamespace()
		}
		s.OperandNamespaces = drain.OperandNamespaces(s.OperandNamespaces, s.Namespace)
	}
	if err := r.err(); err != nil {
		return nil, err
	}
	return s, nil
}

// reader reads settings of each type from v, keeping what does not parse
// for one error.
type reader struct {
	v    *viper.Viper
	errs []string
}

// err is the bad-settings error naming every value that did not parse (nil:
// none).
func (r *reader) err() error {
	if len(r.errs) == 0 {
		return nil
	}
	return badInput(fmt.Errorf("%w: %s", settings.ErrBadSettings, strings.Join(r.errs, "; ")))
}

func (r *reader) str(k string) string { return r.v.GetString(k) }

func (r *reader) duration(k string) time.Duration {
	raw := r.v.Get(k)
	switch x := raw.(type) {
	case time.Duration:
		return x
	case nil:
		return 0
	}
	d, err := time.ParseDuration(fmt.Sprint(raw))
	if err != nil {
		r.errs = append(r.errs, fmt.Sprintf("%s: %q is not a duration (like 90s or 5m)", k, fmt.Sprint(raw)))
	}
	return d
}

func (r *reader) boolean(k string) bool {
	raw := r.v.Get(k)
	switch x := raw.(type) {
	case bool:
		return x
	case nil:
		return false
	}
	switch strings.ToLower(fmt.Sprint(raw)) {
	case "true", "1", "yes":
		return true
	case "false", "0", "no", "":
		return false
	}
	r.errs = append(r.errs, fmt.Sprintf("%s: %q is not a boolean", k, fmt.Sprint(raw)))
	return false
}

func (r *reader) integer(k string) int {
	raw := r.v.Get(k)
	if raw == nil {
		return 0
	}
	var n int
	if _, err := fmt.Sscan(fmt.Sprint(raw), &n); err != nil || fmt.Sprint(n) != strings.TrimSpace(fmt.Sprint(raw)) {
		r.errs = append(r.errs, fmt.Sprintf("%s: %q is not an integer", k, fmt.Sprint(raw)))
	}
	return n
}

// countOrPercent reads a count ("3") or a percentage ("25%"), as
// --max-concurrent takes.
func (r *reader) countOrPercent(k string) (count, percent int) {
	raw := strings.TrimSpace(fmt.Sprint(r.v.Get(k)))
	if !strings.HasSuffix(raw, "%") {
		return r.integer(k), 0
	}
	if _, err := fmt.Sscan(strings.TrimSuffix(raw, "%"), &percent); err != nil || fmt.Sprint(percent)+"%" != raw {
		r.errs = append(r.errs, fmt.Sprintf("%s: %q is not an integer or a percentage", k, raw))
	}
	return 0, percent
}

// list reads a list given as a list, or as one comma-separated string.
func (r *reader) list(k string) []string {
	var out []string
	switch x := r.v.Get(k).(type) {
	case []string:
		out = x
	case []any:
		for _, e := range x {
			out = append(out, fmt.Sprint(e))
		}
	case string:
		if x != "" {
			out = strings.Split(x, ",")
		}
	}
	var clean []string
	for _, s := range out {
		if s = strings.TrimSpace(strings.Trim(s, "[]")); s != "" {
			clean = append(clean, s)
		}
	}
	return clean
}

// podNamespace is the pod's own namespace when running in a pod, else mig-agent.
func podNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "mig-agent"
}
