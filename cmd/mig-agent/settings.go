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
	"sigs.k8s.io/yaml"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/reconcile"
)

// addGlobalFlags declares the flags every command shares.
func addGlobalFlags(fs *pflag.FlagSet) {
	fs.String("settings", "", "settings file (YAML, keys are flag names)")
	fs.String("nvml", "real", "GPU backend: real, or sim:SPEC (e.g. sim:h200x8)")
	fs.String("nvml-library", "", "path of libnvidia-ml.so.1 or of a driver root holding it")
	fs.String("sim-state", "", "simulated GPU state file (with --nvml sim:SPEC)")
	fs.String("sim-faults", "", "inject NVML failures: Op:N=ERROR_NAME,...")
	fs.Bool("sim-no-reset", false, "simulate GPUs that cannot be reset")
	fs.String("log-level", "info", "debug, info, warn or error")
	fs.String("log-format", "text", "text or json")
}

// addRunFlags declares the daemon's flags.
func addRunFlags(fs *pflag.FlagSet) {
	fs.Bool("standalone", false, "no Kubernetes: apply -c NAME from -f FILE and hold it")
	fs.StringP("config-file", "f", "", "MIG config file (nvidia-mig-parted v1 format)")
	fs.StringP("selected-config", "c", "", "config name (standalone mode)")
	fs.StringP("hooks-file", "k", "", "nvidia-mig-parted hooks file run around each change (standalone mode)")
	fs.String("node-name", "", "this node's name (default $NODE_NAME)")
	fs.String("kubeconfig", "", "kubeconfig file (default in-cluster config)")
	fs.String("namespace", "", "namespace of the ConfigMap and Leases (default the pod's own, else mig-agent)")
	fs.String("default-config", "", "config applied while the Node has no nvidia.com/mig.config label")
	fs.String("metrics-address", ":9478", "address of /metrics, /healthz and /readyz (empty turns them off)")
	fs.String("state-dir", "/var/lib/mig-agent", "directory of the journal that survives crashes and reboots")
	fs.Duration("drain-timeout", 5*time.Minute, "how long evicted pods may take to go")
	fs.Duration("eviction-retry-delay", 5*time.Second, "delay between eviction retries blocked by a PodDisruptionBudget")
	fs.Duration("resource-wait-timeout", 2*time.Minute, "wait for the node to advertise the new devices: the Node's allocatable (device plugin) or its gpu.nvidia.com ResourceSlices (DRA driver) (0 turns it off)")
	fs.Bool("restart-device-plugin", true, "after the GPUs changed, restart the node's device plugin, GPU Feature Discovery and DRA kubelet plugin pods so they see the new MIG devices")
	fs.Bool("pause-gpu-operator", false, "pause the GPU Operator's operands (nvidia.com/gpu.deploy.* labels) during a change")
	fs.StringSlice("host-gpu-clients", nil, "systemd units stopped before a MIG mode change and started after it")
	fs.Bool("taint", true, "taint the node migagent.io/reconfiguring=true:NoSchedule during a change")
	fs.Bool("evict-unmanaged-pods", true, "evict pods with no controller that use a changing GPU (false: fail the change instead)")
	fs.String("pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "kubelet PodResources API socket")
	fs.String("reboot-method", "logind", "logind, systemctl, none or sim")
	fs.String("dbus-address", "", "D-Bus address for logind and systemd (default the system bus)")
	fs.Int("max-concurrent", 0, "at most N nodes of the cluster disrupted at once (Lease slots; 0 = no limit)")
	fs.Duration("lease-duration", 60*time.Second, "duration of a rollout slot Lease; a crashed holder's slot expires after it")
	fs.Duration("drift-interval", time.Minute, "how often the GPUs are compared with the applied config (0 turns it off)")
	fs.Bool("reapply-on-drift", false, "re-apply the config when the GPUs drift from it")
	fs.Duration("retry-backoff-max", 5*time.Minute, "longest wait between retries of a failed change")
	fs.Bool("allow-other-mig-manager", false, "act even where another MIG manager is detected (with a warning)")
}

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
		known := knownKeys(cmd.Root())
		var unknown []string
		for k := range m {
			if !slices.Contains(known, k) || k == "settings" {
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
// flags (lowest to highest precedence) into Settings.
func loadSettings(cmd *cobra.Command) (*reconcile.Settings, error) {
	// Offline commands read (and warn about) their own flags through
	// commandValues; run reads them here.
	v, err := settingsViper(cmd, cmd.Flags().Lookup("state-dir") != nil)
	if err != nil {
		return nil, err
	}
	get := func(k string) string { return v.GetString(k) }
	var errs []string
	dur := func(k string) time.Duration {
		raw := v.Get(k)
		switch x := raw.(type) {
		case time.Duration:
			return x
		case nil:
			return 0
		}
		d, err := time.ParseDuration(fmt.Sprint(raw))
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %q is not a duration (like 90s or 5m)", k, fmt.Sprint(raw)))
		}
		return d
	}
	boolean := func(k string) bool {
		raw := v.Get(k)
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
		errs = append(errs, fmt.Sprintf("%s: %q is not a boolean", k, fmt.Sprint(raw)))
		return false
	}
	integer := func(k string) int {
		raw := v.Get(k)
		if raw == nil {
			return 0
		}
		var n int
		if _, err := fmt.Sscan(fmt.Sprint(raw), &n); err != nil || fmt.Sprint(n) != strings.TrimSpace(fmt.Sprint(raw)) {
			errs = append(errs, fmt.Sprintf("%s: %q is not an integer", k, fmt.Sprint(raw)))
		}
		return n
	}
	list := func(k string) []string {
		var out []string
		switch x := v.Get(k).(type) {
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
	s := &reconcile.Settings{
		NVML: get("nvml"), NVMLLibrary: get("nvml-library"), SimState: get("sim-state"),
		SimFaults: get("sim-faults"), SimNoReset: boolean("sim-no-reset"),
		LogLevel: get("log-level"), LogFormat: get("log-format"),
	}
	if cmd.Flags().Lookup("config-file") != nil {
		s.ConfigFile = get("config-file")
	}
	if cmd.Flags().Lookup("selected-config") != nil {
		s.SelectedConfig = get("selected-config")
	}
	if cmd.Flags().Lookup("hooks-file") != nil {
		s.HooksFile = get("hooks-file")
	}
	if cmd.Flags().Lookup("state-dir") != nil {
		s.Standalone = boolean("standalone")
		s.NodeName, s.Kubeconfig, s.Namespace = get("node-name"), get("kubeconfig"), get("namespace")
		s.DefaultConfig, s.MetricsAddress, s.StateDir = get("default-config"), get("metrics-address"), get("state-dir")
		s.DrainTimeout, s.EvictionRetryDelay = dur("drain-timeout"), dur("eviction-retry-delay")
		s.ResourceWaitTimeout = dur("resource-wait-timeout")
		s.PauseGPUOperator, s.HostGPUClients = boolean("pause-gpu-operator"), list("host-gpu-clients")
		s.RestartDevicePlugin = boolean("restart-device-plugin")
		s.Taint, s.EvictUnmanagedPods = boolean("taint"), boolean("evict-unmanaged-pods")
		s.PodResourcesSocket, s.RebootMethod, s.DBusAddress = get("pod-resources-socket"), get("reboot-method"), get("dbus-address")
		s.MaxConcurrent, s.LeaseDuration = integer("max-concurrent"), dur("lease-duration")
		s.DriftInterval, s.ReapplyOnDrift = dur("drift-interval"), boolean("reapply-on-drift")
		s.RetryBackoffMax, s.AllowOtherMigManager = dur("retry-backoff-max"), boolean("allow-other-mig-manager")
		if s.NodeName == "" {
			s.NodeName = os.Getenv("NODE_NAME")
		}
		if s.Namespace == "" {
			s.Namespace = podNamespace()
		}
	}
	if len(errs) > 0 {
		return nil, badInput(fmt.Errorf("%w: %s", reconcile.ErrBadSettings, strings.Join(errs, "; ")))
	}
	return s, nil
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
