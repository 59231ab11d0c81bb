package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/readonce"
)

// devicePluginPods are the pod labels of the daemons that read the MIG
// devices once, when they start, and so must be restarted to see a new
// geometry:
//   - NVIDIA's device plugin enumerates the devices in startPlugins
//     (k8s-device-plugin cmd/nvidia-device-plugin/main.go) and enumerates
//     again only on SIGHUP or when the kubelet's socket is re-created; its
//     resource managers are built once from that walk
//     (internal/rm/nvml_manager.go NewNVMLResourceManagers);
//   - GPU Feature Discovery labels the node (nvidia.com/mig.strategy, the
//     nvidia.com/mig-* count labels) from the same walk.
//
// Their pods carry "app" as the GPU Operator deploys them
// (gpu-operator assets/state-device-plugin/0500_daemonset.yaml,
// assets/gpu-feature-discovery/0500_daemonset.yaml) or
// "app.kubernetes.io/name" as the k8s-device-plugin Helm chart does
// (deployments/helm/nvidia-device-plugin/templates/_helpers.tpl, which
// deploys GFD from the same chart, with the same name label).
//
// The GPU Operator's validator is restarted with them, as NVIDIA's MIG
// manager does after every change so that its validations (CUDA, device
// plugin) run again on the new geometry (mig-parted
// pkg/mig/reconfigure/reconfigure.go restartValidatorPod: the pods
// app=nvidia-operator-validator on the node; its DaemonSet,
// assets/state-operator-validation/0500_daemonset.yaml, brings new ones).
//
// NVIDIA's DRA driver kubelet plugin, without DynamicMIG, announces the MIG
// devices that exist when it starts and never looks again (publishResources
// in dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/driver.go). Its chart
// labels the DaemonSet's pods "<name>-component: kubelet-plugin" with name
// dra-driver-nvidia-gpu, or the chart's nameOverride
// (deployments/helm/dra-driver-nvidia-gpu/templates/_helpers.tpl
// selectorLabels, templates/kubeletplugin.yaml).
//
// DefaultPluginSelectors are these, one label selector each: the default
// of --plugin-selector, which names them otherwise (a renamed or
// self-installed plugin, a nameOverride).
var DefaultPluginSelectors = []string{
	"app=nvidia-device-plugin-daemonset",
	"app=gpu-feature-discovery",
	"app=nvidia-operator-validator",
	"app.kubernetes.io/name=nvidia-device-plugin",
	"app.kubernetes.io/name=gpu-feature-discovery",
	"dra-driver-nvidia-gpu-component=kubelet-plugin",
}

// pluginSelectors parses selectors (DefaultPluginSelectors when empty).
func pluginSelectors(selectors []string) ([]labels.Selector, error) {
	if len(selectors) == 0 {
		selectors = DefaultPluginSelectors
	}
	out := make([]labels.Selector, 0, len(selectors))
	for _, s := range selectors {
		sel, err := labels.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("plugin selector %q: %w", s, err)
		}
		if sel.Empty() {
			return nil, fmt.Errorf("plugin selector %q: %w", s, errEmptySelector)
		}
		out = append(out, sel)
	}
	return out, nil
}

// errEmptySelector: a plugin selector that selects every pod.
var errEmptySelector = errors.New("selects every pod of the node")

// isPluginPod reports whether p matches one of sels.
func isPluginPod(p *corev1.Pod, sels []labels.Selector) bool {
	for _, sel := range sels {
		if sel.Matches(labels.Set(p.Labels)) {
			return true
		}
	}
	return false
}

// listDevicePlugins lists the device plugin, GPU Feature Discovery and DRA
// kubelet plugin pods of node (those selectors select: --plugin-selector,
// DefaultPluginSelectors when empty) that are not terminating, as
// "namespace/name/uid". Take the list before the GPUs change: those pods
// enumerated the old geometry. (Comparing creation times with the time of
// the change instead would trust the node's clock to agree with the API
// server's.)
func listDevicePlugins(ctx context.Context, client kclient.Interface, node string, selectors []string) ([]string, error) {
	if node == "" {
		return nil, fmt.Errorf("list device plugins: %w", errNoNode)
	}
	sels, err := pluginSelectors(selectors)
	if err != nil {
		return nil, err
	}
	pods, err := NodePods(ctx, client, node)
	if err != nil {
		return nil, err
	}
	var out []string
	for i := range pods {
		p := &pods[i]
		if isPluginPod(p, sels) && p.DeletionTimestamp == nil {
			out = append(out, p.Namespace+"/"+p.Name+"/"+string(p.UID))
		}
	}
	sort.Strings(out)
	return out, nil
}

// NodePods lists the pods of node (spec.nodeName), of every namespace.
// Within a readonce memo (readonce.With: the agent's look at its node
// before a change) the list is read once and shared by the checks that
// want it: callers must not modify it.
func NodePods(ctx context.Context, client kclient.Interface, node string) ([]corev1.Pod, error) {
	return readonce.Do(ctx, "pods/"+node, func(ctx context.Context) ([]corev1.Pod, error) {
		list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
		})
		if err != nil {
			return nil, fmt.Errorf("list the pods of node %s: %w", node, err)
		}
		return list.Items, nil
	})
}

// restartDevicePlugins evicts the pods of listDevicePlugins' list that still
// exist with the same UID, so that their DaemonSets start new ones that read
// the new geometry. A pod that is gone, or was replaced by a new one (a
// paused operand brought back), already reads it and is skipped. Eviction
// (not deletion) keeps the agent's permissions to what it already needs for
// workloads. It returns the pods it evicted ("namespace/name") and does not
// wait for their successors: the caller waits for the node's allocatable.
func restartDevicePlugins(ctx context.Context, client kclient.Interface, log *slog.Logger, pods []string) ([]string, error) {
	var out []string
	for _, ref := range pods {
		parts := strings.SplitN(ref, "/", 3)
		if len(parts) != 3 {
			return out, fmt.Errorf("restart device plugins: bad pod reference %q", ref)
		}
		ns, name, uid := parts[0], parts[1], parts[2]
		ev := &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Name: name, Namespace: ns},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(uid)},
		}
		err := client.PolicyV1().Evictions(ns).Evict(ctx, ev)
		switch {
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			continue // gone, or replaced by a pod that reads the new geometry
		case err != nil:
			return out, fmt.Errorf("evict device plugin pod %s/%s: %w", ns, name, err)
		}
		out = append(out, ns+"/"+name)
	}
	if len(out) > 0 {
		log.Info("device plugin pods restarted to see the new MIG devices", "pods", out)
	}
	return out, nil
}
