package planner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	schedcorev1 "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/migagent/mig-agent/drain/podresources"
	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/labelwriter"
	"github.com/migagent/mig-agent/profiles"
	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
)

// Labels and annotations the planner reads and writes.
const (
	// LabelOptIn on a Node lets the planner change its geometry.
	LabelOptIn = record.LabelPlannerOptIn
	// OptInValue is the value that opts a node in.
	OptInValue = record.PlannerOptInValue
	// LabelGPUProduct and LabelGPUCount are GPU Feature Discovery's labels:
	// the model and the number of GPUs of the node.
	LabelGPUProduct = "nvidia.com/gpu.product"
	LabelGPUCount   = "nvidia.com/gpu.count"
	// ResourcePrefix is the device plugin's resource of a MIG device, mixed
	// strategy: nvidia.com/mig-<profile>.
	ResourcePrefix = "nvidia.com/mig-"
	// FieldManager names the planner's writes: the node's agent knows a
	// change the planner asked for by it, in the managedFields entry that
	// owns the label (or in the requester stamp's via).
	FieldManager = record.PlannerFieldManager
)

// Event reasons on a pending pod.
const (
	ReasonPlanned    = "MigGeometryPlanned"
	ReasonUnservable = "MigGeometryUnservable"
	// ReasonSilent (Warning, on a Node): its agent has not acted on the
	// label within --node-act-timeout.
	ReasonSilent = "MigPlannerNodeSilent"
)

// ErrUnknownModel: the node's GPU model is none that mig-agent knows.
var ErrUnknownModel = errors.New("unknown GPU model")

// PendingPods lists the pods the scheduler found no node for
// (PodScheduled=False, reason Unschedulable) that ask for MIG devices:
// nvidia.com/mig-<profile> limits, or ResourceClaims of MigDeviceClass
// whose selector names a profile.
func PendingPods(ctx context.Context, c kclient.Interface) ([]Pod, error) {
	unbound, err := listUnbound(ctx, c)
	if err != nil {
		return nil, err
	}
	return pendingFrom(ctx, c, unbound)
}

// listUnbound lists the pods without a node.
func listUnbound(ctx context.Context, c kclient.Interface) ([]*corev1.Pod, error) {
	list, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName="})
	if err != nil {
		return nil, fmt.Errorf("listing pending pods: %w", err)
	}
	out := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

// pendingFrom picks, of the unbound pods, those PendingPods returns (never
// changing one: they may be a watch's).
func pendingFrom(ctx context.Context, c kclient.Interface, unbound []*corev1.Pod) ([]Pod, error) {
	var pods []*corev1.Pod
	var wants []map[string]int
	for _, p := range unbound {
		if _, ok := unschedulableSince(p); !ok {
			continue
		}
		pods, wants = append(pods, p), append(wants, MigWants(p))
	}
	if err := addClaimWants(ctx, c, pods, wants); err != nil {
		return nil, err
	}
	var out []Pod
	for i, p := range pods {
		if len(wants[i]) == 0 {
			continue
		}
		since, _ := unschedulableSince(p)
		out = append(out, Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Created: p.CreationTimestamp.Time,
			Pending: since, Wants: wants[i], lands: landsOn(p)})
	}
	return out, nil
}

// unschedulableSince is since when the scheduler has found no node for p
// (ok false: it found one, has not tried, or p is going).
func unschedulableSince(p *corev1.Pod) (time.Time, bool) {
	if p.Spec.NodeName != "" || p.DeletionTimestamp != nil {
		return time.Time{}, false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.LastTransitionTime.Time, true
		}
	}
	return time.Time{}, false
}

// MigWants counts the MIG devices a pod's containers ask for, by profile
// (init containers run one at a time: the largest of them counts, as the
// scheduler counts them). Counts are bounded (AddWant): limits that would
// overflow a sum stay at MaxWant.
func MigWants(p *corev1.Pod) map[string]int {
	wants := map[string]int{}
	for _, c := range p.Spec.Containers {
		for r, q := range c.Resources.Limits {
			if prof, ok := strings.CutPrefix(string(r), ResourcePrefix); ok {
				AddWant(wants, prof, quantity(q))
			}
		}
	}
	for _, c := range p.Spec.InitContainers {
		for r, q := range c.Resources.Limits {
			if prof, ok := strings.CutPrefix(string(r), ResourcePrefix); ok {
				init := map[string]int{}
				AddWant(init, prof, quantity(q))
				wants[prof] = max(wants[prof], init[prof])
				if wants[prof] == 0 {
					delete(wants, prof)
				}
			}
		}
	}
	return wants
}

// quantity is q as a count of devices, at most MaxWant (a quantity too
// large for an int64 too).
func quantity(q resource.Quantity) int64 {
	if q.CmpInt64(MaxWant) > 0 {
		return MaxWant
	}
	return q.Value()
}

// usesGPU: the pod asks for a GPU resource, by the agent's own rule
// (podresources.RequestsGPU: nvidia.com/gpu or nvidia.com/mig-*, not
// NVIDIA's NICs' nvidia.com/hostdev or RDMA resources).
func usesGPU(p *corev1.Pod) bool { return podresources.RequestsGPU(p) }

// landsOn is a test of the nodes p can be scheduled on, by the
// scheduler's own helpers: its node selector and required node affinity
// (nodeaffinity.GetRequiredNodeAffinity), and the node's NoSchedule and
// NoExecute taints against its tolerations. Left out are the taints that
// go by themselves: the agent's reconfiguring taint (when the change is
// done) and those the node lifecycle controller sets for a passing
// condition (node.kubernetes.io/not-ready, unreachable, memory-pressure,
// ...; not node.kubernetes.io/unschedulable, a cordon someone chose).
func landsOn(p *corev1.Pod) func(*corev1.Node) string {
	aff := nodeaffinity.GetRequiredNodeAffinity(p)
	tolerations := p.Spec.Tolerations
	hard := func(t *corev1.Taint) bool {
		passing := t.Key == record.TaintReconfiguring ||
			strings.HasPrefix(t.Key, "node.kubernetes.io/") && t.Key != corev1.TaintNodeUnschedulable
		return !passing && (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute)
	}
	return func(n *corev1.Node) string {
		if ok, err := aff.Match(n); err != nil || !ok {
			return "its node selector or node affinity does not match"
		}
		if t, found := schedcorev1.FindMatchingUntoleratedTaint(klog.Background(), n.Spec.Taints, tolerations, hard, false); found {
			return "it does not tolerate the taint " + t.ToString()
		}
		return ""
	}
}

// Nodes reads every opted-in node: its GPUs, their profiles and
// placements as its agent discovered them through NVML and published them
// (ConfigMap <node>-mig-config in namespace, annotation migagent.io/gpus),
// its geometry
// from that and its agent's records, the devices in use from its agent's
// assignment trail (ConfigMap <node>-mig-assignments), checked against the
// pods running on it. Only where the agent has published no GPUs (an older
// agent) do GPU Feature Discovery's labels and the built-in table stand in.
func Nodes(ctx context.Context, c kclient.Interface, spec *geometry.Spec, namespace string) ([]*Node, error) {
	list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: LabelOptIn + "=" + OptInValue})
	if err != nil {
		return nil, fmt.Errorf("listing opted-in nodes: %w", err)
	}
	out := make([]*Node, 0, len(list.Items))
	for i := range list.Items {
		n, err := readNode(ctx, c, spec, namespace, &list.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *Node) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func readNode(ctx context.Context, c kclient.Interface, spec *geometry.Spec, namespace string, kn *corev1.Node) (*Node, error) {
	st := published.NodeOf(kn)
	n := &Node{Name: kn.Name, Desired: st.Desired, Applied: st.Applied, obj: kn}
	// In flight: a change runs, or a label the agent has not acted on yet
	// (a failed change is not: the agent retries it on its own).
	n.Changing = st.State == record.StatePending || st.State == record.StateRebooting
	n.InFlight = n.Changing || st.State != record.StateFailed && st.Desired != "" && st.Desired != n.Applied
	// When the planner set the label, as the API server recorded its write
	// (the managedFields entry that owns the label is the planner's): the
	// hold time holds across a restart or a new leader, with nothing
	// written on the Node but the label.
	if m, at, ok := labelwriter.Of(kn.ManagedFields, record.LabelConfig); ok && at != nil {
		n.LabelAt = *at
		if m == FieldManager {
			n.PlannedAt = *at
		}
	}
	gpus, note, err := publishedGPUs(ctx, c, namespace, kn.Name, kn.Labels, st)
	if errors.Is(err, published.ErrNotPublished) {
		// An agent older than the planner: GFD's labels and the built-in
		// table of models, as before.
		if gpus, err = NodeGPUs(kn.Labels, st, spec); err == nil {
			note = published.ErrNotPublished.Error() + ": planned from GPU Feature Discovery's labels and the built-in table of models"
		} else {
			err = fmt.Errorf("%w; %w", published.ErrNotPublished, err)
		}
	}
	if err != nil {
		n.Unreadable = err.Error()
	}
	n.GPUs, n.Note = gpus, note
	if err := readInUse(ctx, c, namespace, n); err != nil {
		return nil, err
	}
	return n, nil
}

// NodeGPUs builds the node's GPUs as the agent's planner sees them: the
// model from GPU Feature Discovery's nvidia.com/gpu.product, the count from
// the record's geometry (else nvidia.com/gpu.count), the instances from the
// newest record with a geometry, the MIG mode from the applied config.
func NodeGPUs(labels map[string]string, st published.Node, spec *geometry.Spec) ([]geometry.GPU, error) {
	m, err := modelOf(labels[LabelGPUProduct])
	if err != nil {
		return nil, err
	}
	count := len(st.Geometry)
	if count == 0 {
		if count, err = strconv.Atoi(labels[LabelGPUCount]); err != nil || count <= 0 {
			return nil, fmt.Errorf("no GPU count: no recorded geometry and label %s is %q", LabelGPUCount, labels[LabelGPUCount])
		}
	}
	gpus := make([]geometry.GPU, count)
	for i := range gpus {
		gpus[i] = geometry.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Name: m.Name, PCIDeviceID: m.PCIDeviceID,
			Architecture: m.Architecture, MigCapable: m.MigCapable, CanReset: true, Catalogue: m.Catalogue}
	}
	if err := overlay(gpus, st.Geometry); err != nil {
		return nil, err
	}
	enabled := map[int]bool{}
	if st.Applied != "" && spec != nil {
		if reqs, _, err := spec.Resolve(st.Applied, gpus); err == nil {
			for _, r := range reqs {
				enabled[r.GPU] = r.MigEnabled
			}
		}
	}
	for i := range gpus {
		gpus[i].ModeCurrent = enabled[i] || len(gpus[i].Instances) > 0
		gpus[i].ModePending = gpus[i].ModeCurrent
	}
	return gpus, nil
}

// modelOf finds the model GPU Feature Discovery names: the NVML name with
// spaces as dashes, and "-MIG-..." or "-SHARED" appended by some strategies.
func modelOf(product string) (*profiles.Model, error) {
	if product == "" {
		return nil, fmt.Errorf("%w: label %s is not set", ErrUnknownModel, LabelGPUProduct)
	}
	base, _, _ := strings.Cut(product, "-MIG-")
	base = strings.TrimSuffix(base, "-SHARED")
	for _, m := range profiles.Models() {
		if strings.ReplaceAll(m.Name, " ", "-") == base && m.MigCapable {
			return &m, nil
		}
	}
	return nil, fmt.Errorf("%w: %s=%q", ErrUnknownModel, LabelGPUProduct, product)
}

// readInUse fills n.InUse from the open entries of the node's assignment
// trail, and n.Unlocated with the running pods on the node that ask for a
// GPU resource but hold no device the trail names.
func readInUse(ctx context.Context, c kclient.Interface, namespace string, n *Node) error {
	located := map[string]bool{}
	h, err := published.Trail(ctx, c, namespace, n.Name)
	switch {
	case err != nil:
		n.Unreadable = "its assignment trail cannot be read: " + err.Error()
	case h != nil:
		for _, e := range h.Entries {
			if !e.Open() {
				continue
			}
			pod := e.Namespace + "/" + e.Pod
			start, _, _ := strings.Cut(e.Device.Placement, "+")
			s, err := strconv.Atoi(start)
			if e.Device.GPU < 0 || err != nil {
				n.Unlocated = append(n.Unlocated, pod)
				continue
			}
			located[pod] = true
			n.InUse = append(n.InUse, InUse{GPU: e.Device.GPU, Start: s, Profile: e.Device.Profile, Pod: pod})
		}
	}
	pods, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return fmt.Errorf("listing the pods of node %s: %w", n.Name, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		key := p.Namespace + "/" + p.Name
		if p.Spec.NodeName != n.Name {
			continue
		}
		done := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		if !done && usesGPU(p) && !located[key] && !slices.Contains(n.Unlocated, key) {
			n.Unlocated = append(n.Unlocated, key)
		}
	}
	slices.Sort(n.Unlocated)
	return nil
}
