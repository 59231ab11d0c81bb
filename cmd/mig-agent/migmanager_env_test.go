package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// NVIDIA's MIG manager's variables, as its DaemonSet (the GPU Operator's
// assets/state-mig-manager, migManager.env) sets them: each mapped to the
// setting that means the same, below a flag and MIG_AGENT_*, or refused
// with what to do instead.
func TestMigManagerEnv(t *testing.T) {
	clients := filepath.Join(t.TempDir(), "clients.yaml")
	if err := os.WriteFile(clients, []byte("version: v1\nsystemd-services:\n  - nvsm.service\n  - dcgm.service\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODE_NAME", "n1")
	t.Setenv("KUBECONFIG", "/etc/kube/config")
	t.Setenv("CONFIG_FILE", "/mig-parted-config/config.yaml")
	t.Setenv("WITH_REBOOT", "false")
	t.Setenv("WITH_SHUTDOWN_HOST_GPU_CLIENTS", "true")
	t.Setenv("GPU_CLIENTS_FILE", clients)
	t.Setenv("DEFAULT_GPU_CLIENTS_NAMESPACE", "gpu-operator")
	t.Setenv("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver")
	t.Setenv("DRIVER_ROOT_CTR_PATH", "/driver-root")
	t.Setenv("CDI_ENABLED", "true")
	t.Setenv("NVIDIA_CDI_HOOK_PATH", "/usr/local/nvidia/toolkit/nvidia-cdi-hook")
	t.Setenv("HOST_ROOT_MOUNT", "/host") // mig-parted's default: changes nothing
	s, err := settingsFor(t)
	if err != nil {
		t.Fatal(err)
	}
	if s.Kubeconfig != "/etc/kube/config" || s.ConfigFile != "/mig-parted-config/config.yaml" || s.RebootMethod != "none" ||
		strings.Join(s.HostGPUClients, ",") != "nvsm.service,dcgm.service" || s.DriverRoot != "/run/nvidia/driver" ||
		s.DriverRootMount != "/driver-root" || s.CDI != "on" || s.CDIHookPath != "/usr/local/nvidia/toolkit/nvidia-cdi-hook" {
		t.Fatalf("mapped: %+v", s)
	}
	// A flag and MIG_AGENT_* win.
	t.Setenv("MIG_AGENT_CDI", "off")
	s, err = settingsFor(t, "--reboot-method", "logind")
	if err != nil || s.RebootMethod != "logind" || s.CDI != "off" {
		t.Fatalf("precedence: %+v %v", s, err)
	}
	t.Setenv("WITH_REBOOT", "true")
	if s, _ = settingsFor(t); s.RebootMethod != "logind" {
		t.Fatalf("WITH_REBOOT=true: %q", s.RebootMethod)
	}
	// What has no meaning here is refused, every variable named.
	t.Setenv("HOST_KUBELET_SYSTEMD_SERVICE", "k3s.service")
	t.Setenv("RECONFIGURE_SCRIPT", "/my/script.sh")
	t.Setenv("WITH_REBOOT", "sometimes")
	_, err = settingsFor(t)
	if !errors.Is(err, ErrMigManagerEnv) || !strings.Contains(err.Error(), "HOST_KUBELET_SYSTEMD_SERVICE") ||
		!strings.Contains(err.Error(), "RECONFIGURE_SCRIPT") || !strings.Contains(err.Error(), "WITH_REBOOT") {
		t.Fatalf("refused: %v", err)
	}
}
