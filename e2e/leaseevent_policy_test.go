package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/lease"
	"github.com/migagent/mig-agent/lease/nodelease"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// lePolicyLeases and lePolicyEvents are the shipped policies' names.
const (
	lePolicyLeases = "mig-agent-leases"
	lePolicyEvents = "mig-agent-events"
)

// leQueueKey is a node's queue entry key on a slot (lease/queue.go queueKey).
func leQueueKey(node string) string {
	sum := sha256.Sum256([]byte(node))
	return lease.QueueKeyPrefix + hex.EncodeToString(sum[:10])
}

func leAnnotate(c kubernetes.Interface, ns, name string, ann map[string]any) error {
	data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	_, err := c.CoordinationV1().Leases(ns).Patch(context.Background(), name, types.MergePatchType, data, metav1.PatchOptions{})
	return err
}

// leUpdate reads Lease name and writes it back changed, as the slots'
// claim and renewal do.
func leUpdate(c kubernetes.Interface, ns, name string, change func(*coordinationv1.Lease)) error {
	l, err := c.CoordinationV1().Leases(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	change(l)
	_, err = c.CoordinationV1().Leases(ns).Update(context.Background(), l, metav1.UpdateOptions{})
	return err
}

func leSlot(ns, name, holder string) *coordinationv1.Lease {
	now := metav1.NewMicroTime(time.Now())
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:      map[string]string{record.LabelManagedBy: "mig-agent", lease.LabelRolloutSlot: "true"},
			Annotations: map[string]string{lease.AnnotationTicket: "1"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](60), AcquireTime: &now, RenewTime: &now},
	}
}

// leWaitEnforced waits until the API server enforces both policies (its
// policy informer has them): the token of node a is refused a Lease of
// another name and an Event about node b (dry runs).
func leWaitEnforced(t *testing.T, ns string, ca kubernetes.Interface, a, b string) {
	t.Helper()
	ctx := context.Background()
	WaitFor(t, policyTimeout, "the policies "+lePolicyLeases+" and "+lePolicyEvents+" to be enforced", func() bool {
		probe := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-probe-", Namespace: ns}}
		_, err := ca.CoordinationV1().Leases(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		_, eerr := ca.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, leEvent(a, "Node", b, a), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return pkgDeniedByPolicy(err, lePolicyLeases) && pkgDeniedByPolicy(eerr, lePolicyEvents)
	})
}

func leEvent(node, kind, name, host string) *corev1.Event {
	now := metav1.NewTime(time.Now())
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: name + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: kind, APIVersion: "v1", Name: name, Namespace: map[bool]string{true: "default"}[kind == "Pod"]},
		Reason:         record.ReasonApplied, Message: "e2e", Type: corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: "mig-agent", Host: host},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
}

// Leases and Events one agent cannot abuse, on the real API server with the
// shipped manifests: the token of node A's agent writes only A's node Lease,
// takes a rollout slot only for itself, changes only its own queue entry on
// a slot B holds, releases or hands on only the slot it holds, and posts
// Events only about its own Node (or a Pod that says it comes from A); it
// cannot make node Leases or queue entries for other (or no) nodes, clear
// B's slot, give it to another node, or rewrite B's MigConfigApplied.
func TestPackagingLeaseEventPolicy(t *testing.T) {
	in := pkgDescribe(t, pkgPlain(t))
	pkgApply(t, in.objs, false)
	admin := kubetest.Client(t)
	ctx := context.Background()
	ns := in.namespace
	a, b, c := kubetest.NewName(t, "a"), kubetest.NewName(t, "b"), kubetest.NewName(t, "c")
	for _, n := range []string{a, b, c} {
		kubetest.CreateNode(t, n, nil)
	}
	ca := pkgTokenClient(t, pkgBoundToken(t, in, a))
	cb := pkgTokenClient(t, pkgBoundToken(t, in, b))
	leases := func(cl kubernetes.Interface) func(*coordinationv1.Lease) error {
		return func(l *coordinationv1.Lease) error {
			_, err := cl.CoordinationV1().Leases(ns).Create(ctx, l, metav1.CreateOptions{})
			return err
		}
	}
	leWaitEnforced(t, ns, ca, a, b)
	slot := lease.SlotLeaseName(900 + rand.IntN(90)) // beyond the pools of the other tests
	t.Cleanup(func() {
		_ = admin.CoordinationV1().Leases(ns).Delete(context.Background(), slot, metav1.DeleteOptions{})
	})
	_ = admin.CoordinationV1().Leases(ns).Delete(ctx, slot, metav1.DeleteOptions{})

	type step struct {
		name   string
		policy string // "" allowed; else refused by this policy
		do     func() error
	}
	steps := []step{
		{"A makes its own node Lease", "", func() error {
			return leases(ca)(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: nodelease.NodeLeaseName(a), Namespace: ns},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("state-dir-1-2")}})
		}},
		{"A makes B's node Lease", lePolicyLeases, func() error {
			return leases(ca)(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: nodelease.NodeLeaseName(b), Namespace: ns}})
		}},
		{"A makes a node Lease for a node that does not exist", lePolicyLeases, func() error {
			return leases(ca)(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: nodelease.NodeLeaseName("ghost-" + a), Namespace: ns},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("x"), LeaseDurationSeconds: ptr.To[int32](1 << 30)}})
		}},
		{"A makes another Lease", lePolicyLeases, func() error {
			return leases(ca)(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "other-" + a, Namespace: ns}})
		}},
		{"B takes a free slot (creates it) for A", lePolicyLeases, func() error { return leases(cb)(leSlot(ns, slot, a)) }},
		{"B takes a free slot (creates it) for itself", "", func() error { return leases(cb)(leSlot(ns, slot, b)) }},
		{"A joins B's slot's queue", "", func() error { return leAnnotate(ca, ns, slot, map[string]any{leQueueKey(a): "5 " + a}) }},
		{"A queues a node that does not exist", lePolicyLeases, func() error {
			return leAnnotate(ca, ns, slot, map[string]any{leQueueKey("ghost"): "6 ghost"})
		}},
		{"A queues node C", lePolicyLeases, func() error { return leAnnotate(ca, ns, slot, map[string]any{leQueueKey(c): "4 " + c}) }},
		{"C joins the queue (its agent's write, made by the admin here)", "", func() error {
			return leAnnotate(admin, ns, slot, map[string]any{leQueueKey(c): "7 " + c})
		}},
		{"A removes C's entry", lePolicyLeases, func() error { return leAnnotate(ca, ns, slot, map[string]any{leQueueKey(c): nil}) }},
		{"A moves itself ahead of C", "", func() error { return leAnnotate(ca, ns, slot, map[string]any{leQueueKey(a): "3 " + a}) }},
		{"A clears B's holder", lePolicyLeases, func() error {
			return leUpdate(ca, ns, slot, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") })
		}},
		{"A gives B's slot to C", lePolicyLeases, func() error {
			return leUpdate(ca, ns, slot, func(l *coordinationv1.Lease) {
				l.Spec.HolderIdentity = ptr.To(c)
				l.Annotations[lease.AnnotationHandedTo] = c
			})
		}},
		{"A stretches B's hold", lePolicyLeases, func() error {
			return leUpdate(ca, ns, slot, func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = ptr.To[int32](1 << 30) })
		}},
		{"A rewrites the slot's ticket", lePolicyLeases, func() error {
			return leAnnotate(ca, ns, slot, map[string]any{lease.AnnotationTicket: "0"})
		}},
		{"A deletes B's slot", "rbac", func() error { return ca.CoordinationV1().Leases(ns).Delete(ctx, slot, metav1.DeleteOptions{}) }},
		{"B renews its slot", "", func() error {
			return leUpdate(cb, ns, slot, func(l *coordinationv1.Lease) { l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now())) })
		}},
		{"B hands its slot on to A (lease/queue.go handOverPatch)", "", func() error {
			ops := []map[string]any{
				{"op": "test", "path": "/spec/holderIdentity", "value": b},
				{"op": "remove", "path": "/metadata/annotations/" + strings.ReplaceAll(leQueueKey(a), "/", "~1")},
				{"op": "remove", "path": "/metadata/annotations/" + strings.ReplaceAll(leQueueKey(c), "/", "~1")},
				{"op": "replace", "path": "/spec/holderIdentity", "value": a},
				{"op": "add", "path": "/metadata/annotations/" + strings.ReplaceAll(lease.AnnotationHandedTo, "/", "~1"), "value": a},
				{"op": "add", "path": "/metadata/annotations/" + strings.ReplaceAll(lease.AnnotationTicket, "/", "~1"), "value": "3"},
			}
			data, _ := json.Marshal(ops)
			_, err := cb.CoordinationV1().Leases(ns).Patch(ctx, slot, types.JSONPatchType, data, metav1.PatchOptions{})
			return err
		}},
		{"B, no longer the holder, releases A's slot", lePolicyLeases, func() error {
			return leUpdate(cb, ns, slot, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") })
		}},
		{"A renews the slot it was handed (its first write)", "", func() error {
			return leUpdate(ca, ns, slot, func(l *coordinationv1.Lease) {
				delete(l.Annotations, lease.AnnotationHandedTo)
				l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
			})
		}},
		{"A releases its slot", "", func() error {
			return leUpdate(ca, ns, slot, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") })
		}},
		// Events.
		{"A posts an Event on its Node", "", func() error {
			_, err := ca.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, leEvent(a, "Node", a, a), metav1.CreateOptions{})
			return err
		}},
		{"A posts an Event on B's Node", lePolicyEvents, func() error {
			_, err := ca.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, leEvent(a, "Node", b, a), metav1.CreateOptions{})
			return err
		}},
		{"A posts an Event on B's Node, saying it comes from B", lePolicyEvents, func() error {
			_, err := ca.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, leEvent(a, "Node", b, b), metav1.CreateOptions{})
			return err
		}},
		{"A posts an Event on a pod of its node", "", func() error {
			_, err := ca.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, leEvent(a, "Pod", "train-0", a), metav1.CreateOptions{})
			return err
		}},
		{"A posts an Event on a pod, saying it comes from B", lePolicyEvents, func() error {
			_, err := ca.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, leEvent(a, "Pod", "train-0", b), metav1.CreateOptions{})
			return err
		}},
		{"A posts an Event on a Namespace", lePolicyEvents, func() error {
			_, err := ca.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, leEvent(a, "Namespace", "default", a), metav1.CreateOptions{})
			return err
		}},
	}
	for _, s := range steps {
		err := s.do()
		switch s.policy {
		case "":
			if err != nil {
				t.Errorf("allowed: %s: %v", s.name, err)
			}
		case "rbac":
			if !apierrors.IsForbidden(err) {
				t.Errorf("denied: %s: got %v, want Forbidden", s.name, err)
			}
		default:
			if !pkgDeniedByPolicy(err, s.policy) {
				t.Errorf("denied by %s: %s: got %v", s.policy, s.name, err)
			} else {
				t.Logf("denied: %s: %v", s.name, err)
			}
		}
	}
	if l, err := admin.CoordinationV1().Leases(ns).Get(ctx, slot, metav1.GetOptions{}); err != nil || ptr.Deref(l.Spec.HolderIdentity, "?") != "" ||
		l.Annotations[leQueueKey(c)] != "" || l.Annotations[lease.AnnotationTicket] != "3" {
		t.Errorf("the slot after the steps: %+v, %v", l, err)
	}

	// Node B's real MigConfigApplied, rewritten by A's token: refused.
	applied, err := admin.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, leEvent(b, "Node", b, b), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"type":"Warning","reason":"` + record.ReasonFailed + `","message":"forged"}`)
	_, err = ca.CoreV1().Events(metav1.NamespaceDefault).Patch(ctx, applied.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if !pkgDeniedByPolicy(err, lePolicyEvents) {
		t.Errorf("A's token rewrote B's %s: %v", record.ReasonApplied, err)
	}
	moved := []byte(`{"involvedObject":{"name":"` + a + `"},"source":{"host":"` + a + `"}}`)
	_, err = ca.CoreV1().Events(metav1.NamespaceDefault).Patch(ctx, applied.Name, types.MergePatchType, moved, metav1.PatchOptions{})
	if !pkgDeniedByPolicy(err, lePolicyEvents) {
		t.Errorf("A's token took over B's Event: %v", err)
	}
	if ev, _ := admin.CoreV1().Events(metav1.NamespaceDefault).Get(ctx, applied.Name, metav1.GetOptions{}); ev == nil || ev.Reason != record.ReasonApplied || ev.InvolvedObject.Name != b {
		t.Errorf("B's Event after A's attempts: %+v", ev)
	}

	// A token bound to no pod or node writes neither.
	plain := pkgTokenClient(t, kubetest.ServiceAccountToken(t, in.namespace, in.sa, nil))
	if err := leases(plain)(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: nodelease.NodeLeaseName(a), Namespace: ns}}); !pkgDeniedByPolicy(err, lePolicyLeases) {
		t.Errorf("an unbound token made a node Lease: %v", err)
	}
	if _, err := plain.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, leEvent(a, "Node", a, a), metav1.CreateOptions{}); !pkgDeniedByPolicy(err, lePolicyEvents) {
		t.Errorf("an unbound token posted an Event: %v", err)
	}
}

// Under the shipped policies, three real agents (the DaemonSet's args and
// settings, --max-concurrent 1, each with a token bound to a pod on its
// node) take, queue for, hand on and release the one rollout slot, and
// post their Events, refused nothing: all three changes succeed, one node
// disrupted at a time.
func TestPackagingLeaseEventPolicyAgents(t *testing.T) {
	in := pkgDescribe(t, pkgPlain(t))
	pkgApply(t, in.objs, false)
	admin := kubetest.Client(t)
	var nodes []string
	for i := range 3 {
		node := kubetest.NewName(t, fmt.Sprintf("n%d", i))
		kubetest.CreateNode(t, node, map[string]string{"nvidia.com/gpu.present": "true"})
		nodes = append(nodes, node)
	}
	leWaitEnforced(t, in.namespace, pkgTokenClient(t, pkgBoundToken(t, in, nodes[0])), nodes[0], nodes[1])
	var agents []*Agent
	for _, node := range nodes {
		a, _ := pkgStartAgent(t, in, node, "--nvml", "sim:h200x1")
		agents = append(agents, a)
	}
	for _, n := range nodes {
		SelectConfig(t, admin, n, "all-1g.18gb")
	}
	var recs []record.ChangeRecord
	for i, n := range nodes {
		rec := WaitState(t, admin, n, record.StateSuccess, "all-1g.18gb", 3*changeTimeout)
		recs = append(recs, rec)
		if log := strings.ToLower(agents[i].Log()); strings.Contains(log, "forbidden") {
			t.Errorf("agent of %s was refused something:\n%s", n, agents[i].Log())
		}
		if len(eventuallyNodeEvents(t, admin, n, record.ReasonApplied)) == 0 {
			t.Errorf("no %s Event on %s", record.ReasonApplied, n)
		}
	}
	if m := record.MaxDisrupted(recs); m != 1 {
		t.Errorf("%d nodes disrupted at once under --max-concurrent 1", m)
	}
	handedOff := 0
	for _, a := range agents {
		handedOff += strings.Count(a.Log(), "handed")
	}
	t.Logf("three changes under the shipped policies, one slot; log lines naming a hand-off: %d", handedOff)
}
