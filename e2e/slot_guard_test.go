package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/lease"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// Findings 1 and 2 with the real binary: with --max-concurrent 1 and a
// 3s lease, agent A takes the slot, taints its node and evicts a pod that
// takes its time; A is then paused (SIGSTOP) for well past its lease while
// B is labelled. B does not take the slot: A's node is still mid-change
// (tainted). Resumed, A confirms its slot before its GPU step and
// finishes; then B. Over both nodes' records, at most one node was ever
// disrupted (record.MaxDisrupted).
func TestSlotHolderPausedMidChange(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	ns, podNS, start := slotPair(t)
	nodeA, nodeB := kubetest.NewName(t, "a"), kubetest.NewName(t, "b")
	a, _ := start(nodeA, true)
	start(nodeB, false)

	SelectConfig(t, c, nodeA, "all-1g.18gb")
	waitEvicting(t, podNS, nodeA)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = a.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	SelectConfig(t, c, nodeB, "all-1g.18gb")
	time.Sleep(9 * time.Second) // three lease durations
	if n := GetNode(t, c, nodeB); hasTaint(n.Spec.Taints) || n.Labels[record.LabelState] == record.StateSuccess {
		t.Fatalf("B was disrupted while A, paused, was mid-change: state %q, taints %v", n.Labels[record.LabelState], n.Spec.Taints)
	}
	l, err := c.CoordinationV1().Leases(ns).Get(ctx, lease.SlotLeaseName(0), metav1.GetOptions{})
	if err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != nodeA {
		t.Fatalf("slot %v (%v), want still A's", l, err)
	}
	_ = c.CoreV1().Pods(podNS).Delete(ctx, "train-"+nodeA, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	WaitState(t, c, nodeA, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	WaitState(t, c, nodeB, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	var recs []record.ChangeRecord
	for _, n := range []string{nodeA, nodeB} {
		recs = append(recs, History(t, GetNode(t, c, n))...)
	}
	if most := record.MaxDisrupted(recs); most != 1 {
		t.Fatalf("%d nodes disrupted at once with --max-concurrent 1: %+v", most, recs)
	}
}

func hasTaint(ts []corev1.Taint) bool {
	for _, t := range ts {
		if t.Key == record.TaintReconfiguring {
			return true
		}
	}
	return false
}

// slotPair makes the agents' namespace and a pods' namespace, and returns
// start: a node with a kubelet stand-in and an agent on it (--max-concurrent
// 1, a 3s lease), with a GPU pod that stays Terminating until the test
// deletes it (pod), ready.
func slotPair(t *testing.T) (ns, podNS string, start func(node string, pod bool) (*Agent, *Opts)) {
	c := kubetest.Client(t)
	ns = kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	podNS = kubetest.NewName(t, "pods")
	kubetest.CreateNamespace(t, podNS)
	start = func(node string, pod bool) (*Agent, *Opts) {
		kubetest.CreateNode(t, node, nil)
		kl := kubetest.StartKubelet(t, c, node)
		o := (&Opts{Node: node, Sim: "h200x2", Namespace: ns}).Fill(t)
		if pod {
			gpus := disProfiles(t, o.Sim, o.SimState)
			p := kl.RunPod(t, podNS, "train-"+node, map[string]string{"nvidia.com/gpu": "1"},
				map[string][]string{"nvidia.com/gpu": {gpus[0].UUID}}, disOwner("train"))
			kl.KeepTerminating(p)
		}
		o.Extra = []string{"--pod-resources-socket", kl.Socket(), "--max-concurrent", "1",
			"--lease-duration", "3s", "--eviction-retry-delay", "200ms"}
		a := StartAgent(t, o)
		WaitFor(t, 20*time.Second, "agent ready on "+node, func() bool { return ccReady(a) })
		return a, o
	}

	return ns, podNS, start
}

// waitEvicting waits until the agent of node, started by slotPair with its
// pod, is evicting that pod (which takes its time: the change is mid-drain).
func waitEvicting(t *testing.T, podNS, node string) {
	t.Helper()
	c := kubetest.Client(t)
	WaitFor(t, 30*time.Second, "the agent of "+node+" evicting its pod", func() bool {
		p, err := c.CoreV1().Pods(podNS).Get(context.Background(), "train-"+node, metav1.GetOptions{})
		return err == nil && p.DeletionTimestamp != nil
	})
}

// Finding 1 with the real binary: A, killed (SIGKILL) while evicting,
// stays down for three lease durations; B, labelled meanwhile, does not
// take the slot while A's node is mid-change (tainted, pending). A,
// restarted, takes its own slot back and finishes; then B. At most one node
// was ever disrupted.
func TestSlotHolderKilledMidChange(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	ns, podNS, start := slotPair(t)
	nodeA, nodeB := kubetest.NewName(t, "a"), kubetest.NewName(t, "b")
	a, oa := start(nodeA, true)
	start(nodeB, false)
	SelectConfig(t, c, nodeA, "all-1g.18gb")
	waitEvicting(t, podNS, nodeA)
	a.Kill()
	SelectConfig(t, c, nodeB, "all-1g.18gb")
	time.Sleep(9 * time.Second)
	if n := GetNode(t, c, nodeB); hasTaint(n.Spec.Taints) || n.Labels[record.LabelState] == record.StateSuccess {
		t.Fatalf("B was disrupted while A, killed, was mid-change: state %q, taints %v", n.Labels[record.LabelState], n.Spec.Taints)
	}
	if l, err := c.CoordinationV1().Leases(ns).Get(ctx, lease.SlotLeaseName(0), metav1.GetOptions{}); err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != nodeA {
		t.Fatalf("slot %v (%v), want still A's", l, err)
	}
	_ = c.CoreV1().Pods(podNS).Delete(ctx, "train-"+nodeA, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	StartAgent(t, oa)
	WaitState(t, c, nodeA, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	WaitState(t, c, nodeB, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	var recs []record.ChangeRecord
	for _, n := range []string{nodeA, nodeB} {
		recs = append(recs, History(t, GetNode(t, c, n))...)
	}
	if most := record.MaxDisrupted(recs); most != 1 {
		t.Fatalf("%d nodes disrupted at once with --max-concurrent 1: %+v", most, recs)
	}
}

// A stolen live slot, with the real binary: A takes the slot and waits on
// the eviction of a pod that takes its time (--drain-timeout 5m); a token
// takes A's live slot (another holder written on its Lease, as a stolen
// agent token may). A learns at once (its watch of the slot Lease) and
// stops waiting: within seconds, not at --drain-timeout, its change fails
// naming the lost slot (MigRolloutSlotLost), its taint lifted, its GPUs as
// they were. (On b20dfeb A kept waiting on its evictions until the pod was
// gone or --drain-timeout: two nodes disrupted on one slot.)
func TestSlotStolenLiveStopsHolder(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	ns, podNS, start := slotPair(t)
	nodeA := kubetest.NewName(t, "a")
	start(nodeA, true)
	SelectConfig(t, c, nodeA, "all-1g.18gb")
	waitEvicting(t, podNS, nodeA)
	l, err := c.CoordinationV1().Leases(ns).Get(ctx, lease.SlotLeaseName(0), metav1.GetOptions{})
	if err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != nodeA {
		t.Fatalf("slot %v (%v), want A's", l, err)
	}
	l.Spec.HolderIdentity = ptr.To("thief")
	if _, err := c.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	stolen := time.Now()
	rec := WaitState(t, c, nodeA, record.StateFailed, "all-1g.18gb", 20*time.Second)
	t.Logf("A failed %s after its slot was taken: %s", time.Since(stolen).Round(100*time.Millisecond), rec.Reason)
	if !strings.Contains(rec.Reason, "rollout slot was lost") || !strings.Contains(rec.Reason, `"thief"`) {
		t.Errorf("A's record: %q, want the lost slot named", rec.Reason)
	}
	if len(nodeEvents(t, c, nodeA, record.ReasonSlotLost)) == 0 {
		t.Errorf("no %s Event on A", record.ReasonSlotLost)
	}
	if n := GetNode(t, c, nodeA); hasTaint(n.Spec.Taints) {
		t.Errorf("A stays tainted: %v", n.Spec.Taints)
	}
}
