package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/reconcile"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// LabelDeployMigManager is the node label the GPU Operator's MIG manager
// DaemonSet selects its nodes by (nodeSelector
// nvidia.com/gpu.deploy.mig-manager: "true" in the operator's
// assets/state-mig-manager/0600_daemonset.yaml). The operator sets it to true
// on every MIG-capable node whether or not its MIG manager is enabled
// (controllers/state_manager.go, gpuWorkloadConfiguration.addGPUStateLabels:
// only the DaemonSet depends on spec.migManager.enabled), so the label alone
// says nothing about a MIG manager at work.
const LabelDeployMigManager = "nvidia.com/gpu.deploy.mig-manager"

// OperatorMigManagerApp is the app label of the pods of the GPU Operator's
// MIG manager DaemonSet (its pod template in
// assets/state-mig-manager/0600_daemonset.yaml).
const OperatorMigManagerApp = "nvidia-mig-manager"

// NVIDIADRADriver is the NVIDIA DRA driver's name in ResourceSlices.
const NVIDIADRADriver = dra.NVIDIADRADriver

// ClusterPolicyResource is the GPU Operator's ClusterPolicy
// (clusterpolicies.nvidia.com, cluster-scoped).
var ClusterPolicyResource = schema.GroupVersionResource{Group: "nvidia.com", Version: "v1", Resource: "clusterpolicies"}

// OtherManager detects another MIG manager at work on the node and returns a
// description of it, or "":
//
//   - a pod of the GPU Operator's MIG manager on the node (label
//     app=nvidia-mig-manager), pending or running and not terminating;
//   - the GPU Operator told to run its MIG manager: a ClusterPolicy the
//     operator acts on (not status.state "ignored", the operator's mark for
//     every ClusterPolicy but the one it uses) with spec.migManager.enabled
//     true or unset (the operator's default is true), unless this node's
//     deploy label is "false", the operator's per-node opt-out. policies nil, no
//     ClusterPolicy API on the cluster (404) or no right to read it (403)
//     leave this unknown: the pod check stands alone;
//   - the NVIDIA DRA driver creating MIG devices itself on this node: its
//     DynamicMIG mode, seen as shared counters in its ResourceSlices
//     (draCreatesMIG; skipped where there is no DRA API or no right to
//     list). Pre-created MIG devices the driver only announces are not.
//
// The deploy label nvidia.com/gpu.deploy.mig-manager=true by itself is never
// a conflict: the operator sets it on every MIG-capable node.
//
// The three reads are independent and sent at once; their findings are
// judged in the order above.
func OtherManager(ctx context.Context, c kclient.Interface, policies ClusterPolicies, node *corev1.Node) (string, error) {
	var pods, policy, dra finding
	var wg sync.WaitGroup
	wg.Go(func() { pods = operatorMigManagerPod(ctx, c, node) })
	if policies != nil && node.Labels[LabelDeployMigManager] != "false" {
		wg.Go(func() { policy.other, policy.err = operatorMigManagerEnabled(ctx, policies) })
	}
	wg.Go(func() { dra = draMIGDevices(ctx, c, node) })
	wg.Wait()
	for _, f := range []finding{pods, policy, dra} {
		if f.err != nil || f.other != "" {
			return f.other, f.err
		}
	}
	return "", nil
}

// finding is what one look for another MIG manager found.
type finding struct {
	other string
	err   error
}

// operatorMigManagerPod: a running pod of the GPU Operator's MIG manager on
// the node.
func operatorMigManagerPod(ctx context.Context, c kclient.Interface, node *corev1.Node) finding {
	// The node's pods, read once with the device plugin list of the same
	// look at the node (drain.NodePods), the app label picked here.
	pods, err := drain.NodePods(ctx, c, node.Name)
	if err != nil {
		return finding{err: fmt.Errorf("listing pods on the node: %w", err)}
	}
	for i := range pods {
		p := &pods[i]
		if p.Labels["app"] != OperatorMigManagerApp {
			continue
		}
		// A pod whose containers all ended (Succeeded, Failed) runs nothing.
		// A terminating one may: its process runs through the grace period
		// (and past it until the kubelet kills it), so it is a conflict
		// until the pod is gone.
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if p.DeletionTimestamp != nil {
			return finding{other: fmt.Sprintf("the GPU Operator's MIG manager (pod %s/%s, terminating: its process may still run until the pod is gone)", p.Namespace, p.Name)}
		}
		return finding{other: fmt.Sprintf("the GPU Operator's MIG manager (pod %s/%s)", p.Namespace, p.Name)}
	}
	return finding{}
}

// draMIGDevices: the NVIDIA DRA driver creating MIG devices on the node.
func draMIGDevices(ctx context.Context, c kclient.Interface, node *corev1.Node) finding {
	other, err := draCreatesMIG(ctx, c, node.Name)
	return finding{other: other, err: err}
}

// draCreatesMIG names the NVIDIA DRA driver when it creates and destroys MIG
// devices on node itself (DynamicMIG: its slices carry shared counters, or
// devices that consume them), or "". Pre-created MIG devices the driver only
// announces are not a conflict: the agent serves them (see drain.Disruptor). Every
// served version of resource.k8s.io is read (v1, else v1beta2, else
// v1beta1); no DRA API, or no right to list ResourceSlices, leaves this
// unknown.
func draCreatesMIG(ctx context.Context, c kclient.Interface, node string) (string, error) {
	slices, err := dra.NodeSlices(ctx, c, node)
	if errors.Is(err, dra.ErrNoDRA) || apierrors.IsForbidden(err) {
		return "", nil // no DRA API on this cluster, or not allowed to look
	}
	if err != nil {
		return "", err
	}
	if why := dra.Partitionable(slices); why != "" {
		return "the NVIDIA DRA driver in DynamicMIG mode, which creates and destroys MIG devices itself (" + why + ")", nil
	}
	return "", nil
}

// operatorMigManagerEnabled reads the GPU Operator's ClusterPolicies and
// names the one that enables its MIG manager, or "". The operator acts on one
// ClusterPolicy and sets status.state "ignored" on any other
// (controllers/clusterpolicy_controller.go, ClusterPolicyReconciler.Reconcile);
// spec.migManager.enabled unset means enabled (api/nvidia/v1,
// MIGManagerSpec.IsEnabled).
func operatorMigManagerEnabled(ctx context.Context, policies ClusterPolicies) (string, error) {
	list, err := policies.List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return "", nil // no GPU Operator CRD, or not allowed to read it: unknown
	}
	if err != nil {
		return "", fmt.Errorf("listing the GPU Operator's ClusterPolicies: %w", err)
	}
	for _, cp := range list.Items {
		if state, _, _ := unstructured.NestedString(cp.Object, "status", "state"); state == "ignored" {
			continue
		}
		enabled, found, err := unstructured.NestedBool(cp.Object, "spec", "migManager", "enabled")
		if err != nil {
			return "", fmt.Errorf("ClusterPolicy %s: spec.migManager.enabled: %w", cp.GetName(), err)
		}
		switch {
		case !found:
			return fmt.Sprintf("the GPU Operator's MIG manager (ClusterPolicy %s leaves spec.migManager.enabled unset, which enables it)", cp.GetName()), nil
		case enabled:
			return fmt.Sprintf("the GPU Operator's MIG manager (ClusterPolicy %s has spec.migManager.enabled=true)", cp.GetName()), nil
		}
	}
	return "", nil
}

// ClusterPolicies lists the GPU Operator's ClusterPolicies (a dynamic
// client's Resource(ClusterPolicyResource) is one).
type ClusterPolicies interface {
	List(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error)
}

// RESTClusterPolicies lists ClusterPolicies with c's REST client, as JSON
// decoded into unstructured objects: the agent links no dynamic client for
// its one custom resource.
func RESTClusterPolicies(c kclient.Interface) ClusterPolicies { return restPolicies{c} }

type restPolicies struct{ c kclient.Interface }

func (r restPolicies) List(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	gvr := ClusterPolicyResource
	raw, err := r.c.CoreV1().RESTClient().Get().AbsPath("/apis", gvr.Group, gvr.Version, gvr.Resource).
		VersionedParams(&opts, metav1.ParameterCodec).SetHeader("Accept", "application/json").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	list := &unstructured.UnstructuredList{}
	if err := list.UnmarshalJSON(raw); err != nil {
		return nil, fmt.Errorf("decoding the ClusterPolicy list: %w", err)
	}
	return list, nil
}

// Others implements reconcile.OtherManagers for one node: OtherManager on
// the Node as it is now.
type Others struct {
	Client kclient.Interface
	// Policies reads the GPU Operator's ClusterPolicies (nil: not checked).
	Policies ClusterPolicies
	Node     string
	// Read reads the Node (nil: a GET); the agent passes the watch's
	// cache (Cluster.CachedNode): only its labels are read.
	Read func(ctx context.Context) (*corev1.Node, error)
}

var _ reconcile.OtherManagers = (*Others)(nil)

// Check implements reconcile.OtherManagers.
func (o *Others) Check(ctx context.Context) (string, error) {
	read := o.Read
	if read == nil {
		read = func(ctx context.Context) (*corev1.Node, error) {
			return o.Client.CoreV1().Nodes().Get(ctx, o.Node, metav1.GetOptions{})
		}
	}
	node, err := read(ctx)
	if err != nil {
		return "", fmt.Errorf("reading node %s: %w", o.Node, err)
	}
	return OtherManager(ctx, o.Client, o.Policies, node)
}
