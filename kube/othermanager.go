package kube

import (
	"context"
	"fmt"
	"strings"

	"github.com/migagent/mig-agent/reconcile"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
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
const NVIDIADRADriver = "gpu.nvidia.com"

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
//     deploy label is "false", the operator's per-node opt-out. dyn nil, no
//     ClusterPolicy API on the cluster (404) or no right to read it (403)
//     leave this unknown: the pod check stands alone;
//   - the NVIDIA DRA driver advertising MIG devices in this node's
//     ResourceSlices (skipped where there is no DRA API or no right to list).
//
// The deploy label nvidia.com/gpu.deploy.mig-manager=true by itself is never
// a conflict: the operator sets it on every MIG-capable node.
func OtherManager(ctx context.Context, c kubernetes.Interface, dyn dynamic.Interface, node *corev1.Node) (string, error) {
	pods, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node.Name).String(),
		LabelSelector: labels.SelectorFromSet(labels.Set{"app": OperatorMigManagerApp}).String(),
	})
	if err != nil {
		return "", fmt.Errorf("listing pods on the node: %w", err)
	}
	for _, p := range pods.Items {
		// A pod whose containers all ended (Succeeded, Failed) runs nothing.
		// A terminating one may: its process runs through the grace period
		// (and past it until the kubelet kills it), so it is a conflict
		// until the pod is gone.
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if p.DeletionTimestamp != nil {
			return fmt.Sprintf("the GPU Operator's MIG manager (pod %s/%s, terminating: its process may still run until the pod is gone)", p.Namespace, p.Name), nil
		}
		return fmt.Sprintf("the GPU Operator's MIG manager (pod %s/%s)", p.Namespace, p.Name), nil
	}
	if dyn != nil && node.Labels[LabelDeployMigManager] != "false" {
		other, err := operatorMigManagerEnabled(ctx, dyn)
		if err != nil || other != "" {
			return other, err
		}
	}
	slices, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node.Name).String(),
	})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return "", nil // no DRA API on this cluster, or not allowed to look
	}
	if err != nil {
		return "", fmt.Errorf("listing ResourceSlices: %w", err)
	}
	for _, s := range slices.Items {
		if s.Spec.Driver != NVIDIADRADriver {
			continue
		}
		for _, dev := range s.Spec.Devices {
			t := dev.Attributes["type"]
			if (t.StringValue != nil && strings.Contains(*t.StringValue, "mig")) || strings.Contains(dev.Name, "mig") {
				return fmt.Sprintf("the NVIDIA DRA driver (ResourceSlice %s advertises MIG device %s)", s.Name, dev.Name), nil
			}
		}
	}
	return "", nil
}

// operatorMigManagerEnabled reads the GPU Operator's ClusterPolicies and
// names the one that enables its MIG manager, or "". The operator acts on one
// ClusterPolicy and sets status.state "ignored" on any other
// (controllers/clusterpolicy_controller.go, ClusterPolicyReconciler.Reconcile);
// spec.migManager.enabled unset means enabled (api/nvidia/v1,
// MIGManagerSpec.IsEnabled).
func operatorMigManagerEnabled(ctx context.Context, dyn dynamic.Interface) (string, error) {
	list, err := dyn.Resource(ClusterPolicyResource).List(ctx, metav1.ListOptions{})
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

// Others implements reconcile.OtherManagers for one node: OtherManager on
// the Node as it is now.
type Others struct {
	Client kubernetes.Interface
	// Dyn reads the GPU Operator's ClusterPolicies (nil: not checked).
	Dyn  dynamic.Interface
	Node string
}

var _ reconcile.OtherManagers = (*Others)(nil)

// Check implements reconcile.OtherManagers.
func (o *Others) Check(ctx context.Context) (string, error) {
	node, err := o.Client.CoreV1().Nodes().Get(ctx, o.Node, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading node %s: %w", o.Node, err)
	}
	return OtherManager(ctx, o.Client, o.Dyn, node)
}
