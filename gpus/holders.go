package gpus

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/migagent/mig-agent/nvmlx"
)

// What holds what a change takes away, and what to do about it: the
// failure reasons name each holder NVML reports (a process) or that can
// hold a GPU without being listed (persistence, nvidia_drm).

// procModules lists the loaded kernel modules (a variable for tests).
var procModules = "/proc/modules"

// holderHints say what to do about a process holding what a change takes
// away, by the name NVML reports for it (the first match wins). The
// host services are those NVIDIA's MIG manager stops around a change
// (mig-parted deployments/systemd/hooks.sh driver_services, k8s_services;
// the GPU Operator's default-gpu-clients list).
var holderHints = []struct{ match, hint string }{
	{"nv-hostengine", "DCGM's host engine: list its unit (nvidia-dcgm.service) in --host-gpu-clients, or pause the GPU Operator's DCGM (--pause-gpu-operator)"},
	{"dcgm", "DCGM: list its unit in --host-gpu-clients, or pause the GPU Operator's DCGM (--pause-gpu-operator)"},
	{"nvidia-persistenced", "the persistence daemon: list nvidia-persistenced.service in --host-gpu-clients"},
	{"nvsm", "NVSM: list its units (nvsm.service ...) in --host-gpu-clients"},
	{"Xorg", "an X server: stop the display manager for the change"},
	{"nvidia-smi", "another nvidia-smi: wait for it, or stop what runs it"},
}

// StrayReason is the failure reason of processes that no pod accounts
// for, with what to do about each kind of holder.
func StrayReason(strays []string) string {
	var hints []string
	seen := map[string]bool{}
	for _, s := range strays {
		for _, h := range holderHints {
			if strings.Contains(s, "("+h.match) && !seen[h.hint] {
				seen[h.hint] = true
				hints = append(hints, h.hint)
				break
			}
		}
	}
	hints = append(hints, "a pod that uses the GPUs without requesting a GPU resource: name it with --gpu-client-selector so that it is evicted",
		"anything else: stop it, then the change is retried")
	return "processes no pod accounts for are using what the change takes away: " + strings.Join(strays, ", ") +
		" (what to do: " + strings.Join(hints, "; ") + ")"
}

// HolderAdvice adds, to an NVML "in use" error from applying, what may hold
// the GPU that NVML does not list as a process, and what to do.
func HolderAdvice(err error) error {
	if err == nil || !errors.Is(err, nvmlx.ErrInUse) {
		return err
	}
	hints := []string{"processes NVML does not list can hold a GPU: stop nvidia-persistenced, DCGM (nv-hostengine), NVSM and Fabric Manager clients for the change (--host-gpu-clients), or disable persistence mode (nvidia-smi -pm 0)"}
	if moduleLoaded("nvidia_drm") {
		// mig-parted README, Known Issues: a GPU reset fails while
		// nvidia_drm is loaded.
		hints = append(hints, "the nvidia_drm kernel module is loaded and keeps a GPU reset from running: unload it (rmmod nvidia_drm) for the change, or reboot")
	}
	return fmt.Errorf("%w (what to do: %s)", err, strings.Join(hints, "; "))
}

// moduleLoaded reports whether the kernel module name is loaded.
func moduleLoaded(name string) bool {
	f, err := os.Open(procModules)
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if m, _, _ := strings.Cut(s.Text(), " "); m == name {
			return true
		}
	}
	return false
}
