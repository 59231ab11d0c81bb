package e2e

// The chart's DaemonSet with its GPU Operator values, under the real
// DaemonSet controller (kube-controller-manager, started by kubetest.Main):
// the GPU Operator's driver manager takes the agent off a node for a
// driver upgrade by its deploy label, as it does its own operands.

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/testkit/kubetest"
)

// What NVIDIA's k8s-driver-manager writes (cmd/driver-manager/main.go):
// evictAllGPUOperatorComponents sets each operand's deploy label through
// maybeSetPaused ("true" → "paused-for-driver-upgrade") before it unloads
// the driver, nvidia.com/gpu.deploy.mig-manager included when the node has
// it; rescheduleGPUOperatorComponents sets it back through maybeSetTrue.
const (
	upgradeDeployLabel = "nvidia.com/gpu.deploy.mig-manager"
	upgradePaused      = "paused-for-driver-upgrade"
	// The RuntimeClass the GPU Operator creates (operator.runtimeClass).
	upgradeRuntimeClass = "nvidia"
	// pins the test's DaemonSet to its own node (tests share one server).
	upgradePin = "e2e.migagent.io/node"
)

// TestPackagingDriverUpgradePause: with values-gpu-operator.yaml the
// DaemonSet runs an agent pod on a node the GPU Operator labelled
// MIG-capable; the driver manager's pause of the deploy label takes the
// node out of the DaemonSet's node set and the DaemonSet controller deletes
// the pod; its restore brings a new pod back.
func TestPackagingDriverUpgradePause(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	ds := pkgOne(t, pkgChart(t, "gpu-operator"), "DaemonSet")
	var d appsv1.DaemonSet
	raw, err := json.Marshal(ds.Object)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	sel := d.Spec.Template.Spec.NodeSelector
	if sel[upgradeDeployLabel] != "true" || d.Spec.Template.Spec.RuntimeClassName == nil {
		t.Fatalf("the GPU Operator render has nodeSelector %v, runtimeClassName %v", sel, d.Spec.Template.Spec.RuntimeClassName)
	}

	// The install: its namespace and ServiceAccount, and the operator's
	// RuntimeClass (the API server refuses pods naming a missing one).
	ns := kubetest.NewName(t, "ns")
	ensureNamespace(t, ns)
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: d.Spec.Template.Spec.ServiceAccountName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: upgradeRuntimeClass}, Handler: upgradeRuntimeClass}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	node := kubetest.NewName(t, "node")
	d.Namespace, d.ResourceVersion = ns, ""
	d.Spec.Template.Spec.NodeSelector[upgradePin] = node
	if _, err := c.AppsV1().DaemonSets(ns).Create(ctx, &d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the chart's DaemonSet: %v", err)
	}
	t.Cleanup(func() {
		_ = c.AppsV1().DaemonSets(ns).Delete(context.Background(), d.Name, metav1.DeleteOptions{})
		_ = c.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
	})

	// A MIG-capable node as the operator labels it (controllers/state_manager.go,
	// addGPUStateLabels: the deploy labels, mig-manager's per MIG capability).
	kubetest.CreateNode(t, node, map[string]string{
		"nvidia.com/gpu.present": "true", upgradeDeployLabel: "true", "nvidia.com/gpu.deploy.device-plugin": "true",
		"nvidia.com/gpu.product": "NVIDIA-H200", upgradePin: node,
	})
	upgradeNodeReady(t, c, node)
	// The kubelet: it finishes the pods the DaemonSet controller deletes.
	kubetest.StartKubelet(t, c, node)
	podSel := labels.SelectorFromSet(d.Spec.Selector.MatchLabels).String()
	agentPods := func() []corev1.Pod {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: podSel})
		if err != nil {
			t.Fatal(err)
		}
		var out []corev1.Pod
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && upgradePodFor(&p, node) {
				out = append(out, p)
			}
		}
		return out
	}
	desired := func() int32 {
		got, err := c.AppsV1().DaemonSets(ns).Get(ctx, d.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got.Status.DesiredNumberScheduled
	}

	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// What the DaemonSet controller said (a pod it could not create).
		ev, err := c.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return
		}
		for _, e := range ev.Items {
			t.Logf("event %s %s: %s %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
		if n, err := c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{}); err == nil {
			t.Logf("node %s: labels %v, taints %v", node, n.Labels, n.Spec.Taints)
		}
		if got, err := c.AppsV1().DaemonSets(ns).Get(context.Background(), d.Name, metav1.GetOptions{}); err == nil {
			t.Logf("DaemonSet status %+v", got.Status)
		}
	})
	var first string
	WaitFor(t, 60*time.Second, "the DaemonSet controller to create the agent's pod on the node", func() bool {
		p := agentPods()
		if len(p) == 1 {
			first = string(p[0].UID)
		}
		return len(p) == 1 && desired() == 1
	})
	p := agentPods()[0]
	// The scheduler binds it: the DaemonSet controller counts a pod on a
	// node by its spec.nodeName.
	upgradeBind(t, c, &p, node)
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Name != "toolkit-validation" ||
		p.Spec.RuntimeClassName == nil || *p.Spec.RuntimeClassName != upgradeRuntimeClass {
		t.Errorf("the agent's pod lacks the toolkit-ready gate or the RuntimeClass: init %v, runtimeClassName %v",
			p.Spec.InitContainers, p.Spec.RuntimeClassName)
	}

	// The driver manager pauses the operands.
	upgradeSetLabel(t, c, node, upgradePaused)
	WaitFor(t, 60*time.Second, "the DaemonSet controller to delete the agent's pod for the driver upgrade", func() bool {
		return len(agentPods()) == 0 && desired() == 0
	})

	// ... and restores them once the new driver is loaded.
	upgradeSetLabel(t, c, node, "true")
	WaitFor(t, 60*time.Second, "a new agent pod after the driver upgrade", func() bool {
		p := agentPods()
		return len(p) == 1 && string(p[0].UID) != first && desired() == 1
	})
	p = agentPods()[0]
	upgradeBind(t, c, &p, node)
	WaitFor(t, 30*time.Second, "the DaemonSet to count the new pod on the node", func() bool {
		got, err := c.AppsV1().DaemonSets(ns).Get(ctx, d.Name, metav1.GetOptions{})
		return err == nil && got.Status.CurrentNumberScheduled == 1 && got.Status.NumberMisscheduled == 0
	})
}

// upgradeBind binds the pod to node as kube-scheduler does for a
// DaemonSet pod (its required node affinity names the node, and the node
// has no taint it does not tolerate: upgradeNodeReady lifted not-ready).
func upgradeBind(t *testing.T, c kubernetes.Interface, p *corev1.Pod, node string) {
	t.Helper()
	err := c.CoreV1().Pods(p.Namespace).Bind(context.Background(), &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("binding %s to %s: %v", p.Name, node, err)
	}
}

// upgradeSetLabel sets the deploy label as the driver manager does (a merge
// of the node's labels).
func upgradeSetLabel(t *testing.T, c kubernetes.Interface, node, value string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{upgradeDeployLabel: value}}})
	if _, err := c.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// upgradePodFor: the DaemonSet controller names a pod's node in a required
// node affinity on metadata.name (the scheduler binds it), or in nodeName
// once bound.
func upgradePodFor(p *corev1.Pod, node string) bool {
	if p.Spec.NodeName != "" {
		return p.Spec.NodeName == node
	}
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return false
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 && f.Values[0] == node {
				return true
			}
		}
	}
	return false
}

// upgradeNodeReady makes the node Ready as a running kubelet and the node
// lifecycle controller do: the kubelet reports the Ready condition, and the
// controller lifts the node.kubernetes.io/not-ready:NoSchedule taint that
// the API server's TaintNodesByCondition admission put on the new Node
// (k8s.io/kubernetes pkg/controller/nodelifecycle, doNoScheduleTaintingPass).
// The DaemonSet controller places a pod only on a node whose NoSchedule
// taints its pods tolerate.
func upgradeNodeReady(t *testing.T, c kubernetes.Interface, node string) {
	t.Helper()
	ctx := context.Background()
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: now, LastTransitionTime: now}}
	n, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var taints []corev1.Taint
	for _, taint := range n.Spec.Taints {
		if taint.Key != corev1.TaintNodeNotReady {
			taints = append(taints, taint)
		}
	}
	n.Spec.Taints = taints
	if _, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
