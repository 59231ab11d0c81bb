package kubetest

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// Labels of NVIDIA's device plugin DaemonSet as the GPU Operator deploys it
// (gpu-operator assets/state-device-plugin/0500_daemonset.yaml).
const (
	DevicePluginApp         = "nvidia-device-plugin-daemonset"
	DevicePluginDeployLabel = "nvidia.com/gpu.deploy.device-plugin"
	// nodeLabel pins a test's DaemonSet to its own node: tests share one
	// API server and each plays its own node.
	nodeLabel = "kubetest.migagent.io/node"
)

// PluginGPU is one GPU as NVIDIA's device plugin enumerates it.
type PluginGPU struct {
	MigEnabled bool
	// MIGDevices: the profile of each MIG device ("1g.18gb", "1g.18gb+me").
	MIGDevices []string
}

// PluginGPUsOf reads `mig-agent profiles -o json` into what the device
// plugin stand-in enumerates: per GPU its MIG mode and one device per MIG
// device (compute instance), named by its profile (the compute instance's
// where it is smaller than its GPU instance), as NVIDIA's plugin builds
// one device per MIG device handle named by that device's profile
// (k8s-device-plugin internal/rm, buildMigDeviceMap: walkMigDevices,
// getMigProfile).
func PluginGPUsOf(profilesJSON []byte) ([]PluginGPU, error) {
	var doc struct {
		GPUs []struct {
			MigMode struct {
				Current bool `json:"current"`
			} `json:"migMode"`
			Instances []struct {
				Profile string `json:"profile"`
				Compute string `json:"compute"`
			} `json:"instances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(profilesJSON, &doc); err != nil {
		return nil, fmt.Errorf("profiles -o json: %w", err)
	}
	out := make([]PluginGPU, 0, len(doc.GPUs))
	for _, g := range doc.GPUs {
		pg := PluginGPU{MigEnabled: g.MigMode.Current}
		for _, in := range g.Instances {
			pg.MIGDevices = append(pg.MIGDevices, cmp.Or(in.Compute, in.Profile))
		}
		out = append(out, pg)
	}
	return out, nil
}

// DevicePlugin plays NVIDIA's device plugin on one node, run the way the
// GPU Operator runs it, and the parts of the scheduler and the kubelet it
// needs.
//
// Where it stays, now that NVIDIA's own plugin runs on a real kubelet
// (e2e/realnode_*_test.go, TestRealNode…): a machine holds one real
// kubelet (its device-plugin directory is fixed), so the scenarios of
// several nodes at once (rollout slots, the fleet, the planner choosing
// among nodes, a node lost mid-change, the GPU Operator's controller over
// several nodes) keep this stand-in. Everything a single node with
// NVIDIA's plugin shows (the plugin restarted after a change, its sharing
// configs, the config-manager and its node label, the kubelet's status
// sync, a plugin whose start is held, Allocate and admission) is tested
// there with the real parts, and this stand-in has no knobs for them: it
// advertises each MIG device once. The DaemonSet is real and so is its controller
// (kube-controller-manager's daemonset-controller, started by Main): it
// creates the plugin's pod while the node carries
// nvidia.com/gpu.deploy.device-plugin=true and deletes it when the label is
// paused, and it creates a new one when the pod is evicted.
//
//   - Scheduling: the DaemonSet controller's pods name their node in a
//     required node affinity; like kube-scheduler, this binds such a pod
//     when it tolerates the node's NoSchedule and NoExecute taints, and
//     tries again when the node changes (pkg/scheduler/backend/queue
//     MoveAllToActiveOrBackoffQueue; here: every 200 ms until bound or gone).
//   - The plugin: when its pod runs, it enumerates the GPUs once (read), and
//     advertises per MIG strategy what NVIDIA's does: resource managers are
//     built once, in startPlugins (k8s-device-plugin
//     cmd/nvidia-device-plugin/main.go), one per resource with at least one
//     device (internal/rm/nvml_manager.go NewNVMLResourceManagers); only a
//     restart (a new pod, SIGHUP, a kubelet restart) enumerates again. The
//     GPUs changing under it change nothing it advertises.
//   - The kubelet's device manager: what a running plugin advertises is
//     capacity and allocatable; when the plugin stops, its resources stay
//     in capacity, unhealthy, with allocatable 0 (PluginDisconnected →
//     markResourceUnhealthy, then GetCapacity in k8s.io/kubernetes
//     pkg/kubelet/cm/devicemanager/manager.go), until the grace period of
//     five minutes (endpointStopGracePeriod, types.go) ends, longer than any
//     test. A resource the new plugin advertises again gets its new count.
type DevicePlugin struct {
	t        TB
	client   kubernetes.Interface
	node     string
	ns       string
	strategy string
	read     func() ([]PluginGPU, error)
	loop     *podLoop

	mu      sync.Mutex
	running string // UID of the pod whose plugin runs, "" none
	starts  int    // plugin starts (enumerations)
	// The kubelet's device manager's view, per resource: every device it
	// knows (capacity) and the healthy ones (allocatable).
	capacity, healthy map[string]int64
}

// StartDevicePlugin creates, in namespace ns, the device plugin DaemonSet
// for node, labels the node nvidia.com/gpu.deploy.device-plugin=true (as the
// GPU Operator does on GPU nodes) unless it carries that label already,
// reports the node Ready (lifting the not-ready taint, as the kubelet and
// the node lifecycle controller do), and plays the plugin until the test
// ends. read enumerates the node's GPUs;
// strategy is the plugin's MIG strategy (none, single, mixed).
func StartDevicePlugin(t TB, client kubernetes.Interface, node, ns, strategy string, read func() ([]PluginGPU, error)) *DevicePlugin {
	t.Helper()
	p := &DevicePlugin{t: t, client: client, node: node, ns: ns, strategy: strategy, read: read,
		capacity: map[string]int64{}, healthy: map[string]int64{}}
	readyForDaemonSet(t, client, node, map[string]string{DevicePluginDeployLabel: "true"})
	app := DevicePluginApp
	labels := map[string]string{"app": app}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: app + "-" + shortName(node), Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app, nodeLabel: node}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app, nodeLabel: node}},
				Spec: corev1.PodSpec{
					NodeSelector:      map[string]string{DevicePluginDeployLabel: "true", nodeLabel: node},
					Tolerations:       []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					PriorityClassName: "system-node-critical",
					Containers: []corev1.Container{{
						Name: "nvidia-device-plugin", Image: "nvcr.io/nvidia/k8s-device-plugin:v0.18.0",
						Env: []corev1.EnvVar{{Name: "MIG_STRATEGY", Value: strategy}},
					}},
				},
			},
		},
	}
	p.loop = runDaemonSet(t, client, node, ds, p.start, p.stop)
	return p
}

// readyForDaemonSet labels node for a test's DaemonSet (nodeLabel, and
// labels it does not carry yet) and reports it Ready, lifting the
// not-ready taint, as the kubelet and the node lifecycle controller do.
func readyForDaemonSet(t TB, client kubernetes.Interface, node string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[nodeLabel] = node
		for k, v := range labels {
			if _, ok := n.Labels[k]; !ok {
				n.Labels[k] = v
			}
		}
		// The node lifecycle controller lifts the not-ready taint (that the
		// API server's TaintNodesByCondition admission put on the new Node)
		// once the kubelet reports Ready; DaemonSet pods do not tolerate it.
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == corev1.TaintNodeNotReady && t.Effect == corev1.TaintEffectNoSchedule
		})
		_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("label node %s: %v", node, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Conditions = append(slices.DeleteFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady }),
			corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now})
		_, err = client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("node %s Ready: %v", node, err)
	}
}

// podLoop plays, for the pods of one test DaemonSet on one node (those
// labelled nodeLabel=node in ns), kube-scheduler (bind) and the kubelet
// (start the daemon when its pod is bound, stop it and remove the pod when
// it is deleted or evicted).
type podLoop struct {
	t            TB
	client       kubernetes.Interface
	node, ns, ds string // ds: the DaemonSet's name
	start, stop  func(ctx context.Context, pod *corev1.Pod)

	mu      sync.Mutex
	waiting map[types.UID]bool // pods not placed yet, retried as the node changes
}

// runDaemonSet creates ds (its pod template labelled nodeLabel=node) and
// runs its pods on node until the test ends; then the DaemonSet and its
// pods are deleted.
func runDaemonSet(t TB, client kubernetes.Interface, node string, ds *appsv1.DaemonSet,
	start, stop func(ctx context.Context, pod *corev1.Pod)) *podLoop {
	t.Helper()
	ctx := context.Background()
	ns := ds.Namespace
	if _, err := client.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DaemonSet %s/%s: %v", ns, ds.Name, err)
	}
	p := &podLoop{t: t, client: client, node: node, ns: ns, ds: ds.Name, start: start, stop: stop}
	loopCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for loopCtx.Err() == nil {
			if err := p.once(loopCtx); err != nil && loopCtx.Err() == nil {
				select {
				case <-loopCtx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		cctx, ccancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer ccancel()
		if t.Failed() {
			p.explain(cctx)
		}
		_ = client.AppsV1().DaemonSets(ns).Delete(cctx, ds.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)})
		pods, _ := client.CoreV1().Pods(ns).List(cctx, metav1.ListOptions{LabelSelector: nodeLabel + "=" + node})
		if pods != nil {
			for _, pod := range pods.Items {
				_ = client.CoreV1().Pods(ns).Delete(cctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			}
		}
	})
	return p
}

// explain logs what the DaemonSet controller and the stand-ins made of
// the DaemonSet (status, Events, pods, taints, the controller's log).
func (p *podLoop) explain(ctx context.Context) {
	var b strings.Builder
	if ds, err := p.client.AppsV1().DaemonSets(p.ns).Get(ctx, p.ds, metav1.GetOptions{}); err != nil {
		fmt.Fprintf(&b, "DaemonSet %s/%s: %v\n", p.ns, p.ds, err)
	} else {
		s := ds.Status
		fmt.Fprintf(&b, "DaemonSet %s/%s: generation %d observed %d, desired %d current %d ready %d misscheduled %d\n", p.ns, p.ds,
			ds.Generation, s.ObservedGeneration, s.DesiredNumberScheduled, s.CurrentNumberScheduled, s.NumberReady, s.NumberMisscheduled)
	}
	if evs, err := p.client.CoreV1().Events(p.ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "DaemonSet" && e.InvolvedObject.Name == p.ds {
				fmt.Fprintf(&b, "  event %s %s x%d (last %s): %s\n", e.Type, e.Reason, e.Count, e.LastTimestamp.UTC().Format(time.RFC3339), e.Message)
			}
		}
	}
	if pods, err := p.client.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{LabelSelector: nodeLabel + "=" + p.node}); err == nil {
		for _, pod := range pods.Items {
			fmt.Fprintf(&b, "  pod %s uid %s created %s node %q phase %s deleting %v\n", pod.Name, pod.UID,
				pod.CreationTimestamp.UTC().Format(time.RFC3339), pod.Spec.NodeName, pod.Status.Phase, pod.DeletionTimestamp != nil)
		}
	}
	if n, err := p.client.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{}); err == nil {
		fmt.Fprintf(&b, "  node %s taints %v\n", p.node, n.Spec.Taints)
	}
	if log, err := os.ReadFile(filepath.Join(StateDir(), "kube-controller-manager.log")); err == nil {
		lines := slices.DeleteFunc(strings.Split(string(log), "\n"), func(l string) bool {
			return !(strings.Contains(l, p.ns) || strings.Contains(l, p.node) || strings.HasPrefix(l, "E") || strings.HasPrefix(l, "W")) ||
				strings.Contains(l, "Nodes needing daemon pods") || strings.Contains(l, "Pods to delete for")
		})
		fmt.Fprintf(&b, "  kube-controller-manager on %s and node %s, and its warnings (last 30 lines):\n    %s\n", p.ns, p.node, strings.Join(lines[max(0, len(lines)-30):], "\n    "))
	}
	p.mu.Lock()
	fmt.Fprintf(&b, "  pods the scheduler stand-in waits to place: %d", len(p.waiting))
	p.mu.Unlock()
	p.t.Logf("%s", b.String())
}

// Starts counts the plugin's starts (each one enumerates the GPUs).
func (p *DevicePlugin) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Running reports whether a plugin pod runs on the node now.
func (p *DevicePlugin) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running != ""
}

// Counted reports whether a plugin pod runs on the node and the DaemonSet
// controller counts it (podLoop.counted).
func (p *DevicePlugin) Counted() bool { return p.Running() && p.loop.counted() }

// counted reports whether the DaemonSet controller counts the DaemonSet's
// pod (currentNumberScheduled, latest generation): its informer saw the
// pod. A pod it first sees already being deleted is no creation of its
// own (addPod, kubernetes pkg/controller/daemon/daemon_controller.go): it
// waits out its expectations for minutes before it makes another. So a
// test waits for it before a change restarts the plugin (seen under load:
// pod restarted 0.3 s after it was made, current 0 for the next 90 s).
func (l *podLoop) counted() bool {
	ds, err := l.client.AppsV1().DaemonSets(l.ns).Get(context.Background(), l.ds, metav1.GetOptions{})
	if err != nil {
		return false
	}
	s := ds.Status
	return s.ObservedGeneration >= ds.Generation && s.DesiredNumberScheduled >= 1 && s.CurrentNumberScheduled == s.DesiredNumberScheduled
}

func shortName(node string) string {
	if len(node) > 40 {
		return node[len(node)-40:]
	}
	return node
}

// once lists and watches the DaemonSet's pods (bound or not) and acts on
// each event; it returns when the watch ends.
func (p *podLoop) once(ctx context.Context) error {
	return watchPods(ctx, p.client, p.ns, metav1.ListOptions{LabelSelector: nodeLabel + "=" + p.node},
		func(pod *corev1.Pod, deleted bool) { p.handle(ctx, pod, deleted) })
}

func (p *podLoop) handle(ctx context.Context, pod *corev1.Pod, deleted bool) {
	switch {
	case deleted || pod.DeletionTimestamp != nil:
		p.stop(ctx, pod)
		if !deleted {
			// The kubelet ends the container and removes the pod.
			err := p.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
				GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID},
			})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
				p.t.Logf("kubelet %s: finishing pod %s: %v", p.node, pod.Name, err)
			}
		}
	case pod.Spec.NodeName == "":
		if !p.bind(ctx, pod) {
			p.retryBind(ctx, pod)
		}
	case pod.Spec.NodeName == p.node && pod.Status.Phase == corev1.PodPending:
		p.start(ctx, pod)
	}
}

// bind plays kube-scheduler for a DaemonSet pod aimed at this node. It
// says false when the pod could not be placed for now (an untolerated
// taint, or the node unreadable).
func (p *podLoop) bind(ctx context.Context, pod *corev1.Pod) bool {
	if !affinityNames(pod, p.node) {
		return true // not this node's: nothing to place
	}
	n, err := p.client.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, taint := range n.Spec.Taints {
		if taint.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		if !tolerates(pod.Spec.Tolerations, &taint) {
			return false // unschedulable for now; kube-scheduler retries when the node changes
		}
	}
	err = p.client.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: p.node},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsConflict(err) && ctx.Err() == nil {
		p.t.Logf("scheduler %s: binding pod %s: %v", p.node, pod.Name, err)
	}
	return true
}

// retryBind tries a pod bind could not place again as the node changes
// (read every 200 ms), until it is bound, gone, or the loop ends.
func (p *podLoop) retryBind(ctx context.Context, pod *corev1.Pod) {
	p.mu.Lock()
	if p.waiting == nil {
		p.waiting = map[types.UID]bool{}
	}
	if p.waiting[pod.UID] {
		p.mu.Unlock()
		return
	}
	p.waiting[pod.UID] = true
	p.mu.Unlock()
	go func() {
		defer func() {
			p.mu.Lock()
			delete(p.waiting, pod.UID)
			p.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			cur, err := p.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || err == nil && (cur.UID != pod.UID || cur.Spec.NodeName != "" || cur.DeletionTimestamp != nil) {
				return
			}
			if err == nil && p.bind(ctx, cur) {
				return
			}
		}
	}()
}

func tolerates(tols []corev1.Toleration, taint *corev1.Taint) bool {
	for i := range tols {
		// As kube-scheduler's TaintToleration plugin, without the
		// comparison operators of the (alpha) feature gate.
		if tols[i].ToleratesTaint(klog.Background(), taint, false) {
			return true
		}
	}
	return false
}

// affinityNames: the pod's required node affinity picks node by name, as the
// DaemonSet controller writes it (ReplaceDaemonSetPodNodeNameNodeAffinity).
func affinityNames(pod *corev1.Pod, node string) bool {
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return false
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn {
				for _, v := range f.Values {
					if v == node {
						return true
					}
				}
			}
		}
	}
	return false
}

// start runs the plugin of pod: its container
// starts (the pod Running and Ready: the plugin has no readiness probe in
// the GPU Operator's DaemonSet or the plugin's Helm chart), it enumerates
// and registers with the kubelet, whose device manager then holds its
// devices (startPlugins → Register in k8s-device-plugin; ListAndWatch),
// written into the Node's status after.
func (p *DevicePlugin) start(ctx context.Context, pod *corev1.Pod) {
	gpus, err := p.read()
	if err != nil {
		p.t.Logf("device plugin %s: enumerating the GPUs: %v", p.node, err)
		return
	}
	markRunning(ctx, p.t, p.client, pod)
	p.register(ctx, pod, advertise(p.strategy, gpus))
}

// markRunning sets a daemon pod Running and Ready, as the kubelet does once
// its container started.
func markRunning(ctx context.Context, t TB, client kubernetes.Interface, pod *corev1.Pod) {
	now := metav1.Now()
	pod = pod.DeepCopy()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.StartTime = &now
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	if _, err := client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
		t.Logf("kubelet %s: pod %s status: %v", pod.Spec.NodeName, pod.Name, err)
	}
}

// register is the plugin's registration with the kubelet: the device
// manager holds adv for pod's plugin.
func (p *DevicePlugin) register(ctx context.Context, pod *corev1.Pod, adv map[string]int64) {
	p.mu.Lock()
	p.running = string(pod.UID)
	p.starts++
	for r, n := range adv {
		// ListAndWatch replaces the resource's device list.
		p.capacity[r], p.healthy[r] = n, n
	}
	status := p.statusLocked()
	p.mu.Unlock()
	p.writeStatus(ctx, status)
}

// stop ends the plugin of pod, if it is the one running: every device of
// its resources becomes unhealthy (capacity kept, allocatable 0).
func (p *DevicePlugin) stop(ctx context.Context, pod *corev1.Pod) {
	p.mu.Lock()
	if p.running != string(pod.UID) {
		p.mu.Unlock()
		return
	}
	p.running = ""
	for r := range p.healthy {
		p.healthy[r] = 0
	}
	status := p.statusLocked()
	p.mu.Unlock()
	p.writeStatus(ctx, status)
}

// statusLocked: resource → {capacity, allocatable}.
func (p *DevicePlugin) statusLocked() map[string][2]int64 {
	out := map[string][2]int64{}
	for r, n := range p.capacity {
		out[r] = [2]int64{n, p.healthy[r]}
	}
	return out
}

// writeStatus is the kubelet's write of the device manager's view, at once
// (the real kubelet's every-10-s sync is played by the real node:
// e2e/realnode_test.go).
func (p *DevicePlugin) writeStatus(ctx context.Context, res map[string][2]int64) {
	p.putStatus(ctx, res)
}

func (p *DevicePlugin) putStatus(ctx context.Context, res map[string][2]int64) {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := p.client.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Status.Capacity == nil {
			n.Status.Capacity = corev1.ResourceList{}
		}
		if n.Status.Allocatable == nil {
			n.Status.Allocatable = corev1.ResourceList{}
		}
		for r, v := range res {
			n.Status.Capacity[corev1.ResourceName(r)] = *resource.NewQuantity(v[0], resource.DecimalSI)
			n.Status.Allocatable[corev1.ResourceName(r)] = *resource.NewQuantity(v[1], resource.DecimalSI)
		}
		_, err = p.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil && ctx.Err() == nil {
		p.t.Errorf("device plugin %s: node status: %v", p.node, err)
	}
}

// advertise is what NVIDIA's device plugin serves for gpus under strategy
// (k8s-device-plugin internal/rm: none → nvidia.com/gpu per GPU; single →
// nvidia.com/gpu per MIG device (all of one profile) and per GPU with MIG
// off; mixed → nvidia.com/mig-<profile> per MIG device, "+" written as ".",
// and nvidia.com/gpu per GPU with MIG off). Resources with no device are
// not served.
func advertise(strategy string, gpus []PluginGPU) map[string]int64 {
	out := map[string]int64{}
	for _, g := range gpus {
		if strategy == "" || strategy == "none" || !g.MigEnabled {
			out["nvidia.com/gpu"]++
			continue
		}
		for _, d := range g.MIGDevices {
			if strategy == "single" {
				out["nvidia.com/gpu"]++
				continue
			}
			out["nvidia.com/mig-"+strings.ReplaceAll(d, "+", ".")]++
		}
	}
	return out
}

// String describes what the plugin advertises now, for test logs.
func (p *DevicePlugin) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var parts []string
	for r, n := range p.healthy {
		parts = append(parts, fmt.Sprintf("%s=%d/%d", r, n, p.capacity[r]))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}
