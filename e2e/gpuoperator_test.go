package e2e

// The agent next to the NVIDIA GPU Operator's own controller: the operator,
// built from its published Go module by hack/gpu-operator.sh (v25.3.4),
// runs against the real test API server with its CRDs and a ClusterPolicy,
// labels an H200 node the way it labels every GPU node and creates its
// operand DaemonSets; mig-agent, installed from packaging/kubernetes (its
// RBAC, admission policy, settings and DaemonSet args, under a token of its
// ServiceAccount), then acts on that node while the operator's MIG manager
// is off, pauses and restores the operands without the operator undoing
// it, and refuses once the ClusterPolicy turns the operator's MIG manager on.
//
// There is no kubelet, scheduler or DaemonSet controller here: the operand
// DaemonSets get no pods, so the ClusterPolicy stays notReady and the
// operator reconciles every 5 seconds (ClusterPolicyReconciler.Reconcile:
// RequeueAfter 5s while a state is not ready), relabelling the node each
// time (labelGPUNodes) — which is what shows it does not fight the agent.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/kube"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// gpuOpScript builds and runs the operator (relative to the module root).
const gpuOpScript = "hack/gpu-operator.sh"

// gpuOpStateLabels are the deploy labels the operator sets on every GPU node
// of the container workload (controllers/state_manager.go, gpuStateLabels
// [gpuWorkloadConfigContainer]), and the DaemonSets its states create from
// its assets, one per operand enabled in gpuOpPolicy.
var (
	gpuOpStateLabels = []string{
		"nvidia.com/gpu.deploy.driver", "nvidia.com/gpu.deploy.gpu-feature-discovery",
		"nvidia.com/gpu.deploy.container-toolkit", "nvidia.com/gpu.deploy.device-plugin",
		"nvidia.com/gpu.deploy.dcgm", "nvidia.com/gpu.deploy.dcgm-exporter",
		"nvidia.com/gpu.deploy.node-status-exporter", "nvidia.com/gpu.deploy.operator-validator",
	}
	gpuOpDaemonSets = []string{
		"nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset", "nvidia-operator-validator",
		"nvidia-device-plugin-daemonset", "nvidia-dcgm-exporter", "gpu-feature-discovery",
	}
)

// gpuOpNFDLabels are what Node Feature Discovery puts on an H200 node: the
// PCI label of an NVIDIA (10de) 3D controller (0302), the one the operator
// looks for (state_manager.go, gpuNodeLabels), and the kernel and OS labels
// its driver state picks the driver image by (object_controls.go,
// getDriverImagePath... via nfdKernelLabelKey, nfdOSReleaseIDLabelKey,
// nfdOSVersionIDLabelKey).
var gpuOpNFDLabels = map[string]string{
	"feature.node.kubernetes.io/pci-0302_10de.present":        "true",
	"feature.node.kubernetes.io/kernel-version.full":          "6.8.0-60-generic",
	"feature.node.kubernetes.io/system-os_release.ID":         "ubuntu",
	"feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
}

// gpuOpGFDLabels are what GPU Feature Discovery (NVIDIA/k8s-device-plugin,
// internal/lm: resource.go baseLabeler and newArchitectureLabels, nvml.go,
// mig-strategy.go) puts on a node of 8 H200s with MIG capable and off,
// strategy single (the operator's default mig.strategy). The operator reads
// nvidia.com/mig.capable (state_manager.go, hasMIGCapableGPU: an H200's
// product name does not match its h100/a100/a30 fallback, so only this label
// makes it MIG-capable to the operator).
var gpuOpGFDLabels = map[string]string{
	"nvidia.com/gpu.product":          "NVIDIA-H200",
	"nvidia.com/gpu.count":            "8",
	"nvidia.com/gpu.replicas":         "1",
	"nvidia.com/gpu.sharing-strategy": "none",
	"nvidia.com/gpu.memory":           "143771",
	"nvidia.com/gpu.family":           "hopper",
	"nvidia.com/gpu.compute.major":    "9",
	"nvidia.com/gpu.compute.minor":    "0",
	"nvidia.com/cuda.driver.major":    "570",
	"nvidia.com/mig.capable":          "true",
	"nvidia.com/mig.strategy":         "single",
}

// gpuOpPolicy is a ClusterPolicy as the operator's Helm chart renders it
// with its default values (deployments/gpu-operator/values.yaml of the same
// release: the operand images and which operands are on), the MIG manager
// on or off.
func gpuOpPolicy(migManager bool) *unstructured.Unstructured {
	img := func(repo, image, version string, enabled bool) map[string]any {
		return map[string]any{"enabled": enabled, "repository": repo, "image": image, "version": version}
	}
	driver := img("nvcr.io/nvidia", "driver", "570.172.08", true)
	driver["manager"] = map[string]any{"repository": "nvcr.io/nvidia/cloud-native", "image": "k8s-driver-manager", "version": "v0.8.1"}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
		"metadata": map[string]any{"name": "cluster-policy"},
		"spec": map[string]any{
			"operator":           map[string]any{"defaultRuntime": "containerd"},
			"daemonsets":         map[string]any{"priorityClassName": "system-node-critical"},
			"driver":             driver,
			"toolkit":            img("nvcr.io/nvidia/k8s", "container-toolkit", "v1.17.8-ubuntu20.04", true),
			"devicePlugin":       img("nvcr.io/nvidia", "k8s-device-plugin", "v0.17.4", true),
			"dcgm":               img("nvcr.io/nvidia/cloud-native", "dcgm", "4.3.1-1-ubuntu22.04", false),
			"dcgmExporter":       img("nvcr.io/nvidia/k8s", "dcgm-exporter", "4.3.1-4.4.0-ubuntu22.04", true),
			"gfd":                img("nvcr.io/nvidia", "k8s-device-plugin", "v0.17.4", true),
			"migManager":         img("nvcr.io/nvidia/cloud-native", "k8s-mig-manager", "v0.12.3-ubuntu20.04", migManager),
			"nodeStatusExporter": img("nvcr.io/nvidia/cloud-native", "gpu-operator-validator", "v25.3.4", false),
			"validator":          map[string]any{"repository": "nvcr.io/nvidia/cloud-native", "image": "gpu-operator-validator", "version": "v25.3.4"},
			"mig":                map[string]any{"strategy": "single"},
			"sandboxWorkloads":   map[string]any{"enabled": false},
		},
	}}
}

// gpuOperator is the operator's controller running against the test server.
type gpuOperator struct {
	dir       string // the cache of hack/gpu-operator.sh
	namespace string
	cmd       *exec.Cmd
	log       *syncBuffer
	done      chan struct{}
}

// gpuOpBuild returns the operator's cache dir, building it when absent.
// Without the cache and without the Go module proxy the test fails: it is
// not skipped.
func gpuOpBuild(t *testing.T) string {
	t.Helper()
	script := filepath.Join(pkgRoot(t), gpuOpScript)
	if out, err := exec.Command("bash", script, "dir").Output(); err == nil {
		return strings.TrimSpace(string(out))
	}
	t.Logf("the GPU Operator is not cached; building it with %s build (minutes)", gpuOpScript)
	var stderr bytes.Buffer
	cmd := exec.Command("bash", script, "build")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the GPU Operator's controller is neither cached nor buildable (%s build needs the Go module proxy once; `make test` runs it first): %v\n%s",
			gpuOpScript, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// gpuOpStart installs the operator's CRDs, the ClusterPolicy (MIG manager
// off) and starts the controller; everything is removed when t ends.
func gpuOpStart(t *testing.T) *gpuOperator {
	t.Helper()
	op := &gpuOperator{dir: gpuOpBuild(t), namespace: kubetest.NewName(t, "gpu-operator"), log: &syncBuffer{}, done: make(chan struct{})}
	dyn := gpuOpDynamic(t)

	// The CRDs as the operator's image carries them (docker/Dockerfile).
	var crds []*unstructured.Unstructured
	for _, f := range []string{"nvidia.com_clusterpolicies.yaml", "nvidia.com_nvidiadrivers.yaml"} {
		crds = append(crds, pkgDecode(t, filepath.Join(op.dir, "opt/gpu-operator", f))...)
	}
	pkgApply(t, crds, false)
	t.Cleanup(func() {
		// Deleting the CRDs deletes every ClusterPolicy: no later test sees one.
		for _, crd := range crds {
			_ = dyn.Resource(crdResource).Delete(context.Background(), crd.GetName(), metav1.DeleteOptions{})
		}
	})
	kubetest.CreateNamespace(t, op.namespace)
	pkgApply(t, []*unstructured.Unstructured{gpuOpPolicy(false)}, false)

	script := filepath.Join(pkgRoot(t), gpuOpScript)
	op.cmd = exec.Command("bash", script, "run", "--metrics-bind-address=0", "--health-probe-bind-address=0", "--leader-elect=false")
	op.cmd.Env = append(os.Environ(), "KUBECONFIG="+kubetest.Kubeconfig(), "OPERATOR_NAMESPACE="+op.namespace)
	op.cmd.Stdout, op.cmd.Stderr = op.log, op.log
	if err := op.cmd.Start(); err != nil {
		t.Fatalf("starting the GPU Operator: %v", err)
	}
	go func() { _ = op.cmd.Wait(); close(op.done) }()
	t.Cleanup(func() {
		_ = op.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-op.done:
		case <-time.After(15 * time.Second):
			_ = op.cmd.Process.Kill()
			<-op.done
		}
		if t.Failed() {
			t.Logf("GPU Operator log (last 60 lines):\n%s", lastLines(op.log.String(), 60))
		}
	})
	return op
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

func gpuOpDynamic(t *testing.T) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(kubetest.RestConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

// alive reports whether the operator still runs.
func (op *gpuOperator) alive() bool {
	select {
	case <-op.done:
		return false
	default:
		return true
	}
}

// reconciles counts the operator's passes over node's labels so far.
func (op *gpuOperator) reconciles(node string) int {
	return strings.Count(op.log.String(), `"Checking GPU state labels on the node", "NodeName": "`+node+`"`) +
		strings.Count(op.log.String(), `"msg":"Checking GPU state labels on the node","NodeName":"`+node+`"`)
}

// waitReconciles waits until the operator went over node's labels n more
// times. The operator requeues itself only while an operand is not ready;
// once it is settled a pass comes from a watch event. So every
// gpuOpNudgeEvery without a pass, the wait changes the one Node label the
// operator's Node watch reacts to that means nothing off OpenShift:
// feature.node.kubernetes.io/system-os_release.OSTREE_VERSION
// (controllers/clusterpolicy_controller.go, the Node predicate's UpdateFunc:
// osTreeLabelChanged; state_manager.go reads the label only when the
// OpenShift driver toolkit is requested). The passes counted are the
// operator's own.
func (op *gpuOperator) waitReconciles(t *testing.T, node string, n int, timeout time.Duration) {
	t.Helper()
	start := op.reconciles(node)
	last, lastAt, nudges := start, time.Now(), 0
	WaitFor(t, timeout, fmt.Sprintf("%d more passes of the GPU Operator over node %s", n, node), func() bool {
		if !op.alive() {
			t.Fatalf("the GPU Operator exited:\n%s", lastLines(op.log.String(), 60))
		}
		got := op.reconciles(node)
		if got != last {
			last, lastAt = got, time.Now()
		} else if time.Since(lastAt) > gpuOpNudgeEvery {
			nudges++
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{
				"feature.node.kubernetes.io/system-os_release.OSTREE_VERSION": fmt.Sprintf("nudge-%d", nudges)}}})
			if _, err := kubetest.Client(t).CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Logf("nudging the GPU Operator: %v", err)
			}
			lastAt = time.Now()
		}
		return got >= start+n
	})
}

// gpuOpNudgeEvery: how long waitReconciles waits for a pass of the
// operator before it nudges it with a Node event.
const gpuOpNudgeEvery = 10 * time.Second

// daemonSets lists the DaemonSets in the operator's namespace.
func (op *gpuOperator) daemonSets(t *testing.T) []string {
	t.Helper()
	l, err := kubetest.Client(t).AppsV1().DaemonSets(op.namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range l.Items {
		out = append(out, d.Name)
	}
	return out
}

// setPolicyMIGManager turns the operator's MIG manager on or off.
func (op *gpuOperator) setPolicyMIGManager(t *testing.T, on bool) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"migManager": map[string]any{"enabled": on}}})
	if _, err := gpuOpDynamic(t).Resource(kube.ClusterPolicyResource).Patch(context.Background(), "cluster-policy",
		types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("ClusterPolicy migManager.enabled=%v: %v", on, err)
	}
}

// gpuOpNode creates an H200 node as NFD labels it, lets the operator label
// it, then adds GFD's labels and waits for the operator's MIG-capable
// label; it returns the node's name.
func gpuOpNode(t *testing.T, op *gpuOperator) string {
	t.Helper()
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "h200")
	kubetest.CreateNode(t, node, gpuOpNFDLabels)
	// What the kubelet reports; the operator picks the runtime from it
	// (state_manager.go, getRuntime).
	// The kubelet reports the node Ready, and the node lifecycle controller
	// then lifts the not-ready taint that admission put on the new Node
	// (DaemonSet pods do not tolerate it).
	n := GetNode(t, c, node)
	now := metav1.Now()
	n.Status.NodeInfo.ContainerRuntimeVersion = "containerd://1.7.27"
	n.Status.NodeInfo.KubeletVersion = "v1.37.2"
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: now, LastTransitionTime: now}}
	n, err := c.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady })
	if _, err := c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 60*time.Second, "the GPU Operator's labels on "+node, func() bool {
		l := GetNode(t, c, node).Labels
		if l["nvidia.com/gpu.present"] != "true" {
			return false
		}
		for _, k := range gpuOpStateLabels {
			if l[k] != "true" {
				return false
			}
		}
		return true
	})
	// Not MIG-capable to the operator before GFD ran: no MIG manager label.
	if v, ok := GetNode(t, c, node).Labels[kube.LabelDeployMigManager]; ok {
		t.Errorf("before GFD's labels the operator set %s=%s", kube.LabelDeployMigManager, v)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": gpuOpGFDLabels}})
	if _, err := c.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: "gpu-feature-discovery"}); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 60*time.Second, "the operator's "+kube.LabelDeployMigManager+"=true on "+node, func() bool {
		return GetNode(t, c, node).Labels[kube.LabelDeployMigManager] == "true"
	})
	return node
}

// TestGPUOperator: see the top of this file.
func TestGPUOperator(t *testing.T) {
	c := kubetest.Client(t)
	op := gpuOpStart(t)
	node := gpuOpNode(t, op)

	// The operand DaemonSets exist; the operator's MIG manager does not.
	WaitFor(t, 90*time.Second, "the GPU Operator's operand DaemonSets "+strings.Join(gpuOpDaemonSets, ", "), func() bool {
		have := op.daemonSets(t)
		for _, name := range gpuOpDaemonSets {
			if !slices.ContainsFunc(have, func(h string) bool { return strings.HasPrefix(h, name) }) {
				return false
			}
		}
		return true
	})
	if slices.Contains(op.daemonSets(t), "nvidia-mig-manager") {
		t.Fatal("the operator created its MIG manager DaemonSet with migManager.enabled=false")
	}
	dp, err := c.AppsV1().DaemonSets(op.namespace).Get(context.Background(), "nvidia-device-plugin-daemonset", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel := dp.Spec.Template.Spec.NodeSelector["nvidia.com/gpu.deploy.device-plugin"]; sel != "true" {
		t.Errorf("the device plugin DaemonSet selects nodes by %v", dp.Spec.Template.Spec.NodeSelector)
	}

	// The DaemonSet controller (kube-controller-manager's, run by kubetest)
	// creates the operand pods for the node; there is no scheduler, so they
	// stay pending and the ClusterPolicy notReady: the operator reconciles
	// every 5s (ClusterPolicyReconciler.Reconcile requeues while a state is
	// not ready), going over the node's labels each time.
	op.waitReconciles(t, node, 2, 90*time.Second)

	// The install of packaging/kubernetes, as docs/install-gpu-operator.md has it.
	in := pkgDescribe(t, pkgPlain(t))
	pkgApply(t, in.objs, false)

	t.Run("MIG manager off: the agent acts", func(t *testing.T) {
		a, _ := pkgStartAgent(t, in, node, "--nvml", "sim:h200x8")
		SelectConfig(t, c, node, "all-1g.18gb")
		rec := WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", changeTimeout)
		t.Logf("node labels the operator set: %v", gpuOpDeployLabels(GetNode(t, c, node)))
		if len(rec.GPUsChanged) != 8 {
			t.Errorf("record: %+v", rec)
		}
		if strings.Contains(a.Log(), record.ReasonManagerConflict) || strings.Contains(strings.ToLower(a.Log()), "forbidden") {
			t.Errorf("agent log:\n%s", a.Log())
		}
		a.Stop()
	})

	t.Run("pause operands: paused, restored, not fought", func(t *testing.T) {
		// docs/install-gpu-operator.md: pause-gpu-operator: true in the settings, and the
		// policy's pauseGpuOperator variable "true" with it.
		pin := gpuOpPausingInstall(t, in)
		pkgApply(t, pin.objs, false)
		t.Cleanup(func() { pkgApply(t, in.objs, false) }) // the plain install again for later tests

		gpuOpWaitPausePolicy(t, pin, node)

		// A new agent on fresh simulated GPUs first applies the node's
		// current config (pausing and restoring as well). Then the device
		// plugin's pod on the node, running (bound by the test as the
		// scheduler, run as the kubelet): the agent waits for it to leave
		// once its deploy label is paused; the DaemonSet controller deletes
		// it, and the test, as the kubelet, finishes that only after the
		// operator went over the paused labels twice.
		a, _ := pkgStartAgent(t, pin, node, "--nvml", "sim:h200x8", "--operand-namespace", op.namespace)
		WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", changeTimeout)
		dpPod := gpuOpBindOperandPod(t, c, op.namespace, node, kubetest.DevicePluginApp)

		history := gpuOpWatchLabels(t, c, node)
		// One profile on every GPU: the node's GFD says mig.strategy=single.
		SelectConfig(t, c, node, "all-3g.71gb")
		WaitFor(t, changeTimeout, "the operands paused", func() bool {
			return GetNode(t, c, node).Labels[drain.Operands()[0].Label] == drain.PausedValue
		})
		op.waitReconciles(t, node, 2, 90*time.Second)
		for _, o := range drain.Operands()[:4] {
			if v := GetNode(t, c, node).Labels[o.Label]; v != drain.PausedValue {
				t.Errorf("after two passes of the operator over the paused node, %s = %q", o.Label, v)
			}
		}
		// The DaemonSet controller deleted it when its label was paused; the
		// kubelet finishes the deletion.
		WaitFor(t, 30*time.Second, "the DaemonSet controller to delete "+dpPod.Name, func() bool {
			p, err := c.CoreV1().Pods(op.namespace).Get(context.Background(), dpPod.Name, metav1.GetOptions{})
			return err != nil || p.DeletionTimestamp != nil
		})
		if err := c.CoreV1().Pods(op.namespace).Delete(context.Background(), dpPod.Name,
			metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		WaitState(t, c, node, record.StateSuccess, "all-3g.71gb", changeTimeout)
		if !strings.Contains(a.Log(), "operands paused") {
			t.Errorf("the agent paused no operand:\n%s", a.Log())
		}
		// Two more passes of the operator over the node after the restore.
		op.waitReconciles(t, node, 2, 90*time.Second)
		l := GetNode(t, c, node).Labels
		for _, o := range drain.Operands() {
			want, ok := "true", true
			if o.Label == "nvidia.com/gpu.deploy.nvsm" || o.Label == "nvidia.com/gpu.deploy.client" {
				ok = false // the operator (before v26.7 for client) does not set it: left absent
			}
			if got, has := l[o.Label]; has != ok || (ok && got != want) {
				t.Errorf("after the change %s = %q (present %v)", o.Label, got, has)
			}
		}
		t.Logf("deploy labels during the change, as the watch saw them: %v", history())
		for label, values := range history() {
			switch label {
			case "nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.gpu-feature-discovery",
				"nvidia.com/gpu.deploy.dcgm-exporter", "nvidia.com/gpu.deploy.dcgm":
				if want := []string{"true", drain.PausedValue, "true"}; strings.Join(values, ",") != strings.Join(want, ",") {
					t.Errorf("%s went %v, want %v (paused once, restored once, nobody else)", label, values, want)
				}
			default:
				if len(values) != 1 {
					t.Errorf("%s changed during the change: %v", label, values)
				}
			}
		}
		a.Stop()
	})

	t.Run("MIG manager on: the agent refuses", func(t *testing.T) {
		op.setPolicyMIGManager(t, true)
		WaitFor(t, 60*time.Second, "the operator's MIG manager DaemonSet", func() bool {
			return slices.Contains(op.daemonSets(t), "nvidia-mig-manager")
		})
		a, _ := pkgStartAgent(t, in, node, "--nvml", "sim:h200x8")
		SelectConfig(t, c, node, "all-2g.35gb")
		rec := WaitState(t, c, node, record.StateFailed, "all-2g.35gb", changeTimeout)
		t.Logf("refused: %s", rec.Reason)
		for _, want := range []string{"another MIG manager", "ClusterPolicy cluster-policy has spec.migManager.enabled=true"} {
			if !strings.Contains(rec.Reason, want) {
				t.Errorf("reason %q lacks %q", rec.Reason, want)
			}
		}
		if len(rec.GPUsChanged) != 0 || len(rec.EvictedPods) != 0 {
			t.Errorf("a refused change did something: %+v", rec)
		}
		WaitFor(t, 10*time.Second, "a "+record.ReasonManagerConflict+" Event on the node", func() bool {
			evs, err := c.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{
				FieldSelector: fields.Set{"involvedObject.name": node, "reason": record.ReasonManagerConflict}.AsSelector().String()})
			return err == nil && len(evs.Items) > 0
		})
		a.Stop()
	})
}

// gpuOpPausingInstall is in with pause-gpu-operator on in the settings and
// the admission policy's pauseGpuOperator variable "true".
func gpuOpPausingInstall(t *testing.T, in *pkgInstall) *pkgInstall {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, o := range in.objs {
		o = o.DeepCopy()
		switch o.GetKind() {
		case "ConfigMap":
			if o.GetName() == in.config.GetName() {
				s, _, _ := unstructured.NestedString(o.Object, "data", "settings.yaml")
				re := regexp.MustCompile(`(?m)^pause-gpu-operator: false$`)
				if !re.MatchString(s) {
					t.Fatalf("the settings have no line pause-gpu-operator: false:\n%s", s)
				}
				_ = unstructured.SetNestedField(o.Object, re.ReplaceAllString(s, "pause-gpu-operator: true"), "data", "settings.yaml")
			}
		case "ValidatingAdmissionPolicy":
			vars, _, _ := unstructured.NestedSlice(o.Object, "spec", "variables")
			for _, v := range vars {
				if m := v.(map[string]any); m["name"] == "pauseGpuOperator" {
					m["expression"] = "true"
				}
			}
			_ = unstructured.SetNestedSlice(o.Object, vars, "spec", "variables")
		}
		objs = append(objs, o)
	}
	pin := pkgDescribe(t, objs)
	if !pin.pauseGpuOperator {
		t.Fatal("the policy's pauseGpuOperator variable is not set")
	}
	return pin
}

// gpuOpWatchLabels records, from now on, every value each nvidia.com/gpu.deploy.*
// label of node takes (its first entry the value now); the returned
// function stops the watch and returns the history.
func gpuOpWatchLabels(t *testing.T, c kubernetes.Interface, node string) func() map[string][]string {
	t.Helper()
	n := GetNode(t, c, node)
	history := map[string][]string{}
	record := func(labels map[string]string) {
		for k, v := range labels {
			if !strings.HasPrefix(k, "nvidia.com/gpu.deploy.") {
				continue
			}
			if h := history[k]; len(h) == 0 || h[len(h)-1] != v {
				history[k] = append(h, v)
			}
		}
		for k, h := range history {
			if _, ok := labels[k]; !ok && h[len(h)-1] != "<absent>" {
				history[k] = append(h, "<absent>")
			}
		}
	}
	record(n.Labels)
	w, err := c.CoreV1().Nodes().Watch(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String(), ResourceVersion: n.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				if n, ok := ev.Object.(*corev1.Node); ok {
					record(n.Labels)
				}
			}
		}
	}()
	stopped := false
	stop := func() map[string][]string {
		if !stopped {
			w.Stop()
			<-done
			stopped = true
		}
		return history
	}
	t.Cleanup(func() { stop() })
	return stop
}

// gpuOpBindOperandPod waits for the pod the DaemonSet controller created
// for node from the operand DaemonSet whose pods carry app, binds it to the
// node (the scheduler's part) and reports it running (the kubelet's).
func gpuOpBindOperandPod(t *testing.T, c kubernetes.Interface, ns, node, app string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	var pod *corev1.Pod
	WaitFor(t, 60*time.Second, "the DaemonSet controller's "+app+" pod for "+node, func() bool {
		l, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			t.Fatal(err)
		}
		for i := range l.Items {
			if p := &l.Items[i]; p.DeletionTimestamp == nil && strings.Contains(fmt.Sprint(p.Spec.Affinity), node) {
				pod = p
				return true
			}
		}
		return false
	})
	if pod.Spec.NodeName == "" {
		if err := c.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name},
			Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	if pod, err = c.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pod
}

// gpuOpDeployLabels are node's nvidia.com/gpu.* labels.
func gpuOpDeployLabels(n *corev1.Node) map[string]string {
	out := map[string]string{}
	for k, v := range n.Labels {
		if strings.HasPrefix(k, "nvidia.com/gpu.deploy.") || k == "nvidia.com/gpu.present" {
			out[k] = v
		}
	}
	return out
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// gpuOpWaitPausePolicy waits until the API server enforces pin's policy:
// the agent's token may then pause an operand label (asked as a dry run).
func gpuOpWaitPausePolicy(t *testing.T, pin *pkgInstall, node string) {
	t.Helper()
	sa := pkgTokenClient(t, pkgBoundToken(t, pin, node))
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{drain.Operands()[0].Label: drain.PausedValue}}})
	WaitFor(t, policyTimeout, "the policy "+pin.policy+" with pauseGpuOperator true to be enforced", func() bool {
		_, err := sa.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch,
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil
	})
}
