package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/drain/podresources"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/record"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// Which pods a change evicts, the whole rule (Disruptor.Affected):
//   - the pods holding a GPU or MIG device the change takes away (a whole
//     GPU that changes in any way, a MIG device whose GPU instance is
//     destroyed), as the kubelet PodResources API reports them: under an
//     nvidia.com/ resource (device plugin) or through a ResourceClaim on the
//     NVIDIA DRA driver (findAffected, deviceHolders);
//   - when PodResources cannot be read: every pod of the node requesting an
//     nvidia.com/ resource, and every pod a ResourceClaim holding a device of
//     the change is reserved for (fallback);
//   - with a change that takes anything away, the pods --gpu-client-selector
//     matches (selectedPods);
//   - never a finished pod (Succeeded, Failed), nor a pod the API server no
//     longer has or that runs on another node (PodResources is stale, or a
//     pod of that name was made elsewhere);
//   - at the eviction, a pod not found, on another node, or found with
//     another UID (a new pod took the name) is already gone and counts as
//     evicted (Disruptor.Evict, evict).

// How affected pods were found (affectedPods.How, the change record's affectedBy).
const (
	// howPodResources: from the kubelet PodResources API.
	howPodResources = record.AffectedByPodResources
	// howAllGPUPodsPrefix starts How when PodResources could not be read and
	// every pod of the node requesting a device plugin GPU resource counts as
	// affected; the reason follows.
	howAllGPUPodsPrefix = record.AffectedByAllGPUPodsPrefix
	// howNothing: the change takes no device away, so no pod is affected.
	howNothing = record.AffectedByNothing
)

// deviceChange is what a MIG change takes away, by the device ids the device
// plugin hands to pods.
type deviceChange struct {
	// GPUs are the UUIDs ("GPU-…") of whole GPUs that change in any way,
	// their MIG mode included. A pod holding one of them is affected.
	GPUs []string
	// MIGDevices are the UUIDs ("MIG-…") of the MIG devices whose GPU
	// instance is destroyed (on a GPU whose MIG mode goes off: all of its
	// MIG devices). Pods on MIG devices that stay are not affected.
	MIGDevices []string
}

// Empty reports whether the change takes nothing away.
func (c deviceChange) Empty() bool { return len(c.GPUs) == 0 && len(c.MIGDevices) == 0 }

func (c deviceChange) set() map[string]bool {
	s := make(map[string]bool, len(c.GPUs)+len(c.MIGDevices))
	for _, id := range c.GPUs {
		s[podresources.NormalizeDeviceID(id)] = true
	}
	for _, id := range c.MIGDevices {
		s[podresources.NormalizeDeviceID(id)] = true
	}
	return s
}

// affectedPods is the answer of findAffected.
type affectedPods struct {
	// Pods to evict, as read from the API server (UIDs included), sorted by
	// namespace/name.
	Pods []corev1.Pod
	// How they were found: howPodResources, howNothing, or
	// howAllGPUPodsPrefix + why PodResources could not be read.
	How string
	// Devices maps "namespace/name" to the device ids that made the pod
	// affected (PodResources only).
	Devices map[string][]string
}

// Names returns "namespace/name" of each pod, in order.
func (a affectedPods) Names() []string { return podNames(a.Pods) }

// FellBack reports whether PodResources could not be read.
func (a affectedPods) FellBack() bool { return strings.HasPrefix(a.How, howAllGPUPodsPrefix) }

// deviceHolders returns, for each pod that holds a device of the change, the ids
// it holds ("namespace/name" → sorted ids): devices under an nvidia.com/
// resource (device plugin) by their UUID, and devices of claims on the
// NVIDIA DRA driver by the UUID idx gives them. A claimed device idx cannot
// resolve (not in the node's ResourceSlices, or they could not be read)
// counts as taken away, named "gpu.nvidia.com/<pool>/<device>": a pod is
// never left on a device that may go.
func deviceHolders(pods []podresources.Pod, change deviceChange, idx draIndex) map[string][]string {
	gone := change.set()
	out := map[string][]string{}
	for _, p := range pods {
		ids := []string{}
		for _, id := range p.GPUDeviceIDs() {
			if gone[id] {
				ids = append(ids, id)
			}
		}
		for _, d := range p.NVIDIAClaimDevices() {
			uuid, ok := idx.UUIDs[d]
			switch {
			case !ok:
				ids = append(ids, d.String())
			case gone[uuid] && !slices.Contains(ids, uuid):
				ids = append(ids, uuid)
			}
		}
		if len(ids) > 0 {
			sort.Strings(ids)
			out[p.Key()] = ids
		}
	}
	return out
}

// draIndex resolves the NVIDIA DRA driver's devices on the node (pool and
// device name, as claims and PodResources name them) to their UUIDs.
type draIndex struct {
	UUIDs map[dra.ClaimDevice]string
	// Pools are the driver's pools on the node (its pool is named after
	// the node).
	Pools map[string]bool
}

// readDRAIndex reads the node's ResourceSlices into a draIndex: the NVIDIA
// driver's uuid attribute of each device (GpuInfo.Attributes and
// MigDeviceInfo.GetDevice in dra-driver-nvidia-gpu
// cmd/gpu-kubelet-plugin/deviceinfo.go). No DRA API, or no right to read
// it, gives an index that resolves nothing (so every claimed NVIDIA device
// counts as taken away); the driver's pool is still known by the node's
// name (publishResources names it so).
func readDRAIndex(ctx context.Context, client kclient.Interface, log *slog.Logger, node string) (draIndex, error) {
	x := draIndex{UUIDs: map[dra.ClaimDevice]string{}, Pools: map[string]bool{node: true}}
	sl, err := dra.NodeSlices(ctx, client, node)
	switch {
	case errors.Is(err, dra.ErrNoDRA) || apierrors.IsForbidden(err):
		log.Warn("ResourceSlices unreadable; every claimed NVIDIA device counts as taken away", "error", err)
		return x, nil
	case err != nil:
		return x, err
	}
	x.UUIDs = dra.DRAUUIDs(sl)
	for d := range x.UUIDs {
		x.Pools[d.Pool] = true
	}
	return x, nil
}

// holdsClaims reports whether any pod holds a device of the NVIDIA DRA
// driver through a claim.
func holdsClaims(pods []podresources.Pod) bool {
	for _, p := range pods {
		if len(p.NVIDIAClaimDevices()) > 0 {
			return true
		}
	}
	return false
}

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// findAffected returns the pods of node that a change disturbs. It asks the
// kubelet PodResources API at socket which pod holds which device: a pod is
// affected when any of its containers holds a GPU or MIG device of change
// under a device plugin GPU resource (isGPUResource), or through a ResourceClaim on the NVIDIA
// DRA driver (dynamic_resources, resolved to UUIDs by the node's
// ResourceSlices; see deviceHolders). When PodResources cannot be read (socket ""
// included), every pod on the node that requests a device plugin GPU resource
// counts as affected, and so does every pod a ResourceClaim holding a
// device of the change is reserved for; How says why. Finished pods (Succeeded, Failed)
// hold no device and are never returned. An error means the API server
// could not be asked.
func findAffected(ctx context.Context, client kclient.Interface, log *slog.Logger, node, socket string,
	change deviceChange) (affectedPods, error) {
	if node == "" {
		return affectedPods{}, fmt.Errorf("find affected pods: %w", errNoNode)
	}
	if change.Empty() {
		return affectedPods{How: howNothing}, nil
	}
	held, err := podresources.List(ctx, socket)
	if err != nil {
		log.Warn("pod resources unreadable; every GPU pod of the node counts as affected", "error", err)
		return fallback(ctx, client, log, node, change, howAllGPUPodsPrefix+err.Error())
	}
	var idx draIndex
	if holdsClaims(held) {
		if idx, err = readDRAIndex(ctx, client, log, node); err != nil {
			return affectedPods{}, err
		}
	}
	holders := deviceHolders(held, change, idx)
	out := affectedPods{How: howPodResources, Devices: map[string][]string{}}
	keys := make([]string, 0, len(holders))
	for k := range holders {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		ns, name, _ := strings.Cut(key, "/")
		pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			log.Info("pod in pod resources is gone", "pod", key)
			continue
		case err != nil:
			return affectedPods{}, fmt.Errorf("get pod %s: %w", key, err)
		case pod.Spec.NodeName != node:
			// PodResources is stale, or a pod of that name was made elsewhere.
			log.Warn("pod in pod resources runs on another node; ignored", "pod", key, "podNode", pod.Spec.NodeName)
			continue
		case terminal(pod):
			continue
		}
		out.Pods = append(out.Pods, *pod)
		out.Devices[key] = holders[key]
	}
	return out, nil
}

// fallback finds the affected pods without PodResources: every pod of the
// node requesting a device plugin GPU resource, and the pods a ResourceClaim is
// reserved for (status.reservedFor) whose allocation (status.allocation)
// holds a device of the change on this node's NVIDIA DRA pool.
func fallback(ctx context.Context, client kclient.Interface, log *slog.Logger, node string, change deviceChange, how string) (affectedPods, error) {
	out, err := allGPUPods(ctx, client, node, how)
	if err != nil {
		return out, err
	}
	claimed, err := claimHolders(ctx, client, log, node, change)
	if err != nil {
		return affectedPods{}, err
	}
	for _, p := range claimed {
		if !slices.ContainsFunc(out.Pods, func(q corev1.Pod) bool { return q.UID == p.UID }) {
			out.Pods = append(out.Pods, p)
		}
	}
	sort.Slice(out.Pods, func(i, j int) bool {
		return out.Pods[i].Namespace+"/"+out.Pods[i].Name < out.Pods[j].Namespace+"/"+out.Pods[j].Name
	})
	return out, nil
}

// claimHolders lists the running pods of node that ResourceClaims holding a
// device of the change are reserved for. No DRA API, or no right to list
// claims: none (the nvidia.com/ request rule stands alone, and says so in
// the log).
func claimHolders(ctx context.Context, client kclient.Interface, log *slog.Logger, node string, change deviceChange) ([]corev1.Pod, error) {
	claims, err := dra.Claims(ctx, client)
	switch {
	case errors.Is(err, dra.ErrNoDRA):
		return nil, nil
	case apierrors.IsForbidden(err):
		log.Warn("ResourceClaims unreadable; pods holding claims are not found without PodResources", "error", err)
		return nil, nil
	case err != nil:
		return nil, err
	}
	var idx draIndex
	gone := change.set()
	var out []corev1.Pod
	for _, c := range claims {
		takes := false
		for _, d := range c.Devices {
			if d.Driver != dra.NVIDIADRADriver {
				continue
			}
			if idx.UUIDs == nil {
				if idx, err = readDRAIndex(ctx, client, log, node); err != nil {
					return nil, err
				}
			}
			uuid, ok := idx.UUIDs[d]
			if idx.Pools[d.Pool] && (!ok || gone[uuid]) {
				takes = true
			}
		}
		if !takes {
			continue
		}
		for _, name := range c.Pods {
			pod, err := client.CoreV1().Pods(c.Namespace).Get(ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				continue
			case err != nil:
				return nil, fmt.Errorf("get pod %s/%s: %w", c.Namespace, name, err)
			}
			if pod.Spec.NodeName == node && !terminal(pod) {
				out = append(out, *pod)
			}
		}
	}
	return out, nil
}

func allGPUPods(ctx context.Context, client kclient.Interface, node, how string) (affectedPods, error) {
	pods, err := NodePods(ctx, client, node)
	if err != nil {
		return affectedPods{}, err
	}
	out := affectedPods{How: how}
	for i := range pods {
		p := &pods[i]
		if podresources.RequestsGPU(p) && !terminal(p) {
			out.Pods = append(out.Pods, *p)
		}
	}
	sort.Slice(out.Pods, func(i, j int) bool {
		return out.Pods[i].Namespace+"/"+out.Pods[i].Name < out.Pods[j].Namespace+"/"+out.Pods[j].Name
	})
	return out, nil
}

func podNames(pods []corev1.Pod) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	return out
}

// selectedPods lists the pods of node that selector (a label selector)
// matches and that are not terminating, as "namespace/name": GPU clients
// that request no GPU resource (a monitoring agent, a sidecar that opens
// the GPUs), which PodResources cannot tie to a device. The agent evicts
// them with the pods a change affects (--gpu-client-selector); a DaemonSet
// brings its pod back only where it tolerates the reconfiguring taint.
func selectedPods(ctx context.Context, client kclient.Interface, node, selector string) ([]string, error) {
	if node == "" {
		return nil, fmt.Errorf("list GPU client pods: %w", errNoNode)
	}
	list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		LabelSelector: selector,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list the GPU client pods (%s) of node %s: %w", selector, node, err)
	}
	var out []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName == node {
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Affected implements reconcile.Disruptor: the pods the change of gpuUUIDs
// and migUUIDs evicts, by the rule above, sorted, and how they were found.
func (d *Disruptor) Affected(ctx context.Context, gpuUUIDs, migUUIDs []string) ([]string, string, error) {
	a, err := findAffected(ctx, d.Client, d.Log, d.Node, d.Settings.PodResourcesSocket, deviceChange{GPUs: gpuUUIDs, MIGDevices: migUUIDs})
	if err != nil {
		return nil, "", err
	}
	if a.FellBack() {
		d.Log.Warn("PodResources unreadable: every GPU pod on the node counts as affected", "how", a.How)
	}
	names := a.Names()
	if d.Settings.GPUClientSelector != "" && (len(gpuUUIDs) > 0 || len(migUUIDs) > 0) {
		clients, err := selectedPods(ctx, d.Client, d.Node, d.Settings.GPUClientSelector)
		if err != nil {
			return nil, "", err
		}
		for _, c := range clients {
			if !slices.Contains(names, c) {
				names = append(names, c)
			}
		}
		sort.Strings(names)
	}
	if err := d.plannerRefuses(ctx, names); err != nil {
		return nil, "", err
	}
	return names, a.How, nil
}

// Evict implements reconcile.Disruptor: it evicts the pods of names still
// on the node (evict, with the drain settings); pods already gone count as
// evicted.
func (d *Disruptor) Evict(ctx context.Context, names []string) ([]string, error) {
	var pods []corev1.Pod
	for _, n := range names {
		ns, name, _ := strings.Cut(n, "/")
		p, err := d.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && p.Spec.NodeName != d.Node) {
			continue // gone (or a new pod of that name elsewhere)
		}
		if err != nil {
			return nil, err
		}
		pods = append(pods, *p)
	}
	return evict(ctx, d.Client, d.Log, pods, evictOptions{
		Timeout: d.Settings.DrainTimeout, RetryDelay: d.Settings.EvictionRetryDelay, RefuseUnmanaged: !d.Settings.EvictUnmanagedPods,
	})
}
