package e2e

// The audit trail on the real API server: who asked, as the API server
// authenticated them (the shipped MutatingAdmissionPolicy stamps it), and
// records that no one but the node's agent can write (the shipped
// ValidatingAdmissionPolicy); without the policies, the documented
// fallback; and a record dropped by the history bound still leaves an
// Event and a log line.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// auditUser is a ServiceAccount of the test that may get and patch Nodes
// (and their status) but is not the agent.
type auditUser struct {
	name string // system:serviceaccount:NS:SA
	c    kubernetes.Interface
}

// auditUsers creates ServiceAccounts in a fresh namespace, grants them
// get and patch on nodes and nodes/status, and returns clients with their
// tokens.
func auditUsers(t *testing.T, names ...string) []auditUser {
	t.Helper()
	admin := kubetest.Client(t)
	ctx := context.Background()
	ns := kubetest.NewName(t, "users")
	kubetest.CreateNamespace(t, ns)
	role := kubetest.NewName(t, "node-patcher")
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes", "nodes/status"},
			Verbs: []string{"get", "list", "watch", "patch", "update"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var subjects []rbacv1.Subject
	for _, n := range names {
		subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: n})
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: subjects}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{})
	})
	var out []auditUser
	for _, n := range names {
		c := pkgTokenClient(t, kubetest.ServiceAccountToken(t, ns, n, nil))
		out = append(out, auditUser{name: "system:serviceaccount:" + ns + ":" + n, c: c})
	}
	// RBAC caches: wait until the grant is in effect.
	for _, u := range out {
		WaitFor(t, 30*time.Second, u.name+" may list nodes", func() bool {
			_, err := u.c.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
			return err == nil
		})
	}
	return out
}

// auditPatch sends a JSON merge patch to the Node (status: to its status
// subresource), with fieldManager when not empty: `kubectl label` sends
// such a patch with fieldManager=kubectl-label.
func auditPatch(c kubernetes.Interface, node, fieldManager string, status bool, patch map[string]any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	var sub []string
	if status {
		sub = []string{"status"}
	}
	_, err = c.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, data,
		metav1.PatchOptions{FieldManager: fieldManager}, sub...)
	return err
}

func auditLabel(value string) map[string]any {
	return map[string]any{"metadata": map[string]any{"labels": map[string]any{record.LabelConfig: value}}}
}

func auditAnnotation(key, value string) map[string]any {
	return map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}}
}

// auditStamp reads the requester stamp of node.
func auditStamp(t *testing.T, c kubernetes.Interface, node string) (record.RequesterStamp, bool) {
	t.Helper()
	raw, ok := GetNode(t, c, node).Annotations[record.AnnotationRequestedBy]
	if !ok {
		return record.RequesterStamp{}, false
	}
	var s record.RequesterStamp
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		t.Fatalf("the stamp %q: %v", raw, err)
	}
	return s, true
}

// deniedBy reports whether err is a refusal of the admission policy
// named *suffix, with a message that contains want.
func deniedBy(err error, suffix, want string) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), suffix+"' with binding") && strings.Contains(err.Error(), want)
}

// TestAuditRequester: under the shipped policies, two users each set the
// label with a plain merge patch and each record names that user as the
// API server authenticated them; a user claiming another field manager is
// recorded as who they are; a user who may patch Nodes, cluster-admin
// too, cannot write the records, the state or the stamp; the agent's
// history shows the requesters.
func TestAuditRequester(t *testing.T) {
	admin := kubetest.Client(t)
	in := pkgDescribe(t, pkgPlain(t))
	pkgApply(t, in.objs, false)
	records := pkgNamed(t, in.objs, "ValidatingAdmissionPolicy", "-records").GetName()
	requester := pkgNamed(t, in.objs, "MutatingAdmissionPolicy", "-requester").GetName()
	scope := map[string]string{pkgAuditScope: in.namespace}
	users := auditUsers(t, "alice", "bob")
	alice, bob := users[0], users[1]

	// A probe node without an agent: the policies are enforced once the
	// API server's informers have them.
	probe := kubetest.NewName(t, "probe")
	kubetest.CreateNode(t, probe, scope)
	i, start := 0, time.Now()
	WaitFor(t, policyTimeout, "the policy "+requester+" to stamp", func() bool {
		i++
		if err := auditPatch(bob.c, probe, "", false, auditLabel(fmt.Sprintf("probe-%d", i))); err != nil {
			t.Fatal(err)
		}
		s, ok := auditStamp(t, admin, probe)
		return ok && s.Config == fmt.Sprintf("probe-%d", i)
	})
	t.Logf("policy %s stamps %s after the test started waiting", requester, time.Since(start).Round(time.Millisecond))
	WaitFor(t, policyTimeout, "the policy "+records+" to be enforced", func() bool {
		return deniedBy(auditPatch(bob.c, probe, "", false, auditAnnotation("migagent.io/probe", time.Now().Format("150405.000"))), records, "")
	})
	t.Logf("policy %s enforced %s after the test started waiting", records, time.Since(start).Round(time.Millisecond))

	// The stamp is the request's own: user, field manager, label value.
	if err := auditPatch(bob.c, probe, "kubectl-label", false, auditLabel("probe-bob")); err != nil {
		t.Fatal(err)
	}
	if s, _ := auditStamp(t, admin, probe); s != (record.RequesterStamp{User: bob.name, Via: "kubectl-label", Config: "probe-bob"}) {
		t.Errorf("stamp %+v, want bob's own", s)
	}
	// Through the status subresource (which may change labels too) as well.
	if err := auditPatch(alice.c, probe, "", true, auditLabel("probe-status")); err != nil {
		t.Fatal(err)
	}
	if s, _ := auditStamp(t, admin, probe); s.User != alice.name || s.Config != "probe-status" {
		t.Errorf("stamp after a status patch %+v, want alice's", s)
	}
	// A forged stamp sent with a label change is overwritten by the real one.
	forged := `{"user":"system:serviceaccount:kube-system:root","via":"","config":"probe-forged"}`
	patch := auditLabel("probe-forged")
	patch["metadata"].(map[string]any)["annotations"] = map[string]any{record.AnnotationRequestedBy: forged}
	if err := auditPatch(bob.c, probe, "", false, patch); err != nil {
		t.Errorf("a label change with a forged stamp: %v (want it admitted, with bob's stamp)", err)
	}
	if s, _ := auditStamp(t, admin, probe); s.User != bob.name || s.Config != "probe-forged" {
		t.Errorf("stamp after a forged one was sent %+v, want bob's", s)
	}

	// Refused: the records, the state label and the stamp, by anyone but
	// the node's agent; cluster-admin (system:masters) included.
	refusals := []struct {
		name   string
		c      kubernetes.Interface
		status bool
		patch  map[string]any
		policy string
		msg    string
	}{
		{"bob writes last-change", bob.c, false, auditAnnotation(record.AnnotationLastChange, `{"config":"all-balanced","result":"success"}`),
			records, "only the mig-agent of node " + probe + " may change its records and state (" + record.AnnotationLastChange + "); " + bob.name + " may not"},
		{"bob writes the history through the status", bob.c, true, auditAnnotation(record.AnnotationHistory, "[]"),
			records, "(" + record.AnnotationHistory + ")"},
		{"bob writes the condition MIGConfigReady", bob.c, true, map[string]any{"status": map[string]any{"conditions": []map[string]any{
			{"type": record.ConditionConfigReady, "status": "True", "reason": "Success", "message": "forged"}}}},
			records, "(condition " + record.ConditionConfigReady + ")"},
		{"bob sets the state label", bob.c, false, map[string]any{"metadata": map[string]any{"labels": map[string]any{record.LabelState: record.StateSuccess}}},
			records, "(" + record.LabelState + ")"},
		{"bob writes the stamp", bob.c, false, auditAnnotation(record.AnnotationRequestedBy, `{"user":"`+alice.name+`","via":"","config":"probe-forged"}`),
			records, "migagent.io/requested-by is written only by the MutatingAdmissionPolicy of mig-agent"},
		{"bob writes his own stamp without a label change", bob.c, false, auditAnnotation(record.AnnotationRequestedBy, `{"user":"`+bob.name+`","via":"","config":"probe-other"}`),
			records, bob.name + " may not write or remove it"},
		{"bob removes the stamp", bob.c, false, map[string]any{"metadata": map[string]any{"annotations": map[string]any{record.AnnotationRequestedBy: nil}}},
			records, "may not write or remove it"},
		{"cluster-admin writes last-change", admin, false, auditAnnotation(record.AnnotationLastChange, "{}"),
			records, "kube-test-admin may not"},
	}
	for _, r := range refusals {
		if err := auditPatch(r.c, probe, "", r.status, r.patch); !deniedBy(err, r.policy, r.msg) {
			t.Errorf("%s: %v, want a refusal of %s saying %q", r.name, err, r.policy, r.msg)
		} else {
			t.Logf("refused: %s: %v", r.name, err)
		}
	}
	if s, _ := auditStamp(t, admin, probe); s.User != bob.name {
		t.Errorf("the stamp changed under refused requests: %+v", s)
	}

	// The agent, as the shipped ServiceAccount with a token bound to a pod
	// on its node, writes its records under the policies.
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/gpu.present": "true", pkgAuditScope: in.namespace})
	a, _ := pkgStartAgent(t, in, node, "--nvml", "sim:h200x1")
	steps := []struct {
		u            auditUser
		config       string
		fieldManager string
	}{
		{alice, "all-1g.18gb", "kubectl-label"},
		// bob claims to be the agent's field manager: recorded as bob.
		{bob, "all-balanced", "mig-agent"},
		{alice, "all-disabled", ""},
	}
	for _, st := range steps {
		begin := time.Now()
		if err := auditPatch(st.u.c, node, st.fieldManager, false, auditLabel(st.config)); err != nil {
			t.Fatalf("%s sets %s: %v", st.u.name, st.config, err)
		}
		rec := WaitState(t, admin, node, record.StateSuccess, st.config, changeTimeout)
		t.Logf("%s by %s: success after %s", st.config, st.u.name, time.Since(begin).Round(time.Millisecond))
		if rec.RequestedBy != st.u.name || rec.RequestedVia != st.fieldManager || rec.RequestedAt == nil {
			t.Errorf("%s set by %s (fieldManager %q): record says requestedBy %q requestedVia %q at %v",
				st.config, st.u.name, st.fieldManager, rec.RequestedBy, rec.RequestedVia, rec.RequestedAt)
		}
	}
	if strings.Contains(strings.ToLower(a.Log()), "forbidden") {
		t.Errorf("the agent was refused something under the policies:\n%s", grepLines(strings.ToLower(a.Log()), "forbidden"))
	}
	// The agent's own trail: a log line per record, with the requester.
	for _, st := range steps {
		if !strings.Contains(a.Log(), `"requestedBy":"`+st.u.name) && !strings.Contains(a.Log(), "requestedBy="+st.u.name) {
			t.Errorf("the agent's log has no record line naming %s:\n%s", st.u.name, grepLines(a.Log(), "change record"))
		}
	}

	// `mig-agent status` shows the history with the authenticated requesters.
	out, stderr, code := RunCLI(t, "status", "--node", node, "--kubeconfig", kubetest.Kubeconfig())
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, stderr)
	}
	hist := out[strings.Index(out, "History (newest first):"):]
	for _, want := range []string{alice.name + " via kubectl-label", bob.name + " via mig-agent"} {
		if !strings.Contains(hist, want) {
			t.Errorf("status history lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "Requested: "+alice.name+" (authenticated by the API server)") {
		t.Errorf("status does not name the requester of the desired config:\n%s", out)
	}
}

// TestAuditFallback: without the policies (the test's nodes are outside
// their bindings), the API server keeps no managedFields entry for a
// label set by a plain patch of a Node created bare and never server-side
// applied (it does for a Node created with a label, as the kubelet
// registers one), so the record says unknown; once the label is
// server-side applied, the field manager names the requester; a stamp left
// from an earlier value is not attributed to a new request; and records
// the history bound drops leave an Event and a log line each.
func TestAuditFallback(t *testing.T) {
	admin := kubetest.Client(t)
	users := auditUsers(t, "carol")
	carol := users[0]
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Sim: "h200x1"}
	a := StartAgent(t, o)

	// The claim, on the real API server: a merge patch with a field
	// manager leaves no managedFields entry on a Node created bare, with
	// no field anyone owns (the API server starts tracking an object that
	// has no managedFields only at its first server-side apply) ...
	if err := auditPatch(carol.c, node, "kubectl-label", false, auditLabel("all-1g.18gb")); err != nil {
		t.Fatal(err)
	}
	if mf := labelManagers(GetNode(t, admin, node).ManagedFields); len(mf) != 0 {
		t.Errorf("managedFields of the label after a merge patch of a bare Node: %v; the docs say the API server keeps none", mf)
	}
	// ... and does on a Node created with a label, as the kubelet registers
	// one (with its labels and status).
	registered := kubetest.NewName(t, "registered")
	kubetest.CreateNode(t, registered, map[string]string{"kubernetes.io/hostname": registered})
	if err := auditPatch(carol.c, registered, "kubectl-label", false, auditLabel("all-1g.18gb")); err != nil {
		t.Fatal(err)
	}
	if mf := labelManagers(GetNode(t, admin, registered).ManagedFields); !slices.Equal(mf, []string{"kubectl-label"}) {
		t.Errorf("managedFields of the label after the same patch of a Node created with a label: %v, want [kubectl-label]", mf)
	}
	rec := WaitState(t, admin, node, record.StateSuccess, "all-1g.18gb", changeTimeout)
	if rec.RequestedBy != record.RequesterUnknown || rec.RequestedVia != "" || rec.RequestedAt == nil {
		t.Errorf("a merge patch without the policy: requestedBy %q via %q at %v, want unknown, no field manager, when the agent saw it",
			rec.RequestedBy, rec.RequestedVia, rec.RequestedAt)
	}

	// Server-side apply: the field manager, and the time the API server kept.
	SetLabel(t, admin, node, record.LabelConfig, "all-balanced", "gitops")
	rec = WaitState(t, admin, node, record.StateSuccess, "all-balanced", changeTimeout)
	if rec.RequestedBy != "gitops" || rec.RequestedVia != "gitops" || rec.RequestedAt == nil {
		t.Errorf("server-side apply without the policy: requestedBy %q via %q at %v, want the field manager gitops",
			rec.RequestedBy, rec.RequestedVia, rec.RequestedAt)
	}

	// A stamp from an earlier value (written while no policy guards it) is
	// not this request's.
	if err := auditPatch(admin, node, "", false, auditAnnotation(record.AnnotationRequestedBy,
		`{"user":"mallory","via":"kubectl-label","config":"all-balanced"}`)); err != nil {
		t.Fatal(err)
	}
	if err := auditPatch(carol.c, node, "", false, auditLabel("all-disabled")); err != nil {
		t.Fatal(err)
	}
	rec = WaitState(t, admin, node, record.StateSuccess, "all-disabled", changeTimeout)
	if rec.RequestedBy == "mallory" {
		t.Errorf("the stale stamp of all-balanced was attributed to the request for all-disabled: %+v", rec)
	}
	if !strings.Contains(a.Log(), "the requester stamp on the Node is not this request's") {
		t.Errorf("the agent did not log the stale stamp:\n%s", a.Log())
	}

	// The history bound: every record beyond it leaves an Event and a log
	// line. Unknown configs fail at once, each with a record.
	ns := o.Namespace
	before := len(WholeHistory(t, admin, ns, node))
	extra := record.HistoryMaxRecords + 2 - before
	for i := range extra {
		cfg := fmt.Sprintf("no-such-config-%d", i)
		if err := auditPatch(carol.c, node, "", false, auditLabel(cfg)); err != nil {
			t.Fatal(err)
		}
		WaitState(t, admin, node, record.StateFailed, cfg, changeTimeout)
	}
	if hist := WholeHistory(t, admin, ns, node); len(hist) != record.HistoryMaxRecords {
		t.Fatalf("the history ConfigMap holds %d records, want %d", len(hist), record.HistoryMaxRecords)
	}
	if hist := NodeHistory(t, GetNode(t, admin, node)); len(hist) != record.NodeHistoryMaxRecords {
		t.Fatalf("the Node's history holds %d records, want %d", len(hist), record.NodeHistoryMaxRecords)
	}
	wantDropped := before + extra - record.HistoryMaxRecords
	var evs []corev1.Event
	WaitFor(t, 10*time.Second, fmt.Sprintf("%d %s Events", wantDropped, record.ReasonRecordRetired), func() bool {
		evs = nodeEvents(t, admin, node, record.ReasonRecordRetired)
		return len(evs) >= wantDropped
	})
	if len(evs) != wantDropped {
		t.Errorf("%d %s Events, want %d", len(evs), record.ReasonRecordRetired, wantDropped)
	}
	// The oldest records left first: the merge patch's, then the apply's.
	var msgs []string
	for _, ev := range evs {
		msgs = append(msgs, ev.Message)
	}
	all := strings.Join(msgs, "\n")
	if !strings.Contains(all, `config "all-1g.18gb"`) || !strings.Contains(all, `requested by "unknown"`) ||
		!strings.Contains(all, `config "all-balanced"`) || !strings.Contains(all, `requested by "gitops"`) {
		t.Errorf("the Events do not name the dropped records:\n%s", all)
	}
	if got := strings.Count(a.Log(), "change record dropped from the history"); got != wantDropped {
		t.Errorf("%d log lines for %d dropped records:\n%s", got, wantDropped, grepLines(a.Log(), "dropped"))
	}
}

// labelManagers names the field managers in managedFields that own the
// desired label.
func labelManagers(mf []metav1.ManagedFieldsEntry) []string {
	var out []string
	for _, e := range mf {
		if e.FieldsV1 != nil && strings.Contains(e.FieldsV1.GetRawString(), `"f:`+record.LabelConfig+`"`) {
			out = append(out, e.Manager)
		}
	}
	return out
}
