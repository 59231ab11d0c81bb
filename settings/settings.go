// Package settings is the Settings struct of mig-agent, every setting in
// one typed struct, and its validation. Each setting is declared once, with
// its flag, its settings-file key and its MIG_AGENT_* variable, in the table
// of cmd/mig-agent/settings.go. It may import the standard library only.
package settings

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Settings is every setting of mig-agent in one typed struct, filled from
// defaults, the settings file, the environment and flags (in that order of
// increasing precedence) and validated once. Each is declared once, with
// its flag, in cmd/mig-agent/settings.go.
type Settings struct {
	NVML        string
	NVMLLibrary string
	SimState    string
	SimFaults   string
	SimNoReset  bool
	LogLevel    string
	LogFormat   string

	Standalone     bool
	ConfigFile     string
	SelectedConfig string
	// HooksFile is an nvidia-mig-parted hooks file run around each change
	// applied without Kubernetes (apply, run --standalone).
	HooksFile      string
	NodeName       string
	Kubeconfig     string
	Namespace      string
	DefaultConfig  string
	MetricsAddress string
	StateDir       string

	DrainTimeout        time.Duration
	EvictionRetryDelay  time.Duration
	ResourceWaitTimeout time.Duration
	// CommandTimeout bounds each external command of a change (the CDI
	// step's nvidia-smi and nvidia-ctk, the CDI refresh unit's start, the
	// hooks of a hooks file).
	CommandTimeout      time.Duration
	PauseGPUOperator    bool
	RestartDevicePlugin bool
	HostGPUClients      []string
	// GPUClientSelector: a label selector of pods on the node that use the
	// GPUs without requesting a GPU resource (monitoring agents, sidecars):
	// they are evicted with the pods a change affects.
	GPUClientSelector  string
	Taint              bool
	EvictUnmanagedPods bool
	// OperandSelectors find the operands' pods (the device plugin, GFD,
	// the validator, the DRA kubelet plugin, the DCGM exporter, DCGM):
	// NAME=SELECTOR items, an operand named there losing its default
	// selectors (drain.ParseSelectors reads them).
	OperandSelectors []string
	// OperandNamespaces are the namespaces the operands run in: a pod
	// the selectors select is an operand only there, and only when a
	// DaemonSet controls it (drain.OperandNamespaces gives the default:
	// the agent's namespace and where NVIDIA's installers put them).
	OperandNamespaces []string
	// PluginSelectors are label selectors of other pods restarted after a
	// change so that they see the new MIG devices, besides the operands.
	PluginSelectors []string
	// StartupTaints are taints (key[=value]:effect) the node joins with,
	// removed by the agent once the node's geometry has converged
	// (ParseTaint reads them).
	StartupTaints      []string
	PodResourcesSocket string

	RebootMethod string
	// RebootSentinel is the file --reboot-method kured creates: the path
	// kured's --reboot-sentinel names, as the agent sees it.
	RebootSentinel string
	DBusAddress    string
	MaxConcurrent  int
	// MaxConcurrentPercent: --max-concurrent P%, of the agents' pool.
	MaxConcurrentPercent int
	LeaseDuration        time.Duration

	// NVMLUnavailableRestart: after NVML has been unavailable this long,
	// /healthz fails (0: never).
	NVMLUnavailableRestart time.Duration
	DriftInterval          time.Duration
	ReapplyOnDrift         bool
	RetryBackoffMax        time.Duration
	AllowOtherMigManager   bool

	// CDI after a change (package cdi): auto, on or off; where the specs
	// are; the driver root on the host and where the agent sees it; where
	// nvidia-ctk is looked for first; the host path of nvidia-cdi-hook.
	CDI             string
	CDISpecDir      string
	DriverRoot      string
	DriverRootMount string
	ToolkitDirs     []string
	CDIHookPath     string

	// AssignmentInterval: how often the assignment trail (package assign)
	// reads which pod holds which MIG device (0: no trail).
	AssignmentInterval time.Duration

	// The planner (`mig-agent planner`): the configs of ConfigFile it may
	// choose; how long a node it changed is not changed again unless idle;
	// how often it plans; whether it only prints what it would do.
	AllowedConfigs []string
	HoldTime       time.Duration
	// NodeActTimeout: a node whose agent has not acted on its label this
	// long stops counting against the planner's --max-concurrent.
	NodeActTimeout  time.Duration
	PlannerInterval time.Duration
	DryRun          bool
}

// Reboot methods (docs/reference.md#disruption-and-reboot).
const (
	RebootLogind    = "logind"
	RebootSystemctl = "systemctl"
	RebootNone      = "none"
	RebootSim       = "sim"
	// RebootKured writes kured's reboot sentinel (RebootSentinel); kured
	// drains and reboots the node under its lock.
	RebootKured = "kured"
)

// ErrBadSettings wraps every settings validation error.
var ErrBadSettings = errors.New("invalid settings")

// Validate checks the settings for the daemon (`run`).
func (s *Settings) Validate() error {
	var errs []string
	add := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
	if s.NVML != "real" && !strings.HasPrefix(s.NVML, "sim:") {
		add("--nvml must be real or sim:SPEC, not %q", s.NVML)
	}
	switch s.RebootMethod {
	case RebootLogind, RebootSystemctl, RebootNone:
	case RebootKured:
		if !strings.HasPrefix(s.RebootSentinel, "/") || strings.HasSuffix(s.RebootSentinel, "/") {
			add("--reboot-method kured needs --reboot-sentinel, the absolute path of a file, not %q", s.RebootSentinel)
		}
	case RebootSim:
		if !strings.HasPrefix(s.NVML, "sim:") {
			add("--reboot-method sim needs --nvml sim:SPEC")
		}
	default:
		add("--reboot-method must be logind, systemctl, kured, none or sim, not %q", s.RebootMethod)
	}
	switch s.LogFormat {
	case "text", "json":
	default:
		add("--log-format must be text or json, not %q", s.LogFormat)
	}
	switch strings.ToLower(s.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		add("--log-level must be debug, info, warn or error, not %q", s.LogLevel)
	}
	for name, d := range map[string]time.Duration{
		"--drain-timeout": s.DrainTimeout, "--resource-wait-timeout": s.ResourceWaitTimeout,
		"--drift-interval": s.DriftInterval, "--eviction-retry-delay": s.EvictionRetryDelay,
		"--nvml-unavailable-restart": s.NVMLUnavailableRestart, "--assignment-interval": s.AssignmentInterval,
	} {
		if d < 0 {
			add("%s must not be negative", name)
		}
	}
	if s.CommandTimeout <= 0 {
		add("--command-timeout must be positive: every external command is bounded")
	}
	if s.MaxConcurrent < 0 {
		add("--max-concurrent must not be negative")
	}
	if s.MaxConcurrentPercent < 0 || s.MaxConcurrentPercent > 100 {
		add("--max-concurrent must be a percentage from 1%% to 100%%, not %d%%", s.MaxConcurrentPercent)
	}
	switch s.CDI {
	case "", "auto", "on", "off":
	default:
		add("--cdi must be auto, on or off, not %q", s.CDI)
	}
	if s.DriverRoot != "" && !strings.HasPrefix(s.DriverRoot, "/") {
		add("--driver-root must be an absolute path, not %q", s.DriverRoot)
	}
	if s.Standalone {
		if s.SelectedConfig == "" {
			add("--standalone needs -c/--selected-config")
		}
	} else if s.NodeName == "" {
		add("--node-name (or $NODE_NAME) is required unless --standalone")
	}
	if s.StateDir == "" {
		add("--state-dir must not be empty")
	}
	for _, t := range s.StartupTaints {
		if _, err := ParseTaint(t); err != nil {
			add("--startup-taint: %v", err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrBadSettings, strings.Join(errs, "; "))
	}
	return nil
}

// Taint is a Node taint as --startup-taint names it.
type Taint struct{ Key, Value, Effect string }

// ReconfiguringTaintKey is the key of the taint the agent itself adds while
// a change runs; it cannot be a startup taint.
const ReconfiguringTaintKey = "migagent.io/reconfiguring"

// ErrBadTaint: a --startup-taint that is not key[=value]:effect.
var ErrBadTaint = errors.New("a taint is key[=value]:effect, effect NoSchedule, PreferNoSchedule or NoExecute")

// ParseTaint reads key[=value]:effect, as kubectl taint and Karpenter's
// NodePool startupTaints write a taint (the key a qualified name, the value
// a label value).
func ParseTaint(s string) (Taint, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return Taint{}, fmt.Errorf("%q: %w", s, ErrBadTaint)
	}
	effect := s[i+1:]
	key, value, _ := strings.Cut(s[:i], "=")
	switch {
	case effect != "NoSchedule" && effect != "PreferNoSchedule" && effect != "NoExecute":
		return Taint{}, fmt.Errorf("%q: effect %q: %w", s, effect, ErrBadTaint)
	case !qualifiedName(key):
		return Taint{}, fmt.Errorf("%q: key %q is not a qualified name (prefix/name): %w", s, key, ErrBadTaint)
	case value != "" && !labelValue(value):
		return Taint{}, fmt.Errorf("%q: value %q is not a label value: %w", s, value, ErrBadTaint)
	case key == ReconfiguringTaintKey:
		return Taint{}, fmt.Errorf("%q: %s is the agent's own taint during a change, not a startup taint", s, key)
	}
	return Taint{Key: key, Value: value, Effect: effect}, nil
}

// qualifiedName: an optional DNS subdomain prefix and "/", then a name of
// at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends (as
// Kubernetes' IsQualifiedName).
func qualifiedName(s string) bool {
	prefix, name, has := strings.Cut(s, "/")
	if !has {
		prefix, name = "", s
	} else if prefix == "" || len(prefix) > 253 || strings.Trim(prefix, "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" {
		return false
	}
	return name != "" && labelValue(name)
}

// labelValue: at most 63 alphanumerics, '-', '_' or '.', alphanumeric at
// both ends.
func labelValue(s string) bool {
	if len(s) > 63 || s == "" {
		return false
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	for i := 0; i < len(s); i++ {
		if c := s[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return alnum(s[0]) && alnum(s[len(s)-1])
}
