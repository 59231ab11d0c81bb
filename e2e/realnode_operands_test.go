package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
	"github.com/migagent/mig-agent/testkit/realnode"
)

// The operands on the real node: NVIDIA's device plugin and the GPU
// Operator's validator, restarted by the agent after a change; a plugin
// the agent may not restart; a plugin installed under labels of its own.

// operandPod runs a DaemonSet named app in the plugin's namespace on the
// node (the real kubelet runs its pod) and returns the pod once it runs.
func (n *realGPUNode) operandPod(t *testing.T, app string) corev1.Pod {
	t.Helper()
	labels := map[string]string{"app": app}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: n.PluginNS, Name: app},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				SchedulerName:                 kubetest.SchedulerName,
				NodeSelector:                  map[string]string{corev1.LabelHostname: n.Name},
				Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers:                    []corev1.Container{{Name: app, Image: realnode.SleepImage, ImagePullPolicy: corev1.PullNever, Args: []string{app}}},
			}},
		},
	}
	if _, err := n.Client.AppsV1().DaemonSets(n.PluginNS).Create(context.Background(), ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	WaitFor(t, 60*time.Second, "the "+app+" pod running", func() bool {
		var ok bool
		pod, ok = n.runningPod(t, "app="+app)
		return ok
	})
	return pod
}

// runningPod is the running pod of the plugin's namespace on the node
// that selector selects.
func (n *realGPUNode) runningPod(t *testing.T, selector string) (corev1.Pod, bool) {
	t.Helper()
	list, err := n.Client.CoreV1().Pods(n.PluginNS).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName == n.Name && p.Status.Phase == corev1.PodRunning {
			return p, true
		}
	}
	return corev1.Pod{}, false
}

// TestRealNodeOperandsRestartedBackToWholeGPUs: two whole H200s go to
// fourteen 1g.18gb devices and back. After each change the agent restarts
// NVIDIA's plugin and the GPU Operator's validator (DaemonSet pods the
// real kubelet runs), says so in an Event naming them, and reports
// success only once the kubelet's allocatable is exactly the new
// resources (the metric agrees). Back on whole GPUs, a pod asking for one
// is admitted by the kubelet with the plugin's Allocate, which for whole
// GPUs goes through GetPreferredAllocation and the GPUs' topology.
func TestRealNodeOperandsRestartedBackToWholeGPUs(t *testing.T) {
	n := startRealGPUNode(t, "h200x2", defaultConfigs, "all-disabled", "mixed", "")
	n.waitAllocatable(t, map[string]int64{"nvidia.com/gpu": 2}, 90*time.Second)
	c := n.Client
	validator := n.operandPod(t, "nvidia-operator-validator")
	plugin := n.pluginPods(t)
	a := n.startAgent(t, defaultConfigs)
	SelectConfig(t, c, n.Name, "all-1g.18gb")
	rec := WaitState(t, c, n.Name, record.StateSuccess, "all-1g.18gb", 2*time.Minute)
	if got, want := gpuAllocatable(GetNode(t, c, n.Name)), map[string]int64{"nvidia.com/mig-1g.18gb": 14}; !sameCounts(got, want) || len(got) != len(want) {
		t.Errorf("allocatable at success %v, want %v", got, want)
	}
	if rec.ResourcesConverged == nil || !*rec.ResourcesConverged {
		t.Errorf("record resourcesConverged = %v, want true", rec.ResourcesConverged)
	}
	if m := a.Scrape(t); !strings.Contains(m, "migagent_resources_converged 1\n") {
		t.Errorf("metrics lack migagent_resources_converged 1")
	}
	if !n.pluginReplaced(t, plugin) {
		t.Errorf("plugin pods before %d, after %d: want one, a new one", len(plugin), len(n.pluginPods(t)))
	}
	WaitFor(t, 30*time.Second, "the validator restarted", func() bool {
		p, ok := n.runningPod(t, "app=nvidia-operator-validator")
		return ok && p.UID != validator.UID
	})
	WaitFor(t, 10*time.Second, "the "+record.ReasonDevicePluginRestarted+" Event", func() bool {
		return len(nodeEvents(t, c, n.Name, record.ReasonDevicePluginRestarted)) == 1
	})
	if ev := nodeEvents(t, c, n.Name, record.ReasonDevicePluginRestarted); !strings.Contains(ev[0].Message, validator.Name) {
		t.Errorf("the Event does not name the validator: %q", ev[0].Message)
	}

	SelectConfig(t, c, n.Name, "all-disabled")
	WaitState(t, c, n.Name, record.StateSuccess, "all-disabled", 2*time.Minute)
	if got := gpuAllocatable(GetNode(t, c, n.Name)); !sameCounts(got, map[string]int64{"nvidia.com/gpu": 2}) || len(got) != 1 {
		t.Errorf("allocatable after going back to whole GPUs: %v", got)
	}
	ns := kubetest.NewName(t, "work")
	kubetest.CreateNamespace(t, ns)
	dev := n.runGPUPod(t, ns, "whole", "nvidia.com/gpu")
	if !strings.HasPrefix(dev, "GPU-") {
		t.Errorf("the whole-GPU pod got %q from Allocate, want a GPU UUID", dev)
	}
}

// TestRealNodeStalePluginIsNoSuccess: with --restart-device-plugin=false
// NVIDIA's plugin keeps advertising the whole GPU it enumerated at its
// start. The agent does not take that for success: it fails naming what
// the Node lacks, the metric says so, and when someone restarts the plugin
// by hand the retry succeeds.
func TestRealNodeStalePluginIsNoSuccess(t *testing.T) {
	n := startRealGPUNode(t, "h200x1", defaultConfigs, "all-disabled", "mixed", "")
	n.waitAllocatable(t, map[string]int64{"nvidia.com/gpu": 1}, 90*time.Second)
	c := n.Client
	plugin := n.pluginPods(t)
	a := n.startAgent(t, defaultConfigs, "--resource-wait-timeout", "5s", "--restart-device-plugin=false")
	SelectConfig(t, c, n.Name, "all-1g.18gb")
	rec := WaitState(t, c, n.Name, record.StateFailed, "all-1g.18gb", 90*time.Second)
	if !strings.Contains(rec.Reason, "allocatable did not show exactly") || !strings.Contains(rec.Reason, "nvidia.com/mig-1g.18gb: have 0, want 7") {
		t.Errorf("reason = %q", rec.Reason)
	}
	if m := a.Scrape(t); !strings.Contains(m, "migagent_resources_converged 0\n") {
		t.Errorf("metrics lack migagent_resources_converged 0")
	}
	if !n.pluginKept(t, plugin) {
		t.Fatalf("plugin pods %d, want the same one (not restarted)", len(n.pluginPods(t)))
	}
	if err := c.CoreV1().Pods(n.PluginNS).Delete(context.Background(), plugin[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	WaitState(t, c, n.Name, record.StateSuccess, "all-1g.18gb", 2*time.Minute)
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb": 7}, 10*time.Second)
}

// TestRealNodeRenamedPluginRestarted: NVIDIA's plugin installed under
// labels of its own (a self-installed DaemonSet) is named by
// --operand-selector; the agent restarts it after the change and takes the
// allocatable only from the new pod.
func TestRealNodeRenamedPluginRestarted(t *testing.T) {
	n := startRealGPUNode(t, "h200x1", defaultConfigs, "all-disabled", "mixed", "",
		withPluginLabels(map[string]string{"app": "my-gpu-plugin"}))
	n.waitAllocatable(t, map[string]int64{"nvidia.com/gpu": 1}, 90*time.Second)
	c := n.Client
	plugin := n.pluginPods(t)
	n.startAgent(t, defaultConfigs, "--operand-selector", "device-plugin=app=my-gpu-plugin")
	SelectConfig(t, c, n.Name, "all-1g.18gb")
	WaitState(t, c, n.Name, record.StateSuccess, "all-1g.18gb", 2*time.Minute)
	if got := gpuAllocatable(GetNode(t, c, n.Name)); !sameCounts(got, map[string]int64{"nvidia.com/mig-1g.18gb": 7}) || len(got) != 1 {
		t.Errorf("allocatable at success %v", got)
	}
	if !n.pluginReplaced(t, plugin) {
		t.Errorf("plugin pods before %d, after %d: want one, a new one", len(plugin), len(n.pluginPods(t)))
	}
}

// TestRealNodeConfigManagerSharing: the GPU Operator's devicePlugin.config
// path, with NVIDIA's config-manager as its init container and sidecar.
// The node's nvidia.com/device-plugin.config label picks time-slicing with
// 4 replicas of each 1g.18gb: the agent reads the config the
// config-manager picked and succeeds on exactly 7 devices x 4. The label
// then moves to a config that shares 2g.35gb devices 2 ways under
// renameByDefault: the sidecar rewrites the plugin's config and signals it
// (the plugin restarts itself in its pod: 7 unshared 1g.18gb), and the
// change to 2g.35gb devices succeeds on exactly
// nvidia.com/mig-2g.35gb.shared 3 x 2.
func TestRealNodeConfigManagerSharing(t *testing.T) {
	configs := map[string]string{
		"replicas": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/mig-1g.18gb\n      replicas: 4\n",
		"renamed":  "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: mig-2g.35gb\n      replicas: 2\n",
	}
	n := startRealGPUNode(t, "h200x1", defaultConfigs, "all-disabled", "mixed", "",
		withNodeLabel("nvidia.com/device-plugin.config", "replicas"), withConfigManager(configs, ""))
	n.waitAllocatable(t, map[string]int64{"nvidia.com/gpu": 1}, 90*time.Second)
	c := n.Client
	a := n.startAgent(t, defaultConfigs)
	SelectConfig(t, c, n.Name, "all-1g.18gb")
	rec := WaitState(t, c, n.Name, record.StateSuccess, "all-1g.18gb", 2*time.Minute)
	if got := gpuAllocatable(GetNode(t, c, n.Name)); !sameCounts(got, map[string]int64{"nvidia.com/mig-1g.18gb": 28}) || len(got) != 1 {
		t.Errorf("allocatable at success %v, want mig-1g.18gb 28 (7 devices x 4 replicas)", got)
	}
	if rec.ResourcesConverged == nil || !*rec.ResourcesConverged {
		t.Errorf("record resourcesConverged = %v, want true", rec.ResourcesConverged)
	}
	if strings.Contains(a.Log(), "sharing config is not known") {
		t.Errorf("the agent did not know the config the config-manager picked")
	}
	plugin := n.pluginPods(t)
	SetLabel(t, c, n.Name, "nvidia.com/device-plugin.config", "renamed", "platform-team")
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb": 7}, 60*time.Second)
	if !n.pluginKept(t, plugin) {
		t.Errorf("the plugin pod changed on a config label change: the sidecar signals the plugin in its pod")
	}
	SelectConfig(t, c, n.Name, "all-2g.35gb")
	WaitState(t, c, n.Name, record.StateSuccess, "all-2g.35gb", 2*time.Minute)
	if got := gpuAllocatable(GetNode(t, c, n.Name)); !sameCounts(got, map[string]int64{"nvidia.com/mig-2g.35gb.shared": 6}) || len(got) != 1 {
		t.Errorf("allocatable at success %v, want mig-2g.35gb.shared 6", got)
	}
}
