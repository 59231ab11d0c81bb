package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/internal/labelwriter"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// plannerConfigs are the configs of the planner's tests (H200s).
const plannerConfigs = `version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.18gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        1g.18gb: 7
  all-3g.71gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        3g.71gb: 2
`

// gfdLabels are GPU Feature Discovery's labels of a node of n H200s.
func gfdLabels(n int, more map[string]string) map[string]string {
	l := map[string]string{"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": fmt.Sprint(n)}
	for k, v := range more {
		l[k] = v
	}
	return l
}

// migPod is a pod of the test scheduler asking for one MIG device of profile.
func migPod(t testing.TB, c kubernetes.Interface, ns, name, profile, node string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{SchedulerName: kubetest.SchedulerName, NodeName: node, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: kubetest.PodContainer, Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					corev1.ResourceName("nvidia.com/mig-" + profile): resource.MustParse("1")}}}}}}
	out, err := c.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
	return out
}

func podEvents(t testing.TB, c kubernetes.Interface, pod *corev1.Pod, reason string) []corev1.Event {
	t.Helper()
	sel := fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod.Name, "reason": reason}
	list, err := c.CoreV1().Events(pod.Namespace).List(context.Background(), metav1.ListOptions{FieldSelector: sel.String()})
	if err != nil {
		t.Fatalf("list events: %v", err)
	}
	return list.Items
}

func nodeHistory(t testing.TB, c kubernetes.Interface, node string) []record.ChangeRecord {
	t.Helper()
	return History(t, GetNode(t, c, node))
}

// The planner, the real kube-scheduler, the device plugin stand-in and the
// real agents: two pods asking for nvidia.com/mig-3g.71gb, which no node
// offers, are bound on the one node the planner reshaped, by one change;
// an opted-in node whose only fitting change would evict the pod running
// on it, and a node that did not opt in, are never touched; a pod asking
// for a profile no allowed config offers gets one MigGeometryUnservable
// Event and changes nothing.
func TestPlannerReshapesIdleOptedInNode(t *testing.T) {
	c := kubetest.Client(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(plannerConfigs), 0o600); err != nil {
		t.Fatal(err)
	}
	optIn := map[string]string{"migagent.io/planner": "enabled"}
	// Names sort busy < idle: were it not for the pod on it, the busy node
	// would win the tie.
	busy := kubetest.NewName(t, "a-busy")
	idle := kubetest.NewName(t, "b-idle")
	other := kubetest.NewName(t, "c-other")
	kubetest.CreateNode(t, busy, gfdLabels(1, optIn))
	kubetest.CreateNode(t, idle, gfdLabels(1, optIn))
	kubetest.CreateNode(t, other, gfdLabels(1, nil))
	for _, n := range []string{busy, idle, other} {
		reportCapacity(t, c, n) // pods, CPU and memory: the scheduler's other fits
	}
	ops := kubetest.NewName(t, "gpu-operator")
	kubetest.CreateNamespace(t, ops)
	work := kubetest.NewName(t, "work")
	kubetest.CreateNamespace(t, work)

	// The busy node: all-1g.18gb applied, one device held by a running pod,
	// as its agent's assignment trail says.
	ob := (&Opts{Node: busy, Sim: "h200x1"}).Fill(t)
	ob.Extra = append(ob.Extra, "-f", cfg, "--assignment-interval", "0")
	StartAgent(t, ob)
	SelectConfig(t, c, busy, "all-1g.18gb")
	WaitState(t, c, busy, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	running := migPod(t, c, work, "running", "1g.18gb", busy)
	running.Status.Phase = corev1.PodRunning
	if _, err := c.CoreV1().Pods(work).UpdateStatus(context.Background(), running, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	writeTrail(t, c, ob.Namespace, busy, assign.Entry{Namespace: work, Pod: running.Name, Container: kubetest.PodContainer,
		Resource: "nvidia.com/mig-1g.18gb", Device: assign.Device{UUID: "MIG-held", Profile: "1g.18gb", GPU: 0, Placement: "0+1"},
		Start: time.Now()})

	// The idle node: MIG off, the device plugin advertising the whole GPU.
	oi := (&Opts{Node: idle, Sim: "h200x1", Namespace: ob.Namespace}).Fill(t)
	oi.Extra = append(oi.Extra, "-f", cfg, "--assignment-interval", "0", "--operand-namespace", ops)
	dp := kubetest.StartDevicePlugin(t, c, idle, ops, "mixed", pluginReader(t, oi))
	WaitFor(t, 60*time.Second, "the device plugin pod to run", dp.Counted)
	StartAgent(t, oi)
	kubetest.StartScheduler(t)

	big1 := migPod(t, c, work, "big-1", "3g.71gb", "")
	big2 := migPod(t, c, work, "big-2", "3g.71gb", "")
	huge := migPod(t, c, work, "huge", "7g.141gb", "")
	for _, p := range []*corev1.Pod{big1, big2, huge} {
		waitUnschedulable(t, c, p, 0)
	}

	port := freePort(t)
	start := time.Now()
	planner := startProcess(t, []string{"planner", "--kubeconfig", ob.Kubeconfig, "--namespace", ob.Namespace, "-f", cfg,
		"--allowed-configs", "all-1g.18gb,all-3g.71gb", "--planner-interval", "500ms", "--max-concurrent", "1",
		"--lease-duration", "15s", "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port)},
		fmt.Sprintf("http://127.0.0.1:%d", port))

	for _, p := range []*corev1.Pod{big1, big2} {
		WaitFor(t, 90*time.Second, "pod "+p.Name+" bound", func() bool {
			got, err := c.CoreV1().Pods(work).Get(context.Background(), p.Name, metav1.GetOptions{})
			return err == nil && got.Spec.NodeName != ""
		})
		got, _ := c.CoreV1().Pods(work).Get(context.Background(), p.Name, metav1.GetOptions{})
		if got.Spec.NodeName != idle {
			t.Errorf("pod %s bound on %s, want %s", p.Name, got.Spec.NodeName, idle)
		}
		if ev := podEvents(t, c, p, "MigGeometryPlanned"); len(ev) != 1 || !strings.Contains(ev[0].Message, idle) {
			t.Errorf("pod %s: MigGeometryPlanned Events %v", p.Name, ev)
		}
	}
	t.Logf("two 3g.71gb pods bound %s after the planner started", time.Since(start).Round(100*time.Millisecond))

	// One change on the idle node, asked for by the planner: the label
	// alone, written under the planner's field manager, as the API server
	// recorded it.
	n := GetNode(t, c, idle)
	if m, _, _ := labelwriter.Of(n.ManagedFields, record.LabelConfig); n.Labels[record.LabelConfig] != "all-3g.71gb" || m != record.PlannerFieldManager {
		t.Errorf("idle node: label %q written by %q", n.Labels[record.LabelConfig], m)
	}
	for k := range n.Annotations {
		if strings.Contains(k, "planner") {
			t.Errorf("idle node: the planner left the annotation %s", k)
		}
	}
	if h := nodeHistory(t, c, idle); len(h) != 1 || h[0].Result != record.StateSuccess {
		t.Errorf("idle node's history: %+v, want one successful change", h)
	} else {
		t.Logf("the agent's record: requestedBy %q via %q (%s)", h[0].RequestedBy, h[0].RequestedVia, h[0].RequestedBySource)
		if !strings.Contains(h[0].RequestedBy+h[0].RequestedVia, "planner") {
			t.Errorf("the record does not name the planner: requestedBy %q via %q", h[0].RequestedBy, h[0].RequestedVia)
		}
	}

	// A few more rounds: nothing else changes, the unservable pod has its
	// one Event.
	time.Sleep(3 * time.Second)
	if ev := podEvents(t, c, huge, "MigGeometryUnservable"); len(ev) != 1 || !strings.Contains(ev[0].Message, "no allowed config offers") {
		t.Errorf("pod huge: MigGeometryUnservable Events %v, want one", ev)
	}
	if h := nodeHistory(t, c, idle); len(h) != 1 {
		t.Errorf("idle node changed %d times, want once", len(h))
	}
	nb := GetNode(t, c, busy)
	if m, _, _ := labelwriter.Of(nb.ManagedFields, record.LabelConfig); nb.Labels[record.LabelConfig] != "all-1g.18gb" || m == record.PlannerFieldManager || len(nodeHistory(t, c, busy)) != 1 {
		t.Errorf("the busy node was touched: label %q, annotations %v", nb.Labels[record.LabelConfig], nb.Annotations)
	}
	if no := GetNode(t, c, other); no.Labels[record.LabelConfig] != "" {
		t.Errorf("the node that did not opt in was touched: %v %v", no.Labels, no.Annotations)
	}
	if _, err := c.CoreV1().Pods(work).Get(context.Background(), running.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the running pod: %v", err)
	}
	m := planner.Scrape(t)
	for _, want := range []string{`migagent_planner_decisions_total{result="changed"} 1`, `migagent_planner_decisions_total{result="unservable"} 1`,
		"migagent_planner_unservable_pods 1", "migagent_planner_leader 1", "migagent_planner_pending_to_planned_seconds_count 2"} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("planner metrics lack %s", want)
		}
	}
}

// writeTrail writes node's assignment trail as its agent publishes it.
func writeTrail(t testing.TB, c kubernetes.Interface, ns, node string, entries ...assign.Entry) {
	t.Helper()
	data, err := json.Marshal(assign.History{Node: node, Entries: entries})
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: assign.ConfigMapName(node)},
		Data: map[string]string{assign.HistoryKey: string(data)}}
	if _, err := c.CoreV1().ConfigMaps(ns).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A change the planner asked for that would now evict (a pod landed on the
// GPU since it decided) is refused by the agent: failed, with the reason,
// and the pod stays, through the retries. The agent knows the planner's
// change by the field manager of the write that set the label; once a
// person removes the label and sets it again, the change is theirs and the
// agent evicts as it would for any person's change.
func TestAgentRefusesPlannerChangeThatWouldEvict(t *testing.T) {
	c := kubetest.Client(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(plannerConfigs), 0o600); err != nil {
		t.Fatal(err)
	}
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, gfdLabels(1, map[string]string{"migagent.io/planner": "enabled"}))
	work := kubetest.NewName(t, "work")
	kubetest.CreateNamespace(t, work)
	o := (&Opts{Node: node, Sim: "h200x1"}).Fill(t)
	o.Extra = append(o.Extra, "-f", cfg, "--assignment-interval", "0", "--retry-backoff-max", "2s")
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	landed := migPod(t, c, work, "landed", "1g.18gb", node)
	landed.Status.Phase = corev1.PodRunning
	if _, err := c.CoreV1().Pods(work).UpdateStatus(context.Background(), landed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// What the planner writes: the label alone, under its field manager.
	setLabel := func(value, manager string) {
		t.Helper()
		patch := `{"metadata":{"labels":{"nvidia.com/mig.config":` + value + `}}}`
		if _, err := c.CoreV1().Nodes().Patch(context.Background(), node, "application/merge-patch+json", []byte(patch),
			metav1.PatchOptions{FieldManager: manager}); err != nil {
			t.Fatal(err)
		}
	}
	setLabel(`"all-3g.71gb"`, record.PlannerFieldManager)
	rec := WaitState(t, c, node, record.StateFailed, "all-3g.71gb", 60*time.Second)
	if !strings.Contains(rec.Reason, "the planner asked for this change and it would evict running pods: refused") ||
		!strings.Contains(rec.Reason, work+"/landed") {
		t.Errorf("reason = %q", rec.Reason)
	}
	if len(rec.EvictedPods) != 0 {
		t.Errorf("evicted %v", rec.EvictedPods)
	}
	time.Sleep(3 * time.Second) // retries: still refused
	if p, err := c.CoreV1().Pods(work).Get(context.Background(), landed.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("the pod that landed: %v, %v", p, err)
	}
	if s := GetNode(t, c, node).Labels[record.LabelState]; s != record.StateFailed {
		t.Errorf("state %q after retries, want failed", s)
	}

	// A person takes the change over: the label removed and set again,
	// under their own field manager. The agent evicts the pod for it.
	setLabel("null", "kubectl-label")
	setLabel(`"all-3g.71gb"`, "kubectl-label")
	rec = WaitState(t, c, node, record.StateSuccess, "all-3g.71gb", 60*time.Second)
	if len(rec.EvictedPods) != 1 || rec.EvictedPods[0] != work+"/landed" || rec.RequestedBy != "kubectl-label" {
		t.Errorf("the person's change: evicted %v, requestedBy %q", rec.EvictedPods, rec.RequestedBy)
	}
}

// On the DRA path: a pod whose ResourceClaim (made from its template by
// the real resourceclaim-controller) asks, under the driver's
// mig.nvidia.com DeviceClass, for a 3g.71gb device that the node does not
// announce is bound on the opted-in node the planner reshaped: the real
// kube-scheduler allocates the claim once the DRA plugin stand-in,
// restarted by the agent, announces the new devices.
func TestPlannerServesDRAClaim(t *testing.T) {
	c := kubetest.Client(t)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(plannerConfigs), 0o600); err != nil {
		t.Fatal(err)
	}
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, gfdLabels(1, map[string]string{"migagent.io/planner": "enabled"}))
	drv, work := kubetest.NewName(t, "dra"), kubetest.NewName(t, "ml")
	kubetest.CreateNamespace(t, drv)
	kubetest.CreateNamespace(t, work)
	kl := kubetest.StartKubelet(t, c, node)
	o := (&Opts{Node: node, Sim: "h200x1", Extra: []string{"-f", cfg, "--pod-resources-socket", kl.Socket(),
		"--resource-wait-timeout", "60s", "--assignment-interval", "0", "--operand-namespace", drv}}).Fill(t)
	dp := kubetest.StartDRAPlugin(t, c, node, drv, func() ([]kubetest.NVIDIADevice, error) { return draDevices(t, o), nil })
	WaitFor(t, 60*time.Second, "the DRA plugin to run, counted by its DaemonSet", dp.Counted)
	reportCapacity(t, c, node)
	ensureMIGDeviceClass(t, c)
	kubetest.StartControllers(t, "resourceclaim-controller")
	kubetest.StartScheduler(t)

	// The node in all-1g.18gb, by its agent: its record gives the planner
	// the geometry.
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 90*time.Second)

	big := profileClaimPod(t, c, work, "big", "3g.71gb")
	waitUnschedulable(t, c, big, 2*time.Second)
	port := freePort(t)
	start := time.Now()
	startProcess(t, []string{"planner", "--kubeconfig", o.Kubeconfig, "--namespace", o.Namespace, "-f", cfg,
		"--allowed-configs", "all-1g.18gb,all-3g.71gb", "--planner-interval", "500ms", "--lease-duration", "15s",
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", port)}, fmt.Sprintf("http://127.0.0.1:%d", port))
	dev := waitBound(t, c, big, node, 120*time.Second)
	if !strings.Contains(dev, "3g71gb") {
		t.Errorf("claim allocated device %s; want a 3g.71gb device", dev)
	}
	t.Logf("the 3g.71gb claim allocated %s, pod bound %s after the planner started", dev, time.Since(start).Round(100*time.Millisecond))
	if ev := podEvents(t, c, big, "MigGeometryPlanned"); len(ev) != 1 || !strings.Contains(ev[0].Message, "config all-3g.71gb") {
		t.Errorf("MigGeometryPlanned Events %v", ev)
	}
	// The agent reports success once the plugin's slices announce exactly
	// the new devices (the scheduler may allocate before).
	rec := WaitState(t, c, node, record.StateSuccess, "all-3g.71gb", 60*time.Second)
	if rec.RequestedBy != record.PlannerFieldManager || rec.ServedBy != record.ServedByDRA || len(rec.EvictedPods) != 0 {
		t.Errorf("record requestedBy %q servedBy %q evicted %v; want the planner's change, served by DRA, no eviction",
			rec.RequestedBy, rec.ServedBy, rec.EvictedPods)
	}
	if h := nodeHistory(t, c, node); len(h) != 2 {
		t.Errorf("%d records, want 2 (the person's all-1g.18gb, the planner's all-3g.71gb)", len(h))
	}
}
