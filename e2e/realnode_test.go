package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/internal/kubetest"
	"github.com/migagent/mig-agent/record"
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
	StartAgent(t, &Opts{Node: n.Name, Sim: n.Spec, SimState: n.State, Library: n.Lib,
		Extra: []string{"-f", cfg, "--pod-resources-socket", n.PodResourcesSocket(), "--resource-wait-timeout", "3m"}})
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
