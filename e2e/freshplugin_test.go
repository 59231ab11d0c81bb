package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/internal/kubetest"
	"github.com/migagent/mig-agent/record"
)

// After a change, success needs the device plugin that started after it:
// the figures of the plugin that read the old geometry may already match
// the new one. The device plugin stand-in's starts are held, so that the
// only plugin that could have spoken is the old one; the kubelet stand-in
// writes the Node's status on a 2 s sync, as the kubelet does (every
// 10 s, and only what changed), so that the old figures stay on the Node
// for a while after the old plugin is gone.

// fpConfigs writes a config file with the named configs (YAML bodies).
func fpConfigs(t testing.TB, configs string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "configs.yaml")
	if err := os.WriteFile(file, []byte("version: v1\nmig-configs:\n"+configs), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// fpNeverSuccess fails the test when the node's state becomes success
// within d.
func fpNeverSuccess(t testing.TB, node string, d time.Duration, why string) {
	t.Helper()
	c := kubetest.Client(t)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if GetNode(t, c, node).Labels[record.LabelState] == record.StateSuccess {
			t.Fatalf("state success %s", why)
		}
	}
}

// fpStartPlugin runs the device plugin stand-in on node (MIG strategy
// mixed) with cfg, waits for it to advertise want, then moves its kubelet
// to a 2 s status sync.
func fpStartPlugin(t testing.TB, node string, o *Opts, cfg kubetest.PluginConfig, want map[string]int64) *kubetest.DevicePlugin {
	t.Helper()
	c := kubetest.Client(t)
	ns := kubetest.NewName(t, "gpu-operator")
	kubetest.CreateNamespace(t, ns)
	o.Extra = append(o.Extra, "--operand-namespace", ns)
	dp := kubetest.StartSharingDevicePlugin(t, c, node, ns, "mixed", cfg, pluginReader(t, o))
	WaitFor(t, 60*time.Second, "the device plugin pod to run, counted by its DaemonSet", dp.Counted)
	WaitFor(t, 30*time.Second, "the Node's allocatable to show the old geometry", func() bool {
		return sameCounts(allocatable(t, c, node), want)
	})
	dp.SetStatusSync(2 * time.Second)
	return dp
}

// fpSwap are two configs in which two H200s swap roles, the Node's
// figures the same before and after: nvidia.com/gpu 1, mig-1g.18gb 7.
const fpSwap = `  before:
  - devices: [0]
    mig-enabled: false
  - devices: [1]
    mig-enabled: true
    mig-devices: {"1g.18gb": 7}
  after:
  - devices: [0]
    mig-enabled: true
    mig-devices: {"1g.18gb": 7}
  - devices: [1]
    mig-enabled: false
`

// Two GPUs swap roles (MIG off ↔ 7×1g.18gb): nvidia.com/gpu 1 and
// nvidia.com/mig-1g.18gb 7 before and after. No success while no plugin
// pod came back; success once the new one runs and advertises.
func TestFreshPluginSwapWaitsForNewPlugin(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/mig.strategy": "mixed"})
	file := fpConfigs(t, fpSwap)
	state := flPrepareSim(t, "h200x2", "before", "-f", file)
	o := (&Opts{Node: node, Sim: "h200x2", SimState: state}).Fill(t)
	same := map[string]int64{"nvidia.com/gpu": 1, "nvidia.com/mig-1g.18gb": 7}
	dp := fpStartPlugin(t, node, o, kubetest.PluginConfig{}, same)
	o.Extra = append(o.Extra, "-f", file, "--resource-wait-timeout", "60s")
	StartAgent(t, o)
	dp.HoldStarts()
	SelectConfig(t, c, node, "after")
	WaitFor(t, 30*time.Second, "the agent to restart the device plugin", func() bool { return !dp.Running() })
	fpNeverSuccess(t, node, 6*time.Second, "with no device plugin started after the change (the old plugin's figures match the new geometry)")
	released := time.Now()
	dp.ReleaseStarts(context.Background())
	rec := WaitState(t, c, node, record.StateSuccess, "after", 60*time.Second)
	if rec.ResourcesConverged == nil || !*rec.ResourcesConverged {
		t.Errorf("record resourcesConverged = %v, want true", rec.ResourcesConverged)
	}
	if dp.Starts() != 2 {
		t.Errorf("device plugin started %d times, want 2", dp.Starts())
	}
	if got := allocatable(t, c, node); !sameCounts(got, same) {
		t.Errorf("allocatable = %v, want %v", got, same)
	}
	t.Logf("success %s after the new plugin pod was let start", time.Since(released).Round(100*time.Millisecond))
}

// {1g:4, 3g:1} → {1g:2, 3g:1} with the plugin's sharing config unknown to
// the agent (a config file on the host): the old 1g = 4 reads as 2 devices
// × 2 replicas. No success on those figures.
func TestFreshPluginUnknownSharingWaitsForNewPlugin(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/mig.strategy": "mixed"})
	file := fpConfigs(t, `  four:
  - devices: all
    mig-enabled: true
    mig-devices: {"1g.18gb": 4, "3g.71gb": 1}
  two:
  - devices: all
    mig-enabled: true
    mig-devices: {"1g.18gb": 2, "3g.71gb": 1}
`)
	state := flPrepareSim(t, "h200x1", "four", "-f", file)
	o := (&Opts{Node: node, Sim: "h200x1", SimState: state}).Fill(t)
	dp := fpStartPlugin(t, node, o, kubetest.PluginConfig{HostConfigFile: "/etc/nvidia-device-plugin/config.yaml"},
		map[string]int64{"nvidia.com/mig-1g.18gb": 4, "nvidia.com/mig-3g.71gb": 1})
	o.Extra = append(o.Extra, "-f", file, "--resource-wait-timeout", "60s")
	a := StartAgent(t, o)
	dp.HoldStarts()
	SelectConfig(t, c, node, "two")
	WaitFor(t, 30*time.Second, "the agent to restart the device plugin", func() bool { return !dp.Running() })
	fpNeverSuccess(t, node, 6*time.Second, "on the old plugin's 1g = 4 read as 2 devices × 2 replicas")
	dp.ReleaseStarts(context.Background())
	WaitState(t, c, node, record.StateSuccess, "two", 60*time.Second)
	if got, want := allocatable(t, c, node), map[string]int64{"nvidia.com/mig-1g.18gb": 2, "nvidia.com/mig-3g.71gb": 1}; !sameCounts(got, want) {
		t.Errorf("allocatable = %v, want %v", got, want)
	}
	if !strings.Contains(a.Log(), "sharing config is not known") {
		t.Errorf("the agent did not take the sharing config as unknown")
	}
}

// The plugin pod never comes back: failed after --resource-wait-timeout,
// the reason naming the missing plugin, the node untainted; once the
// plugin runs again, the retry succeeds (its restart of the plugin within
// one status sync leaves the figures unmoved: taken after 12 s).
func TestFreshPluginNeverBackIsNoSuccess(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/mig.strategy": "mixed"})
	file := fpConfigs(t, fpSwap)
	state := flPrepareSim(t, "h200x2", "before", "-f", file)
	o := (&Opts{Node: node, Sim: "h200x2", SimState: state}).Fill(t)
	dp := fpStartPlugin(t, node, o, kubetest.PluginConfig{}, map[string]int64{"nvidia.com/gpu": 1, "nvidia.com/mig-1g.18gb": 7})
	// Above the 12 s a plugin whose figures never moved needs (the retry's
	// restart may fit within one status sync of the kubelet's).
	o.Extra = append(o.Extra, "-f", file, "--resource-wait-timeout", "15s")
	StartAgent(t, o)
	dp.HoldStarts()
	start := time.Now()
	SelectConfig(t, c, node, "after")
	rec := WaitState(t, c, node, record.StateFailed, "after", 60*time.Second)
	took := time.Since(start)
	if took < 15*time.Second {
		t.Errorf("failed after %s, before the resource wait timeout", took)
	}
	if !strings.Contains(rec.Reason, "did not show exactly its resources within 15s") ||
		!strings.Contains(rec.Reason, "no device plugin pod started after the change is Running and Ready") {
		t.Errorf("reason = %q", rec.Reason)
	}
	for _, taint := range GetNode(t, c, node).Spec.Taints {
		if taint.Key == record.TaintReconfiguring {
			t.Errorf("node left tainted: %v", taint)
		}
	}
	dp.ReleaseStarts(context.Background())
	WaitState(t, c, node, record.StateSuccess, "after", 90*time.Second)
}
