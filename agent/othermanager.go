package agent

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

// LabelDeployMigManager is the GPU Operator's switch for its MIG manager.
const LabelDeployMigManager = "nvidia.com/gpu.deploy.mig-manager"

// NVIDIADRADriver is the NVIDIA DRA driver's name in ResourceSlices.
const NVIDIADRADriver = "gpu.nvidia.com"

// OtherManager detects another MIG manager at work on the node: the GPU
// Operator's MIG manager (its deploy label set to true, or its pod running
// on the node) or the NVIDIA DRA driver advertising dynamically created MIG
// devices in this node's ResourceSlices. It returns a description, or "".
func OtherManager(ctx context.Context, c kubernetes.Interface, node *corev1.Node) (string, error) {
	if node.Labels[LabelDeployMigManager] == "true" {
		return fmt.Sprintf("the GPU Operator's MIG manager (node label %s=true)", LabelDeployMigManager), nil
	}
	pods, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node.Name).String(),
	})
	if err != nil {
		return "", fmt.Errorf("listing pods on the node: %w", err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if p.Labels["app"] == "nvidia-mig-manager" || strings.HasPrefix(p.Name, "nvidia-mig-manager") {
			return fmt.Sprintf("the GPU Operator's MIG manager (pod %s/%s)", p.Namespace, p.Name), nil
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
