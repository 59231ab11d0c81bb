package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// defaultConfigs is NVIDIA's config-default.yaml (all-1g.18gb, ...).
var defaultConfigs = filepath.Join("..", "geometry", "testdata", "config-default.yaml")

// TestRealNodeLabelChangeEvictsOnlyDestroyedDevices: on a real kubelet
// with NVIDIA's device plugin, fourteen pods hold the fourteen 1g.18gb MIG
// devices of two H200s, each handed out by the plugin's Allocate and
// recorded by the kubelet. GPU 0 goes to four 1g.18gb and a 3g.71gb: the
// agent evicts exactly the three pods whose devices the change destroys
// (read from the kubelet's own PodResources), the other eleven keep
// running, and `success` comes when the kubelet's allocatable, from the
// restarted plugin, is exactly eleven 1g.18gb and one 3g.71gb.
func TestRealNodeLabelChangeEvictsOnlyDestroyedDevices(t *testing.T) {
	n := startRealGPUNode(t, "h200x2", defaultConfigs, "all-1g.18gb", "mixed", "")
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb": 14}, 90*time.Second)
	c := n.Client
	ctx := context.Background()
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	for i := range 14 {
		if _, err := c.CoreV1().Pods(ns).Create(ctx, n.gpuPod(ns, fmt.Sprintf("w%02d", i), "nvidia.com/mig-1g.18gb"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitPodsRunning(t, n, ns, 14, 3*time.Minute)
	held := n.podDevices(t, ns)
	before := disProfiles(t, n.Spec, n.State)
	destroyed := map[string]bool{}
	for k, uuid := range disMIGUUIDs(before[0]) {
		if k == "1g.18gb@4" || k == "1g.18gb@5" || k == "1g.18gb@6" {
			destroyed[uuid] = true
		}
	}
	var want []string
	for pod, devs := range held {
		if len(devs) != 1 {
			t.Fatalf("pod %s holds %v, want one MIG device", pod, devs)
		}
		if destroyed[devs[0]] {
			want = append(want, ns+"/"+pod)
		}
	}
	slices.Sort(want)
	if len(held) != 14 || len(want) != 3 {
		t.Fatalf("the kubelet lists %d pods with devices, %d of them on the devices the change destroys (want 14 and 3): %v", len(held), len(want), held)
	}

	cfg := disConfig(t, `version: v1
mig-configs:
  gpu0-mixed:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "1g.18gb": 4
        "3g.71gb": 1
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "1g.18gb": 7
`)
	n.startAgent(t, cfg)
	t0 := time.Now()
	SelectConfig(t, c, n.Name, "gpu0-mixed")
	rec := WaitState(t, c, n.Name, record.StateSuccess, "gpu0-mixed", 4*time.Minute)
	took := time.Since(t0)
	if got := slices.Sorted(slices.Values(rec.EvictedPods)); !slices.Equal(got, want) {
		t.Errorf("evicted %v, want the pods on the destroyed devices %v", got, want)
	}
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb": 11, "nvidia.com/mig-3g.71gb": 1}, 10*time.Second)
	live := disLivePods(t, c, ns)
	if len(live) != 11 {
		t.Errorf("%d pods left running, want 11: %v", len(live), live)
	}
	for _, p := range want {
		if slices.Contains(live, p[len(ns)+1:]) {
			t.Errorf("evicted pod %s still runs", p)
		}
	}
	t.Logf("SCENARIO real kubelet + NVIDIA device plugin v0.17.4: GPU 0 7x1g.18gb -> 4x1g.18gb+3g.71gb in %s: %d of 14 pods evicted; allocatable from the restarted plugin exact at success",
		took.Round(time.Millisecond), len(rec.EvictedPods))
}

// waitPodsRunning waits until want pods of ns run on the node.
func waitPodsRunning(t *testing.T, n *realGPUNode, ns string, want int, timeout time.Duration) {
	t.Helper()
	running := 0
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		list, err := n.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			continue
		}
		running = 0
		for _, p := range list.Items {
			if p.Status.Phase == "Running" && p.DeletionTimestamp == nil {
				running++
			}
		}
		if running == want {
			return
		}
	}
	t.Fatalf("%d pods of %s running after %s, want %d", running, ns, timeout, want)
}

// visibleDevices is what NVIDIA's plugin's Allocate gave the pod's
// container: NVIDIA_VISIBLE_DEVICES as the container printed it.
func (n *realGPUNode) visibleDevices(t *testing.T, ns, name string) string {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		pod, err := n.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		log, err := n.ContainerLog(pod, "sleep")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(log, "\n") {
			if _, v, ok := strings.Cut(l, "NVIDIA_VISIBLE_DEVICES="); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	t.Fatalf("pod %s/%s printed no NVIDIA_VISIBLE_DEVICES", ns, name)
	return ""
}

// runGPUPod creates a pod asking for one res and waits until it runs; it
// returns the device the plugin's Allocate gave it.
func (n *realGPUNode) runGPUPod(t *testing.T, ns, name, res string) string {
	t.Helper()
	if _, err := n.Client.CoreV1().Pods(ns).Create(context.Background(), n.gpuPod(ns, name, res), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return n.visibleDevices(t, ns, name)
}

// uuidsOf lists the MIG device UUIDs (or the GPU's, MIG off) of every GPU.
func uuidsOf(gpus []disGPU) map[string]string {
	out := map[string]string{}
	for _, g := range gpus {
		if len(g.Instances) == 0 {
			out[g.UUID] = fmt.Sprintf("GPU %d", g.Index)
		}
		for k, u := range disMIGUUIDs(g) {
			out[u] = fmt.Sprintf("GPU %d %s", g.Index, k)
		}
	}
	return out
}

// TestRealNodeSwapWaitsForTheNewPlugin is round 4's stale-allocatable trap
// on the real node: two H200s swap roles (MIG off and 7x1g.18gb), so the
// Node's allocatable is nvidia.com/gpu 1 and nvidia.com/mig-1g.18gb 7
// before and after, and the old plugin's figures already match. While the
// new plugin pod is held before NVIDIA's plugin runs, no success; once it
// runs, success, and a pod asking for each resource then gets a device of
// the new geometry from the kubelet (not a UUID the change destroyed).
func TestRealNodeSwapWaitsForTheNewPlugin(t *testing.T) {
	file := fpConfigs(t, fpSwap)
	n := startRealGPUNode(t, "h200x2", file, "before", "mixed", "")
	same := map[string]int64{"nvidia.com/gpu": 1, "nvidia.com/mig-1g.18gb": 7}
	n.waitAllocatable(t, same, 90*time.Second)
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	before := uuidsOf(disProfiles(t, n.Spec, n.State))
	for _, p := range []struct{ name, res string }{{"whole", "nvidia.com/gpu"}, {"mig", "nvidia.com/mig-1g.18gb"}} {
		if dev := n.runGPUPod(t, ns, p.name, p.res); before[dev] == "" {
			t.Fatalf("pod %s got %q from Allocate, not a device of the node", p.name, dev)
		}
	}
	n.startAgent(t, file)
	old := n.pluginPods(t)
	n.holdPluginStarts(t)
	SelectConfig(t, n.Client, n.Name, "after")
	WaitFor(t, 60*time.Second, "the agent to restart the device plugin", func() bool { return n.pluginReplaced(t, old) })
	fpNeverSuccess(t, n.Name, 8*time.Second, "while the new plugin pod has not started NVIDIA's plugin (the old plugin's figures match the new geometry)")
	n.releasePluginStarts(t)
	rec := WaitState(t, n.Client, n.Name, record.StateSuccess, "after", 90*time.Second)
	if got := slices.Sorted(slices.Values(rec.EvictedPods)); !slices.Equal(got, []string{ns + "/mig", ns + "/whole"}) {
		t.Errorf("evicted %v, want both pods (both GPUs changed)", got)
	}
	n.waitAllocatable(t, same, 10*time.Second)
	after := uuidsOf(disProfiles(t, n.Spec, n.State))
	for _, p := range []struct{ name, res, want string }{{"whole2", "nvidia.com/gpu", "GPU 1"}, {"mig2", "nvidia.com/mig-1g.18gb", "GPU 0 1g.18gb"}} {
		dev := n.runGPUPod(t, ns, p.name, p.res)
		if !strings.HasPrefix(after[dev], p.want) {
			t.Errorf("after the change, pod %s (%s) got %q (%s), want a device of %s", p.name, p.res, dev, before[dev], p.want)
		}
	}
}

// TestRealNodeSingleStrategy: NVIDIA's plugin in the single strategy
// advertises every MIG device as nvidia.com/gpu. all-1g.18gb to
// all-3g.71gb on one H200: the pod on a destroyed device is evicted and
// success comes with nvidia.com/gpu 2 from the restarted plugin.
func TestRealNodeSingleStrategy(t *testing.T) {
	n := startRealGPUNode(t, "h200x1", defaultConfigs, "all-1g.18gb", "single", "")
	n.waitAllocatable(t, map[string]int64{"nvidia.com/gpu": 7}, 90*time.Second)
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	n.runGPUPod(t, ns, "w", "nvidia.com/gpu")
	n.startAgent(t, defaultConfigs)
	SelectConfig(t, n.Client, n.Name, "all-3g.71gb")
	rec := WaitState(t, n.Client, n.Name, record.StateSuccess, "all-3g.71gb", 2*time.Minute)
	if !slices.Equal(rec.EvictedPods, []string{ns + "/w"}) {
		t.Errorf("evicted %v, want %s/w", rec.EvictedPods, ns)
	}
	n.waitAllocatable(t, map[string]int64{"nvidia.com/gpu": 2}, 10*time.Second)
}

// TestRealNodeTimeSlicingWaitsForTheNewPlugin: NVIDIA's plugin shares each
// 1g.18gb device twice (its own config file, time-slicing replicas 2; the
// agent cannot read a file in the plugin's pod, so it takes the plugin's
// documented forms). {1g:4, 3g:1} to {1g:2, 3g:1}: the old plugin's
// mig-1g.18gb 8 reads as the new two devices x 4 replicas, so success must
// wait for the new plugin; then allocatable is mig-1g.18gb 4, mig-3g.71gb 1.
func TestRealNodeTimeSlicingWaitsForTheNewPlugin(t *testing.T) {
	file := fpConfigs(t, `  four:
  - devices: all
    mig-enabled: true
    mig-devices: {"1g.18gb": 4, "3g.71gb": 1}
  two:
  - devices: all
    mig-enabled: true
    mig-devices: {"1g.18gb": 2, "3g.71gb": 1}
`)
	n := startRealGPUNode(t, "h200x1", file, "four", "mixed", timeSlicing(false))
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb": 8, "nvidia.com/mig-3g.71gb": 1}, 90*time.Second)
	a := n.startAgent(t, file)
	old := n.pluginPods(t)
	n.holdPluginStarts(t)
	SelectConfig(t, n.Client, n.Name, "two")
	WaitFor(t, 60*time.Second, "the agent to restart the device plugin", func() bool { return n.pluginReplaced(t, old) })
	fpNeverSuccess(t, n.Name, 8*time.Second, "on the old plugin's mig-1g.18gb 8, read as 2 devices x 4 replicas")
	n.releasePluginStarts(t)
	WaitState(t, n.Client, n.Name, record.StateSuccess, "two", 90*time.Second)
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb": 4, "nvidia.com/mig-3g.71gb": 1}, 10*time.Second)
	if !strings.Contains(a.Log(), "sharing config is not known") {
		t.Errorf("the agent did not take the plugin's sharing config as unknown")
	}
}

// TestRealNodeSharingRenamesResources: with renameByDefault, NVIDIA's
// plugin advertises time-sliced MIG devices as nvidia.com/mig-1g.18gb.shared
// (replicas 2). all-1g.18gb (.shared 14) to {1g:4, 3g:1} on one H200:
// success comes with exactly mig-1g.18gb.shared 8 and mig-3g.71gb 1, and a
// pod asking for the shared resource is admitted with a new device.
func TestRealNodeSharingRenamesResources(t *testing.T) {
	file := fpConfigs(t, `  mixed:
  - devices: all
    mig-enabled: true
    mig-devices: {"1g.18gb": 4, "3g.71gb": 1}
`)
	n := startRealGPUNode(t, "h200x1", defaultConfigs, "all-1g.18gb", "mixed", timeSlicing(true))
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb.shared": 14}, 90*time.Second)
	n.startAgent(t, file)
	SelectConfig(t, n.Client, n.Name, "mixed")
	WaitState(t, n.Client, n.Name, record.StateSuccess, "mixed", 2*time.Minute)
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb.shared": 8, "nvidia.com/mig-3g.71gb": 1}, 10*time.Second)
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	after := uuidsOf(disProfiles(t, n.Spec, n.State))
	dev := n.runGPUPod(t, ns, "shared", "nvidia.com/mig-1g.18gb.shared")
	if !strings.HasPrefix(after[dev], "GPU 0 1g.18gb") {
		t.Errorf("the shared pod got %q, want a 1g.18gb device of the new geometry", dev)
	}
}

// timeSlicing is NVIDIA's device plugin config file sharing each 1g.18gb
// MIG device twice (the plugin's documented time-slicing format).
func timeSlicing(rename bool) string {
	return fmt.Sprintf(`version: v1
sharing:
  timeSlicing:
    renameByDefault: %v
    resources:
    - name: nvidia.com/mig-1g.18gb
      replicas: 2
`, rename)
}

// TestRealNodePlannerPodAdmitted: a pod asks for a 3g.71gb MIG device that
// no node offers; the planner reshapes the idle, opted-in real node, the
// agent applies it and restarts NVIDIA's plugin, the scheduler binds the
// pod once the kubelet advertises the new device, and the kubelet admits
// it with the plugin's Allocate: the container gets a 3g.71gb device of
// the new geometry.
func TestRealNodePlannerPodAdmitted(t *testing.T) {
	cfg := disConfig(t, plannerConfigs)
	n := startRealGPUNode(t, "h200x1", cfg, "all-1g.18gb", "mixed", "")
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb": 7}, 90*time.Second)
	SetLabel(t, n.Client, n.Name, "migagent.io/planner", "enabled", "platform-team")
	n.startAgent(t, cfg, "--assignment-interval", "0") // its records in the default namespace, mig-agent-e2e
	ns := kubetest.NewName(t, "work")
	kubetest.CreateNamespace(t, ns)
	pod, err := n.Client.CoreV1().Pods(ns).Create(context.Background(), n.gpuPod(ns, "big", "nvidia.com/mig-3g.71gb"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitUnschedulable(t, n.Client, pod, 0)
	port := freePort(t)
	start := time.Now()
	startProcess(t, []string{"planner", "--kubeconfig", kubetest.Kubeconfig(), "--namespace", "mig-agent-e2e", "-f", cfg,
		"--allowed-configs", "all-1g.18gb,all-3g.71gb", "--planner-interval", "500ms", "--max-concurrent", "1",
		"--lease-duration", "15s", "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port)}, fmt.Sprintf("http://127.0.0.1:%d", port))
	dev := n.visibleDevices(t, ns, "big")
	took := time.Since(start)
	after := uuidsOf(disProfiles(t, n.Spec, n.State))
	if !strings.HasPrefix(after[dev], "GPU 0 3g.71gb") {
		t.Errorf("the planned pod got %q from Allocate, want a 3g.71gb device of the new geometry (%v)", dev, after)
	}
	if got := GetNode(t, n.Client, n.Name).Labels[record.LabelConfig]; got != "all-3g.71gb" {
		t.Errorf("node config label %q, want all-3g.71gb (the planner's)", got)
	}
	t.Logf("SCENARIO planner on the real node: pending 3g.71gb pod running with its device %s after the planner started", took.Round(100*time.Millisecond))
}

// TestRealNodePluginNeverBackFailsThenRetries: the restarted plugin pod
// runs but NVIDIA's plugin never starts in it (held): no success on the
// old figures (they match the new geometry), `failed` after
// --resource-wait-timeout with a reason naming what the Node lacks, the
// node untainted; once the plugin runs, the retry succeeds by itself.
func TestRealNodePluginNeverBackFailsThenRetries(t *testing.T) {
	file := fpConfigs(t, fpSwap)
	n := startRealGPUNode(t, "h200x2", file, "before", "mixed", "")
	n.waitAllocatable(t, map[string]int64{"nvidia.com/gpu": 1, "nvidia.com/mig-1g.18gb": 7}, 90*time.Second)
	n.startAgent(t, file, "--resource-wait-timeout", "15s")
	n.holdPluginStarts(t)
	start := time.Now()
	SelectConfig(t, n.Client, n.Name, "after")
	rec := WaitState(t, n.Client, n.Name, record.StateFailed, "after", 90*time.Second)
	if took := time.Since(start); took < 15*time.Second {
		t.Errorf("failed after %s, before the resource wait timeout", took)
	}
	if !strings.Contains(rec.Reason, "did not show exactly its resources within 15s") {
		t.Errorf("reason = %q", rec.Reason)
	}
	for _, taint := range GetNode(t, n.Client, n.Name).Spec.Taints {
		if taint.Key == record.TaintReconfiguring {
			t.Errorf("node left tainted: %v", taint)
		}
	}
	n.releasePluginStarts(t)
	WaitState(t, n.Client, n.Name, record.StateSuccess, "after", 2*time.Minute)
	n.waitAllocatable(t, map[string]int64{"nvidia.com/gpu": 1, "nvidia.com/mig-1g.18gb": 7}, 10*time.Second)
}
