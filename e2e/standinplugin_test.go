package e2e

import (
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/testkit/kubetest"
)

// pluginReader enumerates the simulated GPUs for the device plugin stand-in:
// a MIG device for each GPU instance `profiles` lists (each holds one
// compute instance here).
func pluginReader(t testing.TB, o *Opts) func() ([]kubetest.PluginGPU, error) {
	return func() ([]kubetest.PluginGPU, error) {
		var out []kubetest.PluginGPU
		for _, g := range disProfiles(t, o.Sim, o.SimState) {
			pg := kubetest.PluginGPU{MigEnabled: g.MigMode.Current}
			// One entry per MIG device (compute instance), named as NVML
			// names its profile: the device plugin builds one device per MIG
			// device handle, its resource named by that device's MIG
			// profile (k8s-device-plugin internal/rm, buildMigDeviceMap:
			// walkMigDevices, getMigProfile).
			for _, in := range g.Instances {
				name := in.Profile
				if in.Compute != "" {
					name = in.Compute
				}
				pg.MIGDevices = append(pg.MIGDevices, name)
			}
			out = append(out, pg)
		}
		return out, nil
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
