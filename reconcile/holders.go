package reconcile

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx"
)

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

// strayReason is the failure reason of processes that no pod accounts
// for, with what to do about each kind of holder.
func strayReason(strays []string) string {
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

// holderAdvice adds, to an NVML "in use" error from applying, what may hold
// the GPU that NVML does not list as a process, and what to do.
func holderAdvice(err error) error {
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

// stopClientsForStrays stops the host GPU clients (--host-gpu-clients) for
// a change without a mode change too, where processes block it: a DCGM or
// NVSM holds the MIG devices a destroy takes away just as it holds a GPU
// whose mode changes. It returns the processes still there afterwards.
// With a mode change the clients are stopped in their own step, after
// this check; they are restarted when the change ends either way.
func (a *attempt) stopClientsForStrays(strays []string) ([]string, error) {
	d, ch := a.d, a.ch
	if len(strays) == 0 || d.Units == nil || len(d.S.HostGPUClients) == 0 || len(ch.StoppedUnits) > 0 || gpus.ModeChanges(a.v.plan) {
		return strays, nil
	}
	d.Log.Info("processes block the change; stopping the host GPU clients", "processes", strays, "units", d.S.HostGPUClients)
	_ = d.notify().Status("stopping host GPU clients %v", d.S.HostGPUClients)
	stopped, err := d.Units.StopActive(a.ctx, d.S.HostGPUClients)
	ch.StoppedUnits = stopped
	d.saveJournal()
	if err != nil {
		return nil, failed("stopping host GPU clients", err)
	}
	if len(stopped) == 0 {
		return strays, nil
	}
	left, err := gpus.Blockers(d.GPU, a.v.n, a.v.plan)
	if err != nil {
		return nil, failed("listing GPU processes", err)
	}
	return left, nil
}
