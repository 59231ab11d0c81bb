package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/internal/kubetest"
	"github.com/migagent/mig-agent/record"
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
// of its own). What stays here is the GPU Operator's config-manager path:
// the plugin's sharing config chosen by the node's
// nvidia.com/device-plugin.config label from the ConfigMap the Operator
// mounts, which the real node does not run (its plugin reads its config
// file directly).

// The device plugin shares MIG devices (time-slicing, as its config says):
// it advertises replicas per device, or renamed ".shared" resources. The
// agent reads the same config the plugin's config-manager picks (the
// node's nvidia.com/device-plugin.config label, the ConfigMap in the
// plugin's pod) and succeeds on exactly those counts.
func TestSharingDevicePluginConverges(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/mig.strategy": "mixed", "nvidia.com/device-plugin.config": "replicas"})
	ns := kubetest.NewName(t, "gpu-operator")
	kubetest.CreateNamespace(t, ns)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "time-slicing-config"}, Data: map[string]string{
		"replicas": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/mig-1g.18gb\n      replicas: 4\n",
		"renamed":  "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: mig-2g.35gb\n      replicas: 2\n",
	}}
	if _, err := c.CoreV1().ConfigMaps(ns).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	o := (&Opts{Node: node, Sim: "h200x1"}).Fill(t)
	dp := kubetest.StartSharingDevicePlugin(t, c, node, ns, "mixed", kubetest.PluginConfig{ConfigMap: cm.Name}, pluginReader(t, o))
	WaitFor(t, 60*time.Second, "the device plugin pod to run, counted by its DaemonSet", dp.Counted)
	o.Extra = append(o.Extra, "--resource-wait-timeout", "60s", "--operand-namespace", ns)
	StartAgent(t, o)

	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 90*time.Second)
	if got, want := allocatable(t, c, node), map[string]int64{"nvidia.com/mig-1g.18gb": 28, "nvidia.com/gpu": 0}; !sameCounts(got, want) {
		t.Errorf("allocatable = %v, want %v (plugin: %s)", got, want, dp)
	}
	if rec.ResourcesConverged == nil || !*rec.ResourcesConverged {
		t.Errorf("record resourcesConverged = %v, want true", rec.ResourcesConverged)
	}

	// The node switches to the renamed config (the config-manager picks it
	// up when the plugin restarts) and to 2g.35gb devices: the plugin
	// advertises nvidia.com/mig-2g.35gb.shared, 3 devices × 2.
	SetLabel(t, c, node, "nvidia.com/device-plugin.config", "renamed", "gpu-admin")
	SelectConfig(t, c, node, "all-2g.35gb")
	rec = WaitState(t, c, node, record.StateSuccess, "all-2g.35gb", 90*time.Second)
	if got, want := allocatable(t, c, node), map[string]int64{"nvidia.com/mig-2g.35gb.shared": 6, "nvidia.com/mig-1g.18gb": 0, "nvidia.com/gpu": 0}; !sameCounts(got, want) {
		t.Errorf("allocatable = %v, want %v (plugin: %s)", got, want, dp)
	}
	if rec.ResourcesConverged == nil || !*rec.ResourcesConverged {
		t.Errorf("record resourcesConverged = %v, want true", rec.ResourcesConverged)
	}
}
