package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// GPU Feature Discovery on the real node, the way its labels reach a Node
// on a GPU Operator cluster: NVIDIA's GFD runs as the Operator v25.3.4
// deploys it (assets/gpu-feature-discovery/0500_daemonset.yaml: a
// privileged DaemonSet pod labelled app=gpu-feature-discovery on nodes
// labelled nvidia.com/gpu.deploy.gpu-feature-discovery=true, relabelling
// every 60 s, MIG_STRATEGY from the ClusterPolicy, its feature file written
// to the host's /etc/kubernetes/node-feature-discovery/features.d); Node
// Feature Discovery v0.17.3, the Operator's subchart, reads that file
// (nfd-worker, local source), publishes it as a NodeFeature object, and
// labels the Node (nfd-master, with extraLabelNs nvidia.com as the
// Operator's values set it). All three are unmodified.
//
// Departures, each because of what this machine lacks: GFD's two init
// containers are left out (toolkit-validation waits for the container
// toolkit's validation, which no driver stack runs here; config-manager-init
// serves devicePlugin.config, not set here); GFD reads the GPUs through
// sim-node and the simulated library like the plugin; NFD's worker and
// master run as host processes with the tests' kubeconfig (the Operator runs
// them as pods on the kubernetes Service, which needs a service proxy this
// node does not run), the worker with the local source alone (the other
// sources read the host's CPU, kernel and PCI, which no test asks about) and
// a 1 s sleep interval for the Operator's 60 s, so that a test need not wait
// a minute for a file the restarted GFD wrote at once.

// nfdFeaturesDir is where GFD writes its feature file and nfd-worker reads
// it (source/local/local.go featureFilesDir): a host path, as on every
// GPU Operator node.
const nfdFeaturesDir = "/etc/kubernetes/node-feature-discovery/features.d"

// withGFD runs GFD and NFD on the node (the labels follow the GPUs)
// instead of one copy of GFD's labels at start.
func withGFD() realNodeOption { return func(n *realGPUNode) { n.GFD = true } }

// gfdPodLabels are the GFD pods' labels, as the Operator's DaemonSet sets them.
var gfdPodLabels = map[string]string{"app": "gpu-feature-discovery", "app.kubernetes.io/part-of": "nvidia-gpu"}

// startGFD starts NFD (CRDs, master, worker) and GFD's DaemonSet, and
// waits until the Node carries GFD's MIG strategy through them.
func (n *realGPUNode) startGFD(t *testing.T, strategy string) {
	t.Helper()
	out, err := exec.Command("bash", "../hack/node-feature-discovery.sh", "build").Output()
	if err != nil {
		t.Fatalf("hack/node-feature-discovery.sh build: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	pkgApply(t, pkgDecode(t, filepath.Join(dir, "nfd-api-crds.yaml")), false)
	ns := kubetest.NewName(t, "node-feature-discovery")
	kubetest.CreateNamespace(t, ns)
	if err := os.MkdirAll(nfdFeaturesDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(filepath.Join(nfdFeaturesDir, "gfd")) })
	env := append(os.Environ(), "NODE_NAME="+n.Name, "KUBERNETES_NAMESPACE="+ns)
	n.hostProcess(t, "nfd-master", env, filepath.Join(dir, "bin", "nfd-master"), "-kubeconfig", kubetest.Kubeconfig(),
		"-extra-label-ns", "nvidia.com", "-metrics", "0", "-grpc-health", "0")
	n.hostProcess(t, "nfd-worker", env, filepath.Join(dir, "bin", "nfd-worker"), "-kubeconfig", kubetest.Kubeconfig(),
		"-feature-sources", "local", "-label-sources", "local", "-options", `{"core":{"sleepInterval":"1s"}}`,
		"-metrics", "0", "-grpc-health", "0")
	// A manager of its own: an apply under "gpu-operator" would drop the
	// device plugin's deploy label that manager applied before.
	SetLabel(t, n.Client, n.Name, "nvidia.com/gpu.deploy.gpu-feature-discovery", "true", "gpu-operator-gfd")
	n.createGFDDaemonSet(t, strategy)
	WaitFor(t, 2*time.Minute, "GFD's labels on the Node through NFD", func() bool {
		return GetNode(t, n.Client, n.Name).Labels["nvidia.com/mig.strategy"] == strategy
	})
}

// hostProcess runs bin on the host until t ends; its output is logged when
// t failed.
func (n *realGPUNode) hostProcess(t *testing.T, name string, env []string, bin string, args ...string) {
	t.Helper()
	log := &syncBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s log (last 40 lines):\n%s", name, lastLines(log.String(), 40))
		}
	})
}

// createGFDDaemonSet installs GFD's DaemonSet as the Operator does.
func (n *realGPUNode) createGFDDaemonSet(t *testing.T, strategy string) {
	t.Helper()
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	env := []corev1.EnvVar{
		{Name: "GFD_SLEEP_INTERVAL", Value: "60s"}, {Name: "GFD_FAIL_ON_INIT_ERROR", Value: "true"},
		{Name: "NAMESPACE", ValueFrom: field("metadata.namespace")}, {Name: "NODE_NAME", ValueFrom: field("spec.nodeName")},
		{Name: "MIG_STRATEGY", Value: strategy}, {Name: "NVIDIA_MIG_MONITOR_DEVICES", Value: "all"},
		{Name: "MIG_AGENT_SIM", Value: n.Spec}, {Name: "MIG_AGENT_SIM_STATE", Value: "/sim/state.json"}, {Name: "MIG_AGENT_SIM_QUIET", Value: "1"},
	}
	hostPath := func(name, path string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}}
	}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: n.PluginNS, Name: "gpu-feature-discovery", Labels: gfdPodLabels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: gfdPodLabels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: gfdPodLabels},
				Spec: corev1.PodSpec{
					SchedulerName: kubetest.SchedulerName,
					NodeSelector:  map[string]string{"nvidia.com/gpu.deploy.gpu-feature-discovery": "true", corev1.LabelHostname: n.Name},
					Tolerations:   []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					Containers: []corev1.Container{{
						Name: "gpu-feature-discovery", Image: pluginImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{"/usr/bin/sim-node", "--lib", "/usr/lib/mig-agent-sim", "--", "/usr/bin/gpu-feature-discovery"},
						Env:     env, SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
						VolumeMounts: []corev1.VolumeMount{{Name: "output-dir", MountPath: nfdFeaturesDir},
							{Name: "host-sys", MountPath: "/sys", ReadOnly: true}, {Name: "sim", MountPath: "/sim"}},
					}},
					Volumes: []corev1.Volume{hostPath("output-dir", nfdFeaturesDir), hostPath("host-sys", "/sys"),
						hostPath("sim", filepath.Dir(n.State))},
					TerminationGracePeriodSeconds: ptr.To[int64](5),
				},
			},
		},
	}
	if _, err := n.Client.AppsV1().DaemonSets(n.PluginNS).Create(context.Background(), ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// migCountLabels are the Node's nvidia.com/mig-<profile>.count labels.
func migCountLabels(node *corev1.Node) map[string]string {
	out := map[string]string{}
	for k, v := range node.Labels {
		if strings.HasPrefix(k, "nvidia.com/mig-") && strings.HasSuffix(k, ".count") {
			out[k] = v
		}
	}
	return out
}

// TestRealNodeGFDLabelsFollowTheChange: NVIDIA's GPU Feature Discovery
// and Node Feature Discovery, real, label the Node with each MIG profile's
// count (nvidia.com/mig-<profile>.count) through a NodeFeature object. The
// agent changes all-1g.18gb to all-3g.71gb on one H200 and restarts GFD's
// pod with the plugin's: the new pod labels the new geometry at once
// (not at its 60 s relabelling), and NFD removes the count of the profile
// the change took away.
func TestRealNodeGFDLabelsFollowTheChange(t *testing.T) {
	n := startRealGPUNode(t, "h200x1", defaultConfigs, "all-1g.18gb", "mixed", "", withGFD())
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb": 7}, 90*time.Second)
	before := map[string]string{"nvidia.com/mig-1g.18gb.count": "7"}
	WaitFor(t, time.Minute, "GFD's MIG counts on the Node", func() bool {
		return fmt.Sprint(migCountLabels(GetNode(t, n.Client, n.Name))) == fmt.Sprint(before)
	})
	gfd := n.podsOf(t, gfdPodLabels)
	if len(gfd) != 1 {
		t.Fatalf("%d GFD pods on the node, want 1", len(gfd))
	}
	n.startAgent(t, defaultConfigs)
	SelectConfig(t, n.Client, n.Name, "all-3g.71gb")
	WaitState(t, n.Client, n.Name, record.StateSuccess, "all-3g.71gb", 3*time.Minute)
	done := time.Now()
	after := map[string]string{"nvidia.com/mig-3g.71gb.count": "2"}
	var got map[string]string
	WaitFor(t, 45*time.Second, "GFD's labels of the new geometry", func() bool {
		got = migCountLabels(GetNode(t, n.Client, n.Name))
		return fmt.Sprint(got) == fmt.Sprint(after)
	})
	t.Logf("GFD's labels showed the new geometry %s after success", time.Since(done).Round(100*time.Millisecond))
	if now := n.podsOf(t, gfdPodLabels); len(now) != 1 || now[0].UID == gfd[0].UID {
		t.Errorf("GFD pods after the change: %d, the old one kept: %v; want its pod restarted", len(now), len(now) == 1 && now[0].UID == gfd[0].UID)
	}
}

// TestRealNodePausedOperandsComeBack: the GPU Operator's MIG manager path,
// --pause-gpu-operator, on the real node. The agent sets the device
// plugin's and GFD's deploy labels to paused-for-mig-change; the
// DaemonSet controller removes their pods and the kubelet ends them (the
// agent waits for that) before the GPUs change; the labels come back to
// true, the controller makes new pods, and success comes with the new
// plugin's exact allocatable, GFD's labels of the new geometry reaching
// the Node through NFD.
func TestRealNodePausedOperandsComeBack(t *testing.T) {
	n := startRealGPUNode(t, "h200x1", defaultConfigs, "all-1g.18gb", "mixed", "", withGFD())
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb": 7}, 90*time.Second)
	c := n.Client
	plugin, gfd := n.pluginPods(t), n.podsOf(t, gfdPodLabels)
	if len(plugin) != 1 || len(gfd) != 1 {
		t.Fatalf("%d plugin and %d GFD pods, want one each", len(plugin), len(gfd))
	}
	deploy := []string{"nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.gpu-feature-discovery"}
	var paused []string
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() { // what the Node's deploy labels went through
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if node, err := c.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{}); err == nil {
				for _, k := range deploy {
					if node.Labels[k] == record.OperandPaused && !slices.Contains(paused, k) {
						paused = append(paused, k)
					}
				}
			}
		}
	}()
	n.startAgent(t, defaultConfigs, "--pause-gpu-operator")
	t0 := time.Now()
	SelectConfig(t, c, n.Name, "all-3g.71gb")
	WaitState(t, c, n.Name, record.StateSuccess, "all-3g.71gb", 3*time.Minute)
	t.Logf("success %s after the label, the operands paused and back", time.Since(t0).Round(100*time.Millisecond))
	close(stop)
	<-watched
	if got := gpuAllocatable(GetNode(t, c, n.Name)); !sameCounts(got, map[string]int64{"nvidia.com/mig-3g.71gb": 2}) || len(got) != 1 {
		t.Errorf("allocatable at success %v, want 2 mig-3g.71gb", got)
	}
	slices.Sort(paused)
	if !slices.Equal(paused, deploy) {
		t.Errorf("deploy labels seen paused %v, want %v", paused, deploy)
	}
	node := GetNode(t, c, n.Name)
	for _, k := range deploy {
		if node.Labels[k] != "true" {
			t.Errorf("%s=%q after the change, want true", k, node.Labels[k])
		}
	}
	if !n.pluginReplaced(t, plugin) {
		t.Errorf("the plugin's pod was not replaced")
	}
	WaitFor(t, 45*time.Second, "GFD's labels of the new geometry", func() bool {
		return fmt.Sprint(migCountLabels(GetNode(t, c, n.Name))) == fmt.Sprint(map[string]string{"nvidia.com/mig-3g.71gb.count": "2"})
	})
	if now := n.podsOf(t, gfdPodLabels); len(now) != 1 || now[0].UID == gfd[0].UID {
		t.Errorf("GFD's pod was not replaced")
	}
}
