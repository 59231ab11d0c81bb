package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// The planner among tenants: each test makes its own opted-in nodes,
// tainted with its own key so that no other test's pending pod counts for
// them, and pending pods that tolerate it, marked Unschedulable by the
// test (as the scheduler would).

// ptEnv is one such test's cluster corner.
type ptEnv struct {
	c       kubernetes.Interface
	key     string // the taint key of the test's nodes
	work    string // the pods' namespace
	agents  string // the agents' namespace (trails, the planner's Lease)
	cfg     string // the MIG config file
	optIn   map[string]string
	kubecfg string
}

func ptSetup(t *testing.T) *ptEnv {
	c := kubetest.Client(t)
	e := &ptEnv{c: c, key: "e2e/" + kubetest.NewName(t, "t"), work: kubetest.NewName(t, "work"), agents: kubetest.NewName(t, "agents"),
		optIn: map[string]string{"migagent.io/planner": "enabled"}, kubecfg: kubetest.Kubeconfig()}
	kubetest.CreateNamespace(t, e.work)
	kubetest.CreateNamespace(t, e.agents)
	e.cfg = filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(e.cfg, []byte(plannerConfigs), 0o600); err != nil {
		t.Fatal(err)
	}
	return e
}

// node makes an opted-in node of one H200 with GFD's labels (MIG off),
// tainted with the test's key.
func (e *ptEnv) node(t *testing.T, name string, more map[string]string) string {
	n := kubetest.NewName(t, name)
	kubetest.CreateNode(t, n, gfdLabels(1, mapsJoin(e.optIn, more)))
	e.taint(t, n, corev1.Taint{Key: e.key, Value: "x", Effect: corev1.TaintEffectNoSchedule})
	return n
}

func mapsJoin(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range []map[string]string{a, b} {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func (e *ptEnv) taint(t *testing.T, node string, taints ...corev1.Taint) {
	t.Helper()
	n := GetNode(t, e.c, node)
	n.Spec.Taints = append(n.Spec.Taints, taints...)
	if _, err := e.c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// pending creates a pod that tolerates the test's taint, asks for limits,
// and is marked Unschedulable, as kube-scheduler marks a pod it found no
// node for (no scheduler serves its schedulerName).
func (e *ptEnv) pending(t *testing.T, name string, spec corev1.PodSpec) *corev1.Pod {
	t.Helper()
	spec.SchedulerName = "no-such-scheduler"
	spec.TerminationGracePeriodSeconds = new(int64)
	spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Key: e.key, Operator: corev1.TolerationOpExists})
	ctx := context.Background()
	p, err := e.c.CoreV1().Pods(e.work).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.work, Name: name}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.CoreV1().Pods(e.work).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: "0/3 nodes are available", LastTransitionTime: metav1.Now()}}
	if p, err = e.c.CoreV1().Pods(e.work).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// migContainer asks for n devices of profile ("9223372036854775807" is allowed).
func migContainer(name, profile, n string) corev1.Container {
	return corev1.Container{Name: name, Image: "registry.k8s.io/pause:3.10", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{corev1.ResourceName("nvidia.com/mig-" + profile): resource.MustParse(n)}}}
}

// startPlanner runs `mig-agent planner` (every 300 ms) until the test ends.
func (e *ptEnv) startPlanner(t *testing.T, extra ...string) *Agent {
	port := freePort(t)
	args := append([]string{"planner", "--kubeconfig", e.kubecfg, "--namespace", e.agents, "-f", e.cfg,
		"--allowed-configs", "all-disabled,all-1g.18gb,all-3g.71gb", "--planner-interval", "300ms", "--max-concurrent", "1",
		"--lease-duration", "15s", "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port)}, extra...)
	return startProcess(t, args, fmt.Sprintf("http://127.0.0.1:%d", port))
}

func (e *ptEnv) label(t *testing.T, node string) string {
	return GetNode(t, e.c, node).Labels[record.LabelConfig]
}

// waitEvent waits for a MigGeometryUnservable Event on pod whose message
// holds want.
func (e *ptEnv) waitEvent(t *testing.T, p *corev1.Pod, reason, want string) {
	t.Helper()
	WaitFor(t, 20*time.Second, "a "+reason+" Event on "+p.Name+" saying "+want, func() bool {
		return slices.ContainsFunc(podEvents(t, e.c, p, reason), func(ev corev1.Event) bool { return strings.Contains(ev.Message, want) })
	})
}

// One tenant's pod asks for 2^63-1 devices in each of two containers: the
// sum is bounded, not wrapped to a negative want that "is served" and
// adds supply. It is unservable, and said so; a younger pod of the same
// profile gets the idle node reshaped. (On b20dfeb the negative want
// starved the profile: no node was ever reshaped for the younger pod.)
func TestPlannerWantsCannotOverflow(t *testing.T) {
	e := ptSetup(t)
	idle := e.node(t, "idle", nil)
	huge := fmt.Sprint(int64(math.MaxInt64))
	greedy := e.pending(t, "greedy", corev1.PodSpec{Containers: []corev1.Container{
		migContainer("a", "3g.71gb", huge), migContainer("b", "3g.71gb", huge)}})
	time.Sleep(1100 * time.Millisecond) // the younger pod is younger
	young := e.pending(t, "young", corev1.PodSpec{Containers: []corev1.Container{migContainer("a", "3g.71gb", "1")}})
	e.startPlanner(t)
	WaitFor(t, 20*time.Second, "the idle node reshaped for the younger pod", func() bool { return e.label(t, idle) != "" })
	e.waitEvent(t, young, "MigGeometryPlanned", idle)
	e.waitEvent(t, greedy, "MigGeometryUnservable", "more devices of a profile than any allowed config offers")
}

// A free device serves one pending pod, once: three pods pending beside
// one free 1g.18gb device (which they cannot use: the test keeps them
// Unschedulable) get the idle opted-in node reshaped. (On b20dfeb the one
// free device "served" all three, for ever, and the idle node was never
// reshaped.)
func TestPlannerFreeDeviceServesOnce(t *testing.T) {
	e := ptSetup(t)
	busy := e.node(t, "busy", nil)
	ob := (&Opts{Node: busy, Sim: "h200x1", Namespace: e.agents, Extra: []string{"-f", e.cfg, "--assignment-interval", "0"}}).Fill(t)
	a := StartAgent(t, ob)
	SelectConfig(t, e.c, busy, "all-1g.18gb")
	WaitState(t, e.c, busy, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	a.Stop()
	var held []assign.Entry
	for s := range 6 { // six of the seven devices held, as the node's trail says
		held = append(held, assign.Entry{Namespace: e.work, Pod: fmt.Sprintf("run-%d", s), Container: "c", Resource: "nvidia.com/mig-1g.18gb",
			Device: assign.Device{UUID: fmt.Sprintf("MIG-%d", s), Profile: "1g.18gb", GPU: 0, Placement: fmt.Sprintf("%d+1", s)}, Start: time.Now()})
	}
	writeTrail(t, e.c, e.agents, busy, held...)
	idle := e.node(t, "idle", nil)
	for i := range 3 {
		e.pending(t, fmt.Sprintf("p%d", i), corev1.PodSpec{Containers: []corev1.Container{migContainer("a", "1g.18gb", "1")}})
	}
	e.startPlanner(t)
	WaitFor(t, 20*time.Second, "the idle node reshaped", func() bool { return e.label(t, idle) == "all-1g.18gb" })
	if got := e.label(t, busy); got != "all-1g.18gb" {
		t.Errorf("the busy node's label %q", got)
	}
}

// A pending pod counts only for nodes it could be scheduled on: a node
// selector no opted-in node matches, or a taint of the node it does not
// tolerate, reshapes nothing, and the pod is told why. (On b20dfeb the
// idle node was reshaped at once for such a pod and held against others.)
func TestPlannerDemandThatCanLand(t *testing.T) {
	e := ptSetup(t)
	idle := e.node(t, "idle", map[string]string{"pool": "a"})
	e.taint(t, idle, corev1.Taint{Key: "team", Value: "b", Effect: corev1.TaintEffectNoSchedule})
	elsewhere := e.pending(t, "elsewhere", corev1.PodSpec{NodeSelector: map[string]string{"pool": "nowhere"},
		Tolerations: []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpExists}},
		Containers:  []corev1.Container{migContainer("a", "3g.71gb", "1")}})
	untolerated := e.pending(t, "untolerated", corev1.PodSpec{Containers: []corev1.Container{migContainer("a", "3g.71gb", "1")}})
	e.startPlanner(t)
	e.waitEvent(t, elsewhere, "MigGeometryUnservable", "cannot be scheduled on any opted-in node")
	e.waitEvent(t, untolerated, "MigGeometryUnservable", "does not tolerate the taint team=b:NoSchedule")
	if got := e.label(t, idle); got != "" {
		t.Fatalf("the idle node was reshaped to %q for pods that cannot land on it", got)
	}
	// A pod that may land there gets it reshaped.
	fits := e.pending(t, "fits", corev1.PodSpec{NodeSelector: map[string]string{"pool": "a"},
		Tolerations: []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpEqual, Value: "b", Effect: corev1.TaintEffectNoSchedule}},
		Containers:  []corev1.Container{migContainer("a", "3g.71gb", "1")}})
	WaitFor(t, 20*time.Second, "the idle node reshaped for the pod that fits", func() bool { return e.label(t, idle) != "" })
	e.waitEvent(t, fits, "MigGeometryPlanned", idle)
}

// Only GPU resources count: a running pod on the idle node that asks for
// NVIDIA's NIC (nvidia.com/hostdev) holds no GPU and does not block its
// reshaping. (On b20dfeb it was taken for a GPU user the trail does not
// name, and blocked every change of the node.)
func TestPlannerNICPodIsNoGPUUser(t *testing.T) {
	e := ptSetup(t)
	idle := e.node(t, "idle", nil)
	kl := kubetest.StartKubelet(t, e.c, idle)
	kl.CreatePod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.work, Name: "nic"},
		Spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: e.key, Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{Name: kubetest.PodContainer, Image: "x", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{"nvidia.com/hostdev": resource.MustParse("1")}}}}}})
	p := e.pending(t, "wants", corev1.PodSpec{Containers: []corev1.Container{migContainer("a", "3g.71gb", "1")}})
	e.startPlanner(t)
	WaitFor(t, 20*time.Second, "the idle node reshaped beside the NIC pod", func() bool { return e.label(t, idle) != "" })
	e.waitEvent(t, p, "MigGeometryPlanned", idle)
}

// A tenant cannot flap a node's geometry: deleting the pod the planner
// reshaped a node for, and asking for another profile, changes nothing
// within the hold time, idle node or not. (On b20dfeb the hold time did
// not apply to an idle node: 45 changes in 61 s.)
func TestPlannerChurnIsBounded(t *testing.T) {
	e := ptSetup(t)
	n := e.node(t, "node", nil)
	o := (&Opts{Node: n, Sim: "h200x1", Namespace: e.agents, Extra: []string{"-f", e.cfg, "--assignment-interval", "0"}}).Fill(t)
	StartAgent(t, o)
	first := e.pending(t, "first", corev1.PodSpec{Containers: []corev1.Container{migContainer("a", "3g.71gb", "1")}})
	e.startPlanner(t)
	WaitFor(t, 20*time.Second, "the node reshaped for the first pod", func() bool { return e.label(t, n) == "all-3g.71gb" })
	WaitState(t, e.c, n, record.StateSuccess, "all-3g.71gb", 60*time.Second)
	if err := e.c.CoreV1().Pods(e.work).Delete(context.Background(), first.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.pending(t, "second", corev1.PodSpec{Containers: []corev1.Container{migContainer("a", "1g.18gb", "1")}})
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if got := e.label(t, n); got != "all-3g.71gb" {
			t.Fatalf("the idle node was changed again to %q within the hold time", got)
		}
	}
}

// A node whose agent never acts on the planner's label stops counting
// against --max-concurrent after --node-act-timeout, and gets an Event:
// another node is planned for. (On b20dfeb one silent node held the only
// slot for ever.)
func TestPlannerSilentNodeFreesSlot(t *testing.T) {
	e := ptSetup(t)
	silent := e.node(t, "silent", map[string]string{"pool": "s"})
	other := e.node(t, "other", map[string]string{"pool": "o"})
	e.pending(t, "a", corev1.PodSpec{NodeSelector: map[string]string{"pool": "s"}, Containers: []corev1.Container{migContainer("a", "3g.71gb", "1")}})
	time.Sleep(1100 * time.Millisecond)
	e.pending(t, "b", corev1.PodSpec{NodeSelector: map[string]string{"pool": "o"}, Containers: []corev1.Container{migContainer("a", "3g.71gb", "1")}})
	e.startPlanner(t, "--node-act-timeout", "2s")
	WaitFor(t, 20*time.Second, "the silent node labelled", func() bool { return e.label(t, silent) != "" })
	WaitFor(t, 20*time.Second, "the other node labelled once the silent one stops counting", func() bool { return e.label(t, other) != "" })
	WaitFor(t, 10*time.Second, "a MigPlannerNodeSilent Event on the silent node", func() bool {
		return len(nodeEvents(t, e.c, silent, "MigPlannerNodeSilent")) == 1
	})
}
