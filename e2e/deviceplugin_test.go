package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/internal/kubetest"
	"github.com/migagent/mig-agent/record"
)

// operandDaemonSet creates a DaemonSet app in ns whose pods run on node
// only (labels app=app) and returns the pod the DaemonSet controller made
// there, bound and running: an operand pod, as the GPU Operator's are.
func operandDaemonSet(t *testing.T, c kubernetes.Interface, ns, node, app string) *corev1.Pod {
	t.Helper()
	labels := map[string]string{"app": app}
	_, err := c.AppsV1().DaemonSets(ns).Create(context.Background(), &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: app},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
						{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}},
				Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				TerminationGracePeriodSeconds: new(int64),
				Containers:                    []corev1.Container{{Name: app, Image: "nvcr.io/nvidia/gpu-operator:v26.7.0"}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The DaemonSet controller makes the pod; the test binds it, as the
	// scheduler would, and runs it, as the kubelet would.
	return gpuOpBindOperandPod(t, c, ns, node, app)
}

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

// NVIDIA's device plugin sees MIG devices only when it starts: after a
// change the agent restarts it (its DaemonSet, run by the real DaemonSet
// controller, brings a new pod) and reports success only once the Node's
// allocatable shows exactly the new geometry.
func TestDevicePluginRestartedAfterChange(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/mig.strategy": "mixed"})
	ns := kubetest.NewName(t, "gpu-operator")
	kubetest.CreateNamespace(t, ns)
	o := (&Opts{Node: node, Sim: "h200x2"}).Fill(t)
	dp := kubetest.StartDevicePlugin(t, c, node, ns, "mixed", pluginReader(t, o))
	WaitFor(t, 60*time.Second, "the device plugin pod to run, counted by its DaemonSet", dp.Counted)
	// The kubelet writes the plugin's devices into the Node's status on its
	// own schedule, not with the pod's: wait for them as a user would.
	WaitFor(t, 30*time.Second, "the Node's allocatable to show the whole GPUs", func() bool {
		return sameCounts(allocatable(t, c, node), map[string]int64{"nvidia.com/gpu": 2})
	})
	// The GPU Operator's validator runs on the node: NVIDIA's MIG manager
	// restarts it after a change (restartValidatorPod); so does the agent.
	// It is a DaemonSet's pod, as every operand is (the agent takes no
	// other pod for one).
	validator := operandDaemonSet(t, c, ns, node, "nvidia-operator-validator")
	o.Extra = append(o.Extra, "--resource-wait-timeout", "60s", "--operand-namespace", ns)
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 90*time.Second)
	WaitFor(t, 10*time.Second, "the validator pod restarted (evicted)", func() bool {
		p, err := c.CoreV1().Pods(ns).Get(context.Background(), validator.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || err == nil && p.UID != validator.UID
	})
	want := map[string]int64{"nvidia.com/mig-1g.18gb": 14, "nvidia.com/gpu": 0}
	if got := allocatable(t, c, node); !sameCounts(got, want) {
		t.Errorf("allocatable at success = %v, want %v (plugin: %s)", got, want, dp)
	}
	if rec.ResourcesConverged == nil || !*rec.ResourcesConverged {
		t.Errorf("record resourcesConverged = %v, want true", rec.ResourcesConverged)
	}
	if dp.Starts() != 2 {
		t.Errorf("device plugin started %d times, want 2 (once before, once after the change)", dp.Starts())
	}
	if m := a.Scrape(t); !strings.Contains(m, "migagent_resources_converged 1\n") {
		t.Errorf("metrics lack migagent_resources_converged 1")
	}
	WaitFor(t, 10*time.Second, "the "+record.ReasonDevicePluginRestarted+" Event", func() bool {
		return len(nodeEvents(t, c, node, record.ReasonDevicePluginRestarted)) == 1
	})
	if ev := nodeEvents(t, c, node, record.ReasonDevicePluginRestarted); !strings.Contains(ev[0].Message, validator.Name) {
		t.Errorf("the Event does not name the validator: %q", ev[0].Message)
	}

	// Back to whole GPUs: restarted once more.
	SelectConfig(t, c, node, "all-disabled")
	WaitState(t, c, node, record.StateSuccess, "all-disabled", 90*time.Second)
	if got := allocatable(t, c, node); !sameCounts(got, map[string]int64{"nvidia.com/gpu": 2, "nvidia.com/mig-1g.18gb": 0}) {
		t.Errorf("allocatable after disabling = %v", got)
	}
	if dp.Starts() != 3 {
		t.Errorf("device plugin started %d times after two changes, want 3", dp.Starts())
	}
}

// A device plugin installed with labels of its own (a renamed or
// self-installed DaemonSet) is named by --operand-selector: the agent
// restarts it after the change and takes the allocatable only from the
// new pod, as for NVIDIA's labels.
func TestRenamedDevicePluginRestarted(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/mig.strategy": "mixed"})
	ns := kubetest.NewName(t, "gpu")
	kubetest.CreateNamespace(t, ns)
	o := (&Opts{Node: node, Sim: "h200x1", Extra: []string{"--resource-wait-timeout", "60s", "--operand-namespace", ns,
		"--operand-selector", "device-plugin=app=my-gpu-plugin"}}).Fill(t)
	dp := kubetest.StartSharingDevicePlugin(t, c, node, ns, "mixed", kubetest.PluginConfig{App: "my-gpu-plugin"}, pluginReader(t, o))
	WaitFor(t, 60*time.Second, "the device plugin pod to run, counted by its DaemonSet", dp.Counted)
	WaitFor(t, 30*time.Second, "the Node's allocatable to show the whole GPU", func() bool {
		return sameCounts(allocatable(t, c, node), map[string]int64{"nvidia.com/gpu": 1})
	})
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 90*time.Second)
	if got, want := allocatable(t, c, node), map[string]int64{"nvidia.com/mig-1g.18gb": 7, "nvidia.com/gpu": 0}; !sameCounts(got, want) {
		t.Errorf("allocatable at success = %v, want %v (plugin: %s)", got, want, dp)
	}
	if rec.ResourcesConverged == nil || !*rec.ResourcesConverged || dp.Starts() != 2 {
		t.Errorf("resourcesConverged %v, plugin started %d times (want 2)", rec.ResourcesConverged, dp.Starts())
	}
}

// Without the restart (--restart-device-plugin=false) the plugin keeps
// advertising the old devices: the agent must not claim success; it fails
// with the reason, the metric says so, and the change is retried.
func TestStaleDevicePluginIsNoSuccess(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/mig.strategy": "mixed"})
	ns := kubetest.NewName(t, "gpu-operator")
	kubetest.CreateNamespace(t, ns)
	o := (&Opts{Node: node, Sim: "h200x1"}).Fill(t)
	dp := kubetest.StartDevicePlugin(t, c, node, ns, "mixed", pluginReader(t, o))
	WaitFor(t, 60*time.Second, "the device plugin pod to run, counted by its DaemonSet", dp.Counted)
	o.Extra = append(o.Extra, "--resource-wait-timeout", "3s", "--restart-device-plugin=false", "--operand-namespace", ns)
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateFailed, "all-1g.18gb", 60*time.Second)
	if !strings.Contains(rec.Reason, "allocatable did not show exactly") || !strings.Contains(rec.Reason, "nvidia.com/mig-1g.18gb: have 0, want 7") {
		t.Errorf("reason = %q", rec.Reason)
	}
	if m := a.Scrape(t); !strings.Contains(m, "migagent_resources_converged 0\n") {
		t.Errorf("metrics lack migagent_resources_converged 0")
	}
	if dp.Starts() != 1 {
		t.Errorf("device plugin started %d times, want 1", dp.Starts())
	}
	// Someone restarts the device plugin by hand: the retry sees the
	// resources and succeeds.
	pods, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + kubetest.DevicePluginApp})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("device plugin pods: %v, %v", pods, err)
	}
	if err := c.CoreV1().Pods(ns).Delete(context.Background(), pods.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 90*time.Second)
}

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
