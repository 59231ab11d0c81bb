package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/viper"
	"sigs.k8s.io/yaml"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/settings"
)

// The environment of NVIDIA's MIG manager (k8s-mig-manager, the GPU
// Operator's operand: the Sources of the flags of mig-parted
// cmd/nvidia-mig-manager/main.go), read by `mig-agent run` as aliases, so
// that a DaemonSet's env written for that manager (the operator's
// migManager.env among it) keeps its meaning. Each variable is mapped to
// the setting that means the same, accepted where the agent needs no
// setting for it, or refused with what to do instead: none is ignored in
// silence. A variable is read only where neither the flag nor its
// MIG_AGENT_* variable is given (precedence flag > MIG_AGENT_* > these >
// settings file > default).

// ErrMigManagerEnv: a variable of NVIDIA's MIG manager has no meaning here.
var ErrMigManagerEnv = errors.New("NVIDIA MIG manager environment not supported by mig-agent")

// migManagerDefaults are the variables that change nothing at
// mig-parted's own default (cmd/nvidia-mig-manager/main.go Default*): the
// paths of its reconfigure script's plumbing, which the agent does itself.
var migManagerDefaults = map[string]struct{ def, why string }{
	"RECONFIGURE_SCRIPT":           {"/usr/bin/reconfigure-mig.sh", "the agent applies a config itself; it runs no reconfigure script"},
	"HOST_ROOT_MOUNT":              {"/host", "the agent reaches the host through D-Bus (--dbus-address) and the driver root (--driver-root), not a host root mount"},
	"HOST_NVIDIA_DIR":              {"/usr/local/nvidia", "the agent finds nvidia-ctk through --toolkit-dir"},
	"HOST_MIG_MANAGER_STATE_FILE":  {"/etc/systemd/system/nvidia-mig-manager.service.d/override.conf", "the agent keeps its state in --state-dir"},
	"HOST_KUBELET_SYSTEMD_SERVICE": {"kubelet.service", "the agent never stops the kubelet; list host GPU clients under --host-gpu-clients"},
}

// migManagerPaths are mapped one to one to a flag.
var migManagerPaths = []struct{ env, flag string }{
	{"KUBECONFIG", "kubeconfig"},
	{"CONFIG_FILE", "config-file"},
	{"NVIDIA_DRIVER_ROOT", "driver-root"},
	{"DRIVER_ROOT", "driver-root"},
	{"DRIVER_ROOT_CTR_PATH", "driver-root-mount"},
	{"NVIDIA_CDI_HOOK_PATH", "cdi-hook-path"},
}

// bindMigManagerEnv reads the MIG manager's variables into v for the
// daemon (see above); the error names every variable refused. loud logs
// each one read.
func bindMigManagerEnv(v *viper.Viper, cmd *cobra.Command, loud bool) error {
	note := func(env, to string) {
		if loud {
			slog.New(slog.NewTextHandler(os.Stderr, nil)).Warn("NVIDIA MIG manager variable read", "variable", env, "as", to)
		}
	}
	free := func(flag string) bool {
		f := cmd.Flags().Lookup(flag)
		_, native := os.LookupEnv(nativeEnv(flag))
		return f != nil && !f.Changed && !native
	}
	var refused []string
	for _, m := range migManagerPaths {
		if val, ok := os.LookupEnv(m.env); ok && val != "" && free(m.flag) {
			v.Set(m.flag, val)
			note(m.env, "--"+m.flag)
		}
	}
	if val, ok := os.LookupEnv("WITH_REBOOT"); ok && free("reboot-method") {
		switch b, err := parseEnvBool(val); {
		case err != nil:
			refused = append(refused, fmt.Sprintf("WITH_REBOOT=%q: %v", val, err))
		case b:
			v.Set("reboot-method", settings.RebootLogind)
			note("WITH_REBOOT", "--reboot-method logind")
		default:
			v.Set("reboot-method", settings.RebootNone)
			note("WITH_REBOOT", "--reboot-method none")
		}
	}
	if val, ok := os.LookupEnv("CDI_ENABLED"); ok && free("cdi") {
		if b, err := parseEnvBool(val); err != nil {
			refused = append(refused, fmt.Sprintf("CDI_ENABLED=%q: %v", val, err))
		} else {
			v.Set("cdi", map[bool]string{true: "on", false: "off"}[b])
			note("CDI_ENABLED", "--cdi "+map[bool]string{true: "on", false: "off"}[b])
		}
	}
	refused = append(refused, bindGPUClients(v, free, note)...)
	for _, env := range []string{"NVIDIA_DEV_ROOT", "DEV_ROOT_CTR_PATH"} {
		root := os.Getenv("NVIDIA_DRIVER_ROOT") + os.Getenv("DRIVER_ROOT")
		if val := os.Getenv(env); val != "" && val != root && val != os.Getenv("DRIVER_ROOT_CTR_PATH") {
			refused = append(refused, fmt.Sprintf("%s=%q: the agent takes the device nodes from the driver root (--driver-root); a separate device root is not supported", env, val))
		}
	}
	for env, d := range migManagerDefaults {
		if val, ok := os.LookupEnv(env); ok && val != "" && val != d.def {
			refused = append(refused, fmt.Sprintf("%s=%q: %s", env, val, d.why))
		}
	}
	if len(refused) > 0 {
		sort.Strings(refused)
		return badInput(fmt.Errorf("%w: %s", ErrMigManagerEnv, strings.Join(refused, "; ")))
	}
	return nil
}

// bindGPUClients maps WITH_SHUTDOWN_HOST_GPU_CLIENTS and GPU_CLIENTS_FILE
// (the manager's clients.yaml: version, systemd-services) to
// --host-gpu-clients. DEFAULT_GPU_CLIENTS_NAMESPACE needs no setting: the
// agent finds the GPU Operator's operands on its node in every namespace.
func bindGPUClients(v *viper.Viper, free func(string) bool, note func(string, string)) []string {
	val, ok := os.LookupEnv("WITH_SHUTDOWN_HOST_GPU_CLIENTS")
	if !ok || !free("host-gpu-clients") {
		return nil
	}
	on, err := parseEnvBool(val)
	if err != nil {
		return []string{fmt.Sprintf("WITH_SHUTDOWN_HOST_GPU_CLIENTS=%q: %v", val, err)}
	}
	if !on {
		return nil
	}
	file := os.Getenv("GPU_CLIENTS_FILE")
	if file == "" {
		return []string{"WITH_SHUTDOWN_HOST_GPU_CLIENTS=true without GPU_CLIENTS_FILE: list the units under --host-gpu-clients"}
	}
	data, err := gpus.ReadUserFile(file, gpus.MaxUserFile)
	if err != nil {
		return []string{fmt.Sprintf("GPU_CLIENTS_FILE=%q: %v", file, err)}
	}
	var clients struct {
		Version         string   `json:"version"`
		SystemdServices []string `json:"systemd-services"`
	}
	if err := yaml.UnmarshalStrict(data, &clients); err != nil {
		return []string{fmt.Sprintf("GPU_CLIENTS_FILE=%q: %v", file, err)}
	}
	v.Set("host-gpu-clients", clients.SystemdServices)
	note("WITH_SHUTDOWN_HOST_GPU_CLIENTS", "--host-gpu-clients "+strings.Join(clients.SystemdServices, ","))
	return nil
}

// parseEnvBool reads a boolean as urfave/cli does (strconv.ParseBool).
func parseEnvBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "t", "true":
		return true, nil
	case "0", "f", "false", "":
		return false, nil
	}
	return false, errors.New("not a boolean")
}
