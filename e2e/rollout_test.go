package e2e

// A fleet on one API server (issue 17): twenty agents, --max-concurrent 3,
// a pool-wide change. Never more than three nodes between the start of
// their disruption and success (from the records), and the queued agents
// send the API server nothing while the slot Leases change without freeing
// a slot (counted by the API server itself, per identity).

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/lease"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
	"github.com/migagent/mig-agent/testkit/kubetest/audit"
)

const (
	roSA         = "mig-agent-fleet"
	roFlowSchema = "mig-agent-fleet-e2e"
)

// roIdentity installs packaging/kubernetes/rbac.yaml for a ServiceAccount of
// the fleet's own and a FlowSchema that matches only that identity, so the
// API server counts the fleet's requests apart from everyone else's
// (apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}); it
// returns a kubeconfig for that identity.
func roIdentity(t *testing.T, c kubernetes.Interface) string {
	t.Helper()
	ctx := context.Background()
	ensureNamespace(t, rbacNamespace)
	objs := rbacLoad(t)
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: roSA, Namespace: rbacNamespace}}
	for _, b := range objs.clusterRoleBindings {
		b.Name, b.Subjects = b.Name+"-fleet", subject
	}
	for _, b := range objs.roleBindings {
		b.Name, b.Subjects = b.Name+"-fleet", subject
	}
	rbacApply(t, c, objs)
	token := kubetest.ServiceAccountToken(t, rbacNamespace, roSA, nil)

	// Precedence 2, as the built-in "probes" schema, and a name that sorts
	// before it (ties go by name): health checks of this identity count too.
	fs := &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: roFlowSchema},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "workload-low"},
			MatchingPrecedence:         2,
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindServiceAccount,
					ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: rbacNamespace, Name: roSA}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"},
					Resources: []string{"*"}, ClusterScope: true, Namespaces: []string{"*"}}},
				NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: []string{"*"}, NonResourceURLs: []string{"*"}}},
			}},
		},
	}
	if _, err := c.FlowcontrolV1().FlowSchemas().Create(ctx, fs, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating the FlowSchema: %v", err)
	}
	t.Cleanup(func() {
		_ = c.FlowcontrolV1().FlowSchemas().Delete(context.Background(), roFlowSchema, metav1.DeleteOptions{})
	})
	return rbacKubeconfig(t, token)
}

// roServerMetrics reads the API server's /metrics with the admin client
// and returns the sum of each metric's samples whose labels hold every one
// of match (name → sum).
func roServerMetrics(t *testing.T, c kubernetes.Interface, name string, match ...string) float64 {
	t.Helper()
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("reading the API server's metrics: %v", err)
	}
	sum := 0.0
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, m := range match {
			ok = ok && strings.Contains(line, m)
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// roFleetRequests is how many requests the API server dispatched for the
// fleet's identity so far.
func roFleetRequests(t *testing.T, c kubernetes.Interface) float64 {
	return roServerMetrics(t, c, "apiserver_flowcontrol_dispatched_requests_total", `flow_schema="`+roFlowSchema+`"`)
}

// roQueued is the set of queue entries (their annotation keys) on slots
// 0 to n-1.
func roQueued(t *testing.T, c kubernetes.Interface, ns string, n int) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for i := range n {
		l, err := c.CoordinationV1().Leases(ns).Get(context.Background(), lease.SlotLeaseName(i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for k := range l.Annotations {
			if strings.HasPrefix(k, lease.QueueKeyPrefix) {
				out[lease.SlotLeaseName(i)+"/"+k] = true
			}
		}
	}
	return out
}

// roQueuedSnapshot is the fleet's request count and the queue entries of
// slots 0 to n-1 at one moment: read again until no request of the fleet
// came between the two reads of the count.
func roQueuedSnapshot(t *testing.T, c kubernetes.Interface, ns string, n int) (float64, map[string]bool) {
	t.Helper()
	for range 20 {
		r := roFleetRequests(t, c)
		q := roQueued(t, c, ns, n)
		if roFleetRequests(t, c) == r {
			return r, q
		}
	}
	t.Fatal("the fleet's requests never stood still between two reads")
	return 0, nil
}

// roHoldSlot creates or takes slot i for holder, for an hour.
func roHoldSlot(t *testing.T, c kubernetes.Interface, ns string, i int, holder string) {
	t.Helper()
	ctx := context.Background()
	leases := c.CoordinationV1().Leases(ns)
	now := metav1.NewMicroTime(time.Now())
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](3600), AcquireTime: &now, RenewTime: &now}
	l, err := leases.Get(ctx, lease.SlotLeaseName(i), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lease.SlotLeaseName(i),
			Labels: map[string]string{record.LabelManagedBy: "mig-agent", lease.LabelRolloutSlot: "true"}}, Spec: spec}, metav1.CreateOptions{})
	} else if err == nil {
		l.Spec = spec
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("holding slot %d for %s: %v", i, holder, err)
	}
}

func TestFleetRolloutBounded(t *testing.T) {
	const agents, slots = 20, 3
	c := kubetest.Client(t)
	kubeconfig := roIdentity(t, c)
	ns := rbacNamespace

	// A maintenance window holds every slot: the fleet queues.
	for i := range slots {
		roHoldSlot(t, c, ns, i, "maintenance")
	}
	t.Cleanup(func() {
		for i := range slots {
			_ = c.CoordinationV1().Leases(ns).Delete(context.Background(), lease.SlotLeaseName(i), metav1.DeleteOptions{})
		}
	})
	var nodes []string
	var as []*Agent
	for i := range agents {
		node := kubetest.NewName(t, fmt.Sprintf("fleet%02d", i))
		kubetest.CreateNode(t, node, nil)
		nodes = append(nodes, node)
		// Ready: its node watch is up.
		as = append(as, flStart(t, &Opts{Node: node, Sim: "h200x2", Namespace: ns, Kubeconfig: kubeconfig,
			Extra: []string{"--max-concurrent", strconv.Itoa(slots), "--lease-duration", "15s"}}))
	}
	labelled := time.Now()
	for _, n := range nodes {
		SelectConfig(t, c, n, "all-balanced")
	}
	for i, a := range as {
		WaitFor(t, 60*time.Second, "agent "+nodes[i]+" queued", func() bool {
			return strings.Contains(a.Log(), "all rollout slots taken; waiting")
		})
	}
	// Queued: every agent has listed and watches the slot Leases, and the
	// joins have settled: a node that asked before the nodes in a full
	// queue joins it ahead of them at its turn, seconds later (one patch,
	// once). Then, over ten seconds, one of them changes (renewed: still
	// held); none frees. The fleet sends nothing.
	settled := roFleetRequests(t, c)
	WaitFor(t, 30*time.Second, "the waiting agents to send nothing for 3 s, no slot freed", func() bool {
		time.Sleep(3 * time.Second)
		n := roFleetRequests(t, c)
		quiet := n == settled
		settled = n
		return quiet
	})
	leasesBefore := roServerMetrics(t, c, "apiserver_request_total", `resource="leases"`)
	before, queuedBefore := roQueuedSnapshot(t, c, ns, slots)
	if before == 0 {
		t.Fatal("the API server counted no request of the fleet's identity: the FlowSchema does not match it")
	}
	time.Sleep(5 * time.Second)
	roHoldSlot(t, c, ns, 1, "maintenance")
	time.Sleep(5 * time.Second)
	after, queuedAfter := roQueuedSnapshot(t, c, ns, slots)
	idle := after - before
	leasesIdle := roServerMetrics(t, c, "apiserver_request_total", `resource="leases"`) - leasesBefore
	// A join still due (a node that asked before the nodes of a full
	// queue, its turn seconds on) is one patch, once, and shows as a new
	// entry in a queue; nothing else may come.
	joins := 0
	for k := range queuedAfter {
		if !queuedBefore[k] {
			joins++
		}
	}
	t.Logf("FLEET %d agents queued for 10 s, one slot Lease renewed by its holder: %v requests from the fleet, %d of them late joins (lease requests at the server from everyone: %v, the test's own GET and PUT included)",
		agents, idle, joins, leasesIdle)
	if idle != float64(joins) {
		t.Errorf("the queued agents sent %v requests while no slot was freed, of which %d joins due at their turn (one patch each); want only those", idle, joins)
	}

	// The window ends: every slot freed at once.
	start := time.Now()
	startReq := roFleetRequests(t, c)
	for i := range slots {
		roHoldSlot(t, c, ns, i, "")
	}
	var recs []record.ChangeRecord
	for _, n := range nodes {
		recs = append(recs, WaitState(t, c, n, record.StateSuccess, "all-balanced", 3*time.Minute))
	}
	took := time.Since(start)
	rollReq := roFleetRequests(t, c) - startReq
	conflicts := roServerMetrics(t, c, "apiserver_request_total", `resource="leases"`, `code="409"`)
	for i, r := range recs {
		if r.DisruptedAt == nil || r.DisruptedAt.Before(r.StartedAt) || r.FinishedAt.Before(*r.DisruptedAt) {
			t.Fatalf("node %s: record without a sound disruptedAt: started %v disrupted %v finished %v", nodes[i], r.StartedAt, r.DisruptedAt, r.FinishedAt)
		}
		if r.DisruptedAt.Before(start) {
			t.Errorf("node %s began its disruption at %v, before the slots were freed at %v", nodes[i], r.DisruptedAt, start)
		}
	}
	most := record.MaxDisrupted(recs)
	t.Logf("FLEET %d agents, --max-concurrent %d: all success %s after the slots were freed; at most %d nodes between disruption and success; %v requests from the fleet (%.1f per node); %v lease conflicts at the server",
		agents, slots, took.Round(time.Millisecond), most, rollReq, rollReq/agents, conflicts)
	if most > slots {
		t.Errorf("%d nodes were between disruption and success at once; --max-concurrent is %d", most, slots)
	}
	if most < 2 {
		t.Errorf("at most %d node disrupted at a time: the queue never filled the slots, the bound was not exercised", most)
	}

	// What the hand-off cost, as the API server's audit log names it: the
	// agents' requests on the slot Leases from the labels on (joins of a
	// queue while the window held the slots, takes, hand-offs, releases,
	// lost races; the watch names none) and their conflicts.
	time.Sleep(time.Second) // the last responses are logged
	evs, err := audit.Read(kubetest.AuditLog(t), labelled, time.Time{}, func(e audit.Event) bool {
		return e.Namespace() == ns && strings.HasPrefix(e.UserAgent, "mig-agent/") && e.Resource() == "leases" &&
			strings.HasPrefix(e.Name(), "mig-agent-slot-")
	})
	if err != nil {
		t.Fatal(err)
	}
	lost, patches := 0, 0
	for _, e := range evs {
		if e.Code() == http.StatusConflict {
			lost++
		}
		if e.Verb == "patch" {
			patches++ // a join, or a hand-off to the next of a queue
		}
	}
	// Every queued agent joined a queue (one patch each) and handed its
	// slot on with one: no node takes a slot that has a queue by a race.
	if patches < agents {
		t.Errorf("%d patches of the slot Leases for %d agents queued behind the window: they did not queue", patches, agents)
	}
	perNode, share := float64(len(evs))/agents, float64(lost)/rollReq
	t.Logf("FLEET slot Lease requests from the labels on: %d (%.2f per node; %d patches: joins and hand-offs), %d conflicts (%.1f %% of the fleet's %v requests)", len(evs), perNode, patches, lost, 100*share, rollReq)
	if perNode > 3 {
		t.Errorf("%.2f slot Lease requests per node in the rollout; want at most 3 (a join, a hand-off, and few lost races)", perNode)
	}
	if share > 0.10 {
		t.Errorf("lease conflicts are %.1f %% of the rollout's requests; want at most 10 %%", 100*share)
	}
}
