package e2e

// Issue 5, the cluster-wide limit (--max-concurrent): five agents on one API
// server, at most two nodes disrupted at once, all converge; and a node
// that reboots for its change keeps its slot until it is back.

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/lease"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// ccHolders returns the nodes holding an unexpired rollout slot Lease.
func ccHolders(ctx context.Context, c kubernetes.Interface, ns string) (map[string]bool, error) {
	// The slot Leases only (the agents' node Leases live beside them).
	list, err := c.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelRolloutSlot + "=true"})
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, l := range list.Items {
		h := ptr.Deref(l.Spec.HolderIdentity, "")
		if h == "" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
			continue
		}
		if time.Now().Before(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)) {
			out[h] = true
		}
	}
	return out, nil
}

// ccSample is one observation of the cluster.
type ccSample struct {
	at          time.Duration
	tainted     []string // nodes with the reconfiguring taint
	pending     int      // nodes in state pending (queued or at work)
	terminating int      // GPU pods being evicted
	unslotted   []string // tainted nodes holding no slot
}

// D: five nodes labelled at once with --max-concurrent 2: each change is
// slowed by an eviction held Terminating for 2s. Every 50ms the test reads
// the Nodes, the slot Leases and the pods: never more than two nodes are
// tainted (the disrupted window: taint, evictions, NVML), never more than two
// evictions run, every tainted node holds a slot, and all five succeed.
func TestConcurrencyAtMostTwoNodesDisrupted(t *testing.T) {
	const nodes, limit, hold = 5, 2, 2 * time.Second
	c := kubetest.Client(t)
	ctx := context.Background()
	ns := kubetest.NewName(t, "ns") // the agents' namespace: Leases
	kubetest.CreateNamespace(t, ns)
	podNS := kubetest.NewName(t, "pods")
	kubetest.CreateNamespace(t, podNS)

	var names []string
	var agents []*Agent
	for i := range nodes {
		node := kubetest.NewName(t, fmt.Sprintf("n%d", i))
		kubetest.CreateNode(t, node, nil)
		kl := kubetest.StartKubelet(t, c, node)
		o := (&Opts{Node: node, Sim: "h200x2", Namespace: ns}).Fill(t)
		gpus := disProfiles(t, o.Sim, o.SimState)
		pod := kl.RunPod(t, podNS, "train-"+node, map[string]string{"nvidia.com/gpu": "1"},
			map[string][]string{"nvidia.com/gpu": {gpus[0].UUID}}, disOwner("train"))
		kl.KeepTerminating(pod)
		o.Extra = []string{"--pod-resources-socket", kl.Socket(), "--max-concurrent", fmt.Sprint(limit),
			"--lease-duration", "5s", "--eviction-retry-delay", "200ms"}
		agents = append(agents, StartAgent(t, o))
		names = append(names, node)
	}
	for _, n := range names {
		WaitFor(t, 20*time.Second, "agent watching "+n, func() bool {
			for _, a := range agents {
				if a.Args[2] == n && ccReady(a) {
					return true
				}
			}
			return false
		})
	}

	// The test finishes each evicted pod 2s after its eviction: a workload
	// that takes its time to stop.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		seen := map[string]bool{}
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			list, err := c.CoreV1().Pods(podNS).List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			for _, p := range list.Items {
				if p.DeletionTimestamp == nil || seen[p.Name] {
					continue
				}
				seen[p.Name] = true
				wg.Go(func() {
					time.Sleep(hold)
					_ = c.CoreV1().Pods(podNS).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				})
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()

	start := time.Now()
	for _, n := range names {
		SelectConfig(t, c, n, "all-1g.18gb")
	}
	var samples []ccSample
	done := false
	for !done && time.Since(start) < 90*time.Second {
		time.Sleep(50 * time.Millisecond)
		before, err1 := ccHolders(ctx, c, ns)
		list, err2 := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		after, err3 := ccHolders(ctx, c, ns)
		pods, err4 := c.CoreV1().Pods(podNS).List(ctx, metav1.ListOptions{})
		if err := cmpErr(err1, err2, err3, err4); err != nil {
			t.Fatal(err)
		}
		s := ccSample{at: time.Since(start)}
		succeeded := 0
		for _, n := range list.Items {
			if !slices.Contains(names, n.Name) {
				continue
			}
			switch n.Labels[record.LabelState] {
			case record.StatePending:
				s.pending++
			case record.StateSuccess:
				if LastChange(t, &n).Config == "all-1g.18gb" {
					succeeded++
				}
			}
			if disTainted(&n) {
				s.tainted = append(s.tainted, n.Name)
				// Taken before the taint, freed after it is lifted: held in
				// one of the two reads around the node list.
				if !before[n.Name] && !after[n.Name] {
					s.unslotted = append(s.unslotted, n.Name)
				}
			}
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				s.terminating++
			}
		}
		samples = append(samples, s)
		done = succeeded == nodes
	}
	took := time.Since(start)

	maxTainted, maxPending, maxTerminating := 0, 0, 0
	for _, s := range samples {
		maxTainted = max(maxTainted, len(s.tainted))
		maxPending = max(maxPending, s.pending)
		maxTerminating = max(maxTerminating, s.terminating)
		if len(s.tainted) > limit {
			t.Errorf("at %s %d nodes disrupted at once: %v", s.at.Round(time.Millisecond), len(s.tainted), s.tainted)
		}
		if s.terminating > limit {
			t.Errorf("at %s %d evictions at once", s.at.Round(time.Millisecond), s.terminating)
		}
		if len(s.unslotted) > 0 {
			t.Errorf("at %s tainted without a slot: %v", s.at.Round(time.Millisecond), s.unslotted)
		}
	}
	if !done {
		t.Fatalf("not all %d nodes reached success in %s", nodes, took.Round(time.Millisecond))
	}
	if maxTainted != limit {
		t.Errorf("at most %d nodes were disrupted at once: the limit of %d was never used", maxTainted, limit)
	}
	for _, n := range names {
		rec := LastChange(t, GetNode(t, c, n))
		if len(rec.EvictedPods) != 1 || disTainted(GetNode(t, c, n)) {
			t.Errorf("%s: evicted %v, tainted %v", n, rec.EvictedPods, disTainted(GetNode(t, c, n)))
		}
	}
	if h, _ := ccHolders(ctx, c, ns); len(h) != 0 {
		t.Errorf("slots still held after all changes: %v", h)
	}
	t.Logf("SCENARIO %d nodes, --max-concurrent %d, evictions held %s: all succeeded in %s; %d samples; at most %d disrupted (tainted) and %d evictions at once; up to %d nodes pending (queued included)",
		nodes, limit, hold, took.Round(time.Millisecond), len(samples), maxTainted, maxTerminating, maxPending)
}

func cmpErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// D: a node that reboots for its change is disrupted until it is back: it
// keeps its slot (the Lease stretched to lease.RebootHold, unrenewed), so
// with --max-concurrent 1 another node waits, then goes once the first one
// resumed after its reboot and finished.
func TestConcurrencySlotHeldThroughReboot(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	opts := make([]*Opts, 2)
	for i := range opts {
		node := kubetest.NewName(t, fmt.Sprintf("n%d", i))
		kubetest.CreateNode(t, node, nil)
		opts[i] = (&Opts{Node: node, Sim: "a100-40gbx2", Namespace: ns,
			Extra: []string{"--sim-no-reset", "--max-concurrent", "1", "--lease-duration", "5s"}}).Fill(t)
	}
	first, second := opts[0], opts[1]
	a := StartAgent(t, first)
	b := StartAgent(t, second)
	SelectConfig(t, c, first.Node, "all-1g.5gb")
	WaitState(t, c, first.Node, record.StateRebooting, "all-1g.5gb", 30*time.Second)
	slotLease, err := c.CoordinationV1().Leases(ns).Get(ctx, lease.SlotLeaseName(0), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h, d := ptr.Deref(slotLease.Spec.HolderIdentity, ""), ptr.Deref(slotLease.Spec.LeaseDurationSeconds, 0); h != first.Node || d != int32(lease.RebootHold/time.Second) {
		t.Errorf("slot while rebooting: holder %q, duration %ds", h, d)
	}

	SelectConfig(t, c, second.Node, "all-1g.5gb")
	// Well past the 5s slotLease duration and several slot polls.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		n := GetNode(t, c, second.Node)
		if disTainted(n) || n.Labels[record.LabelState] == record.StateRebooting {
			t.Fatalf("the second node went while the first was rebooting: state %q, tainted %v", n.Labels[record.LabelState], disTainted(n))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if s := GetNode(t, c, second.Node).Labels[record.LabelState]; s != record.StatePending {
		t.Errorf("second node state %q while waiting, want pending", s)
	}

	// The first node reboots and comes back: it finishes and frees the slot.
	a.Stop()
	if _, errOut, code := RunCLI(t, "sim", "reboot", "--sim-state", first.SimState); code != 0 {
		t.Fatalf("sim reboot: %s", errOut)
	}
	StartAgent(t, first)
	rec := WaitState(t, c, first.Node, record.StateSuccess, "all-1g.5gb", 30*time.Second)
	if !rec.Reboot {
		t.Error("first node's record lacks reboot:true")
	}
	WaitState(t, c, second.Node, record.StateRebooting, "all-1g.5gb", 30*time.Second)
	slotLease, err = c.CoordinationV1().Leases(ns).Get(ctx, lease.SlotLeaseName(0), metav1.GetOptions{})
	if err != nil || ptr.Deref(slotLease.Spec.HolderIdentity, "") != second.Node {
		t.Errorf("slot after the first node finished: %v %v", slotLease.Spec.HolderIdentity, err)
	}
	if _, exited := b.Wait(0); exited {
		t.Errorf("second agent exited: %d", b.ExitCode())
	}
}

// ccReady reports whether the agent's /readyz answers 200 (its node watch
// is up).
func ccReady(a *Agent) bool {
	resp, err := http.Get(a.Metrics + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
