package e2e

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/testkit/kubetest"
)

// pluginReader enumerates the simulated GPUs for the device plugin
// stand-in (kubetest.PluginGPUsOf).
func pluginReader(t testing.TB, o *Opts) func() ([]kubetest.PluginGPU, error) {
	return func() ([]kubetest.PluginGPU, error) {
		out, errOut, code := RunCLI(t, "profiles", "-o", "json", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState, "--log-level", "error")
		if code != 0 {
			return nil, fmt.Errorf("profiles: exit %d: %s", code, errOut)
		}
		return kubetest.PluginGPUsOf([]byte(out))
	}
}

func allocatable(t testing.TB, c kubernetes.Interface, node string) map[string]int64 {
	n := GetNode(t, c, node)
	out := map[string]int64{}
	for r, q := range n.Status.Allocatable {
		if strings.HasPrefix(string(r), "nvidia.com/") {
			out[string(r)] = q.Value()
		}
	}
	return out
}

func sameCounts(a, b map[string]int64) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

// The scenarios of one node with NVIDIA's device plugin run on the real
// node (realnode_test.go, realnode_operands_test.go: the plugin restarted
// after a change, a plugin the agent may not restart, a plugin under labels
// of its own, its sharing configs through the GPU Operator's
// config-manager). The helpers above serve the scenarios of several nodes,
// which keep the stand-in plugin.
