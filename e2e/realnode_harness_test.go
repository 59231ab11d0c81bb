package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/testkit/kubetest"
	"github.com/migagent/mig-agent/testkit/realnode"
	"github.com/migagent/mig-agent/testkit/simlibtest"
)

// The real node: a real kubelet over containerd (testkit/realnode) on
// simulated GPUs, with NVIDIA's own device plugin v0.17.4, unmodified, as
// the GPU Operator v25.3.4 deploys it (assets/state-device-plugin/
// 0500_daemonset.yaml: a privileged DaemonSet pod labelled
// app=nvidia-device-plugin-daemonset on nodes labelled
// nvidia.com/gpu.deploy.device-plugin=true, the kubelet's device-plugin
// directory mounted, PASS_DEVICE_SPECS, FAIL_ON_INIT_ERROR,
// DEVICE_LIST_STRATEGY=envvar, DEVICE_ID_STRATEGY=uuid). Its container
// runs the plugin through sim-node over the simulator built as
// libnvidia-ml.so.1, on the state file the agent changes: the plugin sees
// the new geometry only when it starts again, as on a real node.
//
// Two departures from the Operator's pod, both because no driver runs
// here: the plugin finds libnvidia-ml.so.1 on sim-node's loader path
// rather than under /driver-root, and NVIDIA_DEV_ROOT names a host
// directory that holds the driver's device nodes (what a containerized
// driver's /run/nvidia/driver is), so that the kubelet can hand the
// devices the plugin names to a container.

// realGPUNode is a real node with simulated GPUs and NVIDIA's plugin.
type realGPUNode struct {
	*realnode.Node
	Spec, State, Lib string
	// PluginNS holds the plugin's DaemonSet (gpu-operator-…, an operand
	// namespace the agent is told).
	PluginNS string
	// DevRoot holds dev/nvidia* on the host for the containers.
	DevRoot string
	// PluginConfig, when set, is the plugin's config file (its sharing
	// section: time-slicing), mounted from a ConfigMap as CONFIG_FILE.
	PluginConfig string
	// PluginLabels are its pods' labels: the GPU Operator's unless a
	// test installs the plugin under labels of its own (withPluginLabels).
	PluginLabels map[string]string
	// ConfigManager, when set, runs NVIDIA's config-manager beside the
	// plugin as the GPU Operator does with devicePlugin.config
	// (withConfigManager).
	ConfigManager *configManagerSetup
	// NodeLabels are set on the Node before the plugin starts.
	NodeLabels map[string]string
	// GFD: GPU Feature Discovery and NFD run on the node (withGFD).
	GFD bool
}

// withNodeLabel sets a label on the Node before the plugin starts.
func withNodeLabel(key, value string) realNodeOption {
	return func(n *realGPUNode) {
		if n.NodeLabels == nil {
			n.NodeLabels = map[string]string{}
		}
		n.NodeLabels[key] = value
	}
}

// configManagerSetup is the GPU Operator's devicePlugin.config: the
// ConfigMap of the plugin's configs (one per key) and its default key.
type configManagerSetup struct {
	Configs map[string]string
	Default string
}

// withConfigManager runs NVIDIA's config-manager (real, v0.17.4) in the
// plugin's pod, as the GPU Operator v25.3.4 does when devicePlugin.config
// names a ConfigMap: an init container that writes the config the node's
// nvidia.com/device-plugin.config label picks (ONESHOT), and a sidecar that
// rewrites it when the label changes and sends the plugin SIGHUP
// (assets/state-device-plugin/0500_daemonset.yaml; controllers/
// object_controls.go, the plugin config's transform: DEFAULT_CONFIG,
// FALLBACK_STRATEGIES=empty, the ConfigMap at /available-configs, an
// emptyDir at /config, CONFIG_FILE=/config/config.yaml on the plugin,
// shareProcessNamespace).
func withConfigManager(configs map[string]string, def string) realNodeOption {
	return func(n *realGPUNode) { n.ConfigManager = &configManagerSetup{Configs: configs, Default: def} }
}

// realNodeOption changes how startRealGPUNode installs the plugin.
type realNodeOption func(*realGPUNode)

// withPluginLabels installs the plugin's DaemonSet with pod labels of its
// own, as a self-installed or renamed plugin is.
func withPluginLabels(labels map[string]string) realNodeOption {
	return func(n *realGPUNode) { n.PluginLabels = labels }
}

// pluginLabels are the GPU Operator's labels of the device plugin's pods.
var pluginLabels = map[string]string{"app": "nvidia-device-plugin-daemonset"}

// startRealGPUNode starts a real node whose GPUs (spec) hold config of
// file (applied through the library before the plugin starts), and
// NVIDIA's device plugin with strategy (mixed or single); it returns when
// the plugin's resources are in the Node's allocatable.
func startRealGPUNode(t *testing.T, spec, file, config, strategy, pluginConfig string, opts ...realNodeOption) *realGPUNode {
	t.Helper()
	plugin := nvidiaBin(t, "nvidia-device-plugin")
	kubetest.StartScheduler(t)
	n := &realGPUNode{Node: realnode.Start(t), Spec: spec, Lib: simlibtest.Library(t), PluginNS: kubetest.NewName(t, "gpu-operator"),
		PluginConfig: pluginConfig, PluginLabels: pluginLabels}
	for _, o := range opts {
		o(n)
	}
	n.State = filepath.Join(n.Dir, "sim", "state.json")
	n.DevRoot = filepath.Join(n.Dir, "driver")
	if err := os.MkdirAll(filepath.Dir(n.State), 0o755); err != nil {
		t.Fatal(err)
	}
	n.cli(t, "apply", "-f", file, "-c", config)
	// The driver's device nodes, as sim-node shows them, copied to the
	// host directory the plugin names as its dev root.
	cp := exec.Command(simlibtest.SimNode(t), "--state", n.State, "--spec", spec, "--",
		"sh", "-c", `mkdir -p "$1/dev" && cp -a /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia-caps /dev/nvidia[0-9]* "$1/dev/"`, "sh", n.DevRoot)
	if out, err := cp.CombinedOutput(); err != nil {
		t.Fatalf("device nodes for the dev root: %v\n%s", err, out)
	}
	n.importPluginImage(t, plugin)
	c := n.Client
	kubetest.CreateNamespace(t, n.PluginNS)
	SetLabel(t, c, n.Name, "nvidia.com/gpu.deploy.device-plugin", "true", "gpu-operator")
	for k, v := range n.NodeLabels {
		SetLabel(t, c, n.Name, k, v, "platform-team")
	}
	n.createPluginDaemonSet(t, strategy)
	if n.GFD {
		n.startGFD(t, strategy)
	} else {
		n.publishGFDLabels(t, strategy)
	}
	t.Cleanup(func() {
		if t.Failed() {
			n.explainPlugin(t)
		}
	})
	return n
}

// publishGFDLabels runs NVIDIA's GPU Feature Discovery (real, once) on the
// node's GPUs and puts its labels on the Node, as Node Feature Discovery
// does with GFD's feature file on a GPU Operator node: the agent reads the
// plugin's MIG strategy from nvidia.com/mig.strategy. NFD itself is the
// stand-in here (one copy at start; it does not follow later changes).
func (n *realGPUNode) publishGFDLabels(t *testing.T, strategy string) {
	t.Helper()
	out := filepath.Join(n.Dir, "gfd-labels")
	cmd := exec.Command(simlibtest.SimNode(t), "--state", n.State, "--spec", n.Spec, "--",
		nvidiaBin(t, "gpu-feature-discovery"), "--oneshot", "--output-file="+out, "--no-timestamp",
		"--use-node-feature-api=false", "--mig-strategy="+strategy)
	cmd.Env = append(os.Environ(), "MIG_AGENT_SIM_QUIET=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gpu-feature-discovery: %v\n%s", err, b)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			labels[k] = v
		}
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if _, err := n.Client.CoreV1().Nodes().Patch(context.Background(), n.Name, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: "nfd-master"}); err != nil {
		t.Fatalf("GFD's labels on the Node: %v", err)
	}
	if got := labels["nvidia.com/mig.strategy"]; got != strategy {
		t.Fatalf("GPU Feature Discovery labels nvidia.com/mig.strategy=%v, want %s", got, strategy)
	}
}

// holdPluginStarts keeps every plugin container that starts from here on
// waiting before NVIDIA's plugin runs (it registers nothing), until
// releasePluginStarts.
func (n *realGPUNode) holdPluginStarts(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(filepath.Dir(n.State), "hold-plugin-starts"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (n *realGPUNode) releasePluginStarts(t *testing.T) {
	t.Helper()
	if err := os.Remove(filepath.Join(filepath.Dir(n.State), "hold-plugin-starts")); err != nil {
		t.Fatal(err)
	}
}

// pluginReplaced says whether the node runs one plugin pod and it is
// another than old's one pod (restarted); pluginKept, that it is the same.
func (n *realGPUNode) pluginReplaced(t *testing.T, old []corev1.Pod) bool {
	pods := n.pluginPods(t)
	return len(pods) == 1 && len(old) == 1 && pods[0].UID != old[0].UID
}

func (n *realGPUNode) pluginKept(t *testing.T, old []corev1.Pod) bool {
	pods := n.pluginPods(t)
	return len(pods) == 1 && len(old) == 1 && pods[0].UID == old[0].UID
}

// pluginPods are the plugin's pods on the node that are not being deleted.
func (n *realGPUNode) pluginPods(t *testing.T) []corev1.Pod { return n.podsOf(t, n.PluginLabels) }

// podsOf are the pods of the plugin's namespace with labels set on the
// node that are not being deleted.
func (n *realGPUNode) podsOf(t *testing.T, set map[string]string) []corev1.Pod {
	return n.podsIn(t, n.PluginNS, set)
}

// podsIn are the pods of ns with labels set on the node that are not
// being deleted.
func (n *realGPUNode) podsIn(t *testing.T, ns string, set map[string]string) []corev1.Pod {
	t.Helper()
	list, err := n.Client.CoreV1().Pods(ns).List(context.Background(),
		metav1.ListOptions{LabelSelector: labels.SelectorFromSet(set).String()})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName == n.Name {
			out = append(out, p)
		}
	}
	return out
}

// startAgent runs the agent for the node on its production NVML path
// (the library), with the real kubelet's PodResources, the plugin's
// namespace as an operand namespace and configs from file.
func (n *realGPUNode) startAgent(t *testing.T, file string, extra ...string) *Agent {
	t.Helper()
	args := append([]string{"-f", file, "--pod-resources-socket", n.PodResourcesSocket(), "--resource-wait-timeout", "3m",
		"--operand-namespace", n.PluginNS}, extra...)
	return StartAgent(t, &Opts{Node: n.Name, Sim: n.Spec, SimState: n.State, Library: n.Lib, Extra: args})
}

// cli runs the agent's CLI on the node's GPUs through the library.
func (n *realGPUNode) cli(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(binary(), append(args, "--nvml", "real", "--nvml-library", n.Lib, "--log-level", "error")...)
	cmd.Env = append(os.Environ(), "MIG_AGENT_SIM="+n.Spec, "MIG_AGENT_SIM_STATE="+n.State, "MIG_AGENT_SIM_QUIET=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mig-agent %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// pluginImage is NVIDIA's plugin, its config-manager and GPU Feature
// Discovery, with sim-node and the library.
const pluginImage = "mig-agent.test/nvidia-device-plugin:v0.17.4"

func (n *realGPUNode) importPluginImage(t *testing.T, plugin string) {
	t.Helper()
	var files []realnode.ImageFile
	for _, b := range []struct{ src, dst string }{
		{plugin, "/usr/bin/nvidia-device-plugin"},
		{simlibtest.SimNode(t), "/usr/bin/sim-node"},
		{nvidiaBin(t, "config-manager"), "/usr/bin/config-manager"},
		{nvidiaBin(t, "gpu-feature-discovery"), "/usr/bin/gpu-feature-discovery"},
		{n.Lib, "/usr/lib/mig-agent-sim/libnvidia-ml.so.1"},
		{"/bin/sh", "/bin/sh"}, {"/bin/sleep", "/bin/sleep"},
	} {
		fs, err := realnode.BinaryFiles(b.src, b.dst)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			if !slices.ContainsFunc(files, func(g realnode.ImageFile) bool { return g.Path == f.Path }) {
				files = append(files, f)
			}
		}
	}
	// The plugin starts once the test lets it (holdPluginStarts): the
	// only way a test can keep the old plugin's figures the last word. It
	// starts as the GPU Operator's entrypoint.sh starts it, `exec
	// nvidia-device-plugin` from the PATH: the config-manager finds the
	// process to signal by its argv[0], that name exactly
	// (cmd/config-manager/main.go findPidToSignal).
	entry := []string{"/usr/bin/sim-node", "--lib", "/usr/lib/mig-agent-sim", "--", "/bin/sh", "-c",
		"while [ -e /sim/hold-plugin-starts ]; do sleep 0.1; done; PATH=/usr/bin:/bin exec nvidia-device-plugin"}
	if err := n.ImportImage(pluginImage, entry, files); err != nil {
		t.Fatal(err)
	}
}

func (n *realGPUNode) createPluginDaemonSet(t *testing.T, strategy string) {
	t.Helper()
	ctx := context.Background()
	env := []corev1.EnvVar{
		{Name: "PASS_DEVICE_SPECS", Value: "true"}, {Name: "FAIL_ON_INIT_ERROR", Value: "true"},
		{Name: "DEVICE_LIST_STRATEGY", Value: "envvar"}, {Name: "DEVICE_ID_STRATEGY", Value: "uuid"},
		{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}, {Name: "NVIDIA_DRIVER_CAPABILITIES", Value: "all"},
		{Name: "MIG_STRATEGY", Value: strategy}, {Name: "NVIDIA_DEV_ROOT", Value: n.DevRoot},
		{Name: "MIG_AGENT_SIM", Value: n.Spec}, {Name: "MIG_AGENT_SIM_STATE", Value: "/sim/state.json"},
		{Name: "MIG_AGENT_SIM_QUIET", Value: "1"},
	}
	dir := n.DevicePluginDir()
	mounts := []corev1.VolumeMount{{Name: "device-plugin", MountPath: dir}, {Name: "sim", MountPath: "/sim"}}
	volumes := []corev1.Volume{
		{Name: "device-plugin", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}},
		{Name: "sim", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: filepath.Dir(n.State)}}},
	}
	if n.PluginConfig != "" {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: n.PluginNS, Name: "device-plugin-config"},
			Data: map[string]string{"config.yaml": n.PluginConfig}}
		if _, err := n.Client.CoreV1().ConfigMaps(n.PluginNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		env = append(env, corev1.EnvVar{Name: "CONFIG_FILE", Value: "/config/config.yaml"})
		mounts = append(mounts, corev1.VolumeMount{Name: "config", MountPath: "/config"})
		volumes = append(volumes, corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name}}}})
	}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: n.PluginNS, Name: "nvidia-device-plugin-daemonset", Labels: n.PluginLabels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: n.PluginLabels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: n.PluginLabels},
				Spec: corev1.PodSpec{
					SchedulerName: kubetest.SchedulerName,
					NodeSelector:  map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true", corev1.LabelHostname: n.Name},
					Tolerations:   []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					Containers: []corev1.Container{{
						Name: "nvidia-device-plugin", Image: pluginImage, ImagePullPolicy: corev1.PullNever,
						Env: env, SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}, VolumeMounts: mounts,
					}},
					Volumes:                       volumes,
					TerminationGracePeriodSeconds: ptr.To[int64](5),
				},
			},
		},
	}
	if n.ConfigManager != nil {
		n.addConfigManager(t, &ds.Spec.Template.Spec)
	}
	if _, err := n.Client.AppsV1().DaemonSets(n.PluginNS).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// addConfigManager puts NVIDIA's config-manager into the plugin's pod as
// the GPU Operator does (withConfigManager). One departure: the Operator's
// config-manager reaches the API server through its service account and
// the kubernetes Service, which needs a service proxy this node does not
// run; here it reads the tests' kubeconfig (its KUBECONFIG, a host file)
// on the host's network.
func (n *realGPUNode) addConfigManager(t *testing.T, spec *corev1.PodSpec) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: n.PluginNS, Name: "plugin-configs"}, Data: n.ConfigManager.Configs}
	if _, err := n.Client.CoreV1().ConfigMaps(n.PluginNS).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := kubetest.Kubeconfig()
	manager := func(name string, oneshot bool) corev1.Container {
		env := []corev1.EnvVar{
			{Name: "ONESHOT", Value: fmt.Sprint(oneshot)}, {Name: "KUBECONFIG", Value: "/kube/config"},
			{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "NODE_LABEL", Value: "nvidia.com/device-plugin.config"},
			{Name: "CONFIG_FILE_SRCDIR", Value: "/available-configs"}, {Name: "CONFIG_FILE_DST", Value: "/config/config.yaml"},
			{Name: "DEFAULT_CONFIG", Value: n.ConfigManager.Default}, {Name: "FALLBACK_STRATEGIES", Value: "empty"},
			{Name: "SEND_SIGNAL", Value: fmt.Sprint(!oneshot)}, {Name: "SIGNAL", Value: map[bool]string{false: "1", true: ""}[oneshot]},
			{Name: "PROCESS_TO_SIGNAL", Value: map[bool]string{false: "nvidia-device-plugin", true: ""}[oneshot]},
		}
		return corev1.Container{Name: name, Image: pluginImage, ImagePullPolicy: corev1.PullNever, Command: []string{"/usr/bin/config-manager"},
			Env: env, SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
			VolumeMounts: []corev1.VolumeMount{{Name: "available-configs", MountPath: "/available-configs"},
				{Name: "config", MountPath: "/config"}, {Name: "kubeconfig", MountPath: "/kube/config", ReadOnly: true}}}
	}
	spec.InitContainers = append(spec.InitContainers, manager("config-manager-init", true))
	spec.Containers = append(spec.Containers, manager("config-manager", false))
	plugin := &spec.Containers[0]
	plugin.Env = append(plugin.Env, corev1.EnvVar{Name: "CONFIG_FILE", Value: "/config/config.yaml"})
	plugin.VolumeMounts = append(plugin.VolumeMounts, corev1.VolumeMount{Name: "available-configs", MountPath: "/available-configs"},
		corev1.VolumeMount{Name: "config", MountPath: "/config"})
	spec.ShareProcessNamespace = ptr.To(true)
	spec.HostNetwork = true
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: "available-configs", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name}}}},
		corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "kubeconfig", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: kubeconfig, Type: ptr.To(corev1.HostPathFile)}}})
}

// waitAllocatable waits until the Node's allocatable GPU resources
// (nvidia.com/*) are exactly want.
func (n *realGPUNode) waitAllocatable(t *testing.T, want map[string]int64, timeout time.Duration) {
	t.Helper()
	var last map[string]int64
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		node, err := n.Client.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		if last = gpuAllocatable(node); fmt.Sprint(last) == fmt.Sprint(want) {
			return
		}
	}
	t.Errorf("node %s: allocatable GPU resources %v after %s, want %v", n.Name, last, timeout, want)
	n.explainPlugin(t)
	t.FailNow()
}

// explainPlugin logs what became of the plugin's DaemonSet and pods: their
// status and the plugin's own log.
func (n *realGPUNode) explainPlugin(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if node, err := n.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); err == nil {
		t.Logf("node %s: taints %v, labels %v", n.Name, node.Spec.Taints, node.Labels)
	}
	if ds, err := n.Client.AppsV1().DaemonSets(n.PluginNS).Get(ctx, "nvidia-device-plugin-daemonset", metav1.GetOptions{}); err == nil {
		t.Logf("plugin DaemonSet status: %+v", ds.Status)
	}
	pods, err := n.Client.CoreV1().Pods(n.PluginNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("listing the plugin's pods: %v", err)
		return
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		t.Logf("plugin pod %s on %q: phase %s, conditions %+v, containers %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
		for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
			if log, err := n.ContainerLog(p, c.Name); err == nil {
				t.Logf("pod %s container %s log:\n%s", p.Name, c.Name, log)
			} else {
				t.Logf("pod %s container %s log: %v", p.Name, c.Name, err)
			}
		}
	}
}

// gpuAllocatable is a Node's allocatable nvidia.com/* resources with a
// count above 0 (a stopped plugin's resources stay at 0).
func gpuAllocatable(node *corev1.Node) map[string]int64 {
	out := map[string]int64{}
	for name, q := range node.Status.Allocatable {
		if strings.HasPrefix(string(name), "nvidia.com/") && q.Value() > 0 {
			out[string(name)] = q.Value()
		}
	}
	return out
}

// gpuPod makes a pod asking for one res, scheduled by the tests'
// scheduler onto the node and owned by a ReplicaSet (that need not exist),
// as a workload's pod is.
func (n *realGPUNode) gpuPod(ns, name, res string) *corev1.Pod {
	p := n.Pod(ns, name, kubetest.SchedulerName)
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(res): resource.MustParse("1")}
	p.OwnerReferences = []metav1.OwnerReference{*disOwner("workload")}
	return p
}

// podDevices maps each pod of ns the kubelet's PodResources lists to the
// device ids it holds (MIG UUIDs, with DEVICE_ID_STRATEGY=uuid).
func (n *realGPUNode) podDevices(t *testing.T, ns string) map[string][]string {
	t.Helper()
	list, err := n.ListPodResources(context.Background())
	if err != nil {
		t.Fatalf("the kubelet's PodResources List: %v", err)
	}
	out := map[string][]string{}
	for _, pr := range list.PodResources {
		if pr.Namespace != ns {
			continue
		}
		for _, c := range pr.Containers {
			for _, d := range c.Devices {
				out[pr.Name] = append(out[pr.Name], d.DeviceIds...)
			}
		}
	}
	return out
}
