package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// ppInstall applies packaging/kubernetes-planner/planner-policy.yaml for a
// planner ServiceAccount of its own (as the chart renders it: the
// account, the allowed configs), and returns that account's client and
// the policy's name.
func ppInstall(t *testing.T, allowed string) (kubernetes.Interface, string) {
	admin := kubetest.Client(t)
	ctx := context.Background()
	ns := kubetest.NewName(t, "planner")
	kubetest.CreateNamespace(t, ns)
	sa := "mig-agent-planner"
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// RBAC wider than the chart's (which gives get, list, patch): the
	// policy, not RBAC, must be what refuses.
	role := kubetest.NewName(t, "planner-nodes")
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes", "nodes/status"}, Verbs: []string{"get", "list", "patch", "update", "create", "delete"}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{}) })
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
	})

	raw, err := os.ReadFile(filepath.Join(pkgRoot(t), "packaging/kubernetes-planner/planner-policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(raw), "\n---\n")
	var vap admissionv1.ValidatingAdmissionPolicy
	var bind admissionv1.ValidatingAdmissionPolicyBinding
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &vap); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict([]byte(docs[1]), &bind); err != nil {
		t.Fatal(err)
	}
	name := kubetest.NewName(t, "planner-scope")
	vap.Name, bind.Name, bind.Spec.PolicyName = name, name, name
	vap.Spec.MatchConditions[0].Expression = fmt.Sprintf("request.userInfo.username == 'system:serviceaccount:%s:%s'", ns, sa)
	for i := range vap.Spec.Variables {
		if vap.Spec.Variables[i].Name == "allowedConfigs" {
			vap.Spec.Variables[i].Expression = allowed
		}
	}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &vap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &bind, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pkgTokenClient(t, tr.Status.Token), name
}

// The planner's reach equals its job: under its policy, the planner's
// token sets nvidia.com/mig.config on an opted-in node to an allowed
// config, and nothing else: not another value, not on a node that did not
// opt in, no other label (not control-plane), no opt-in or opt-out, no
// taint removed, no cordon, no annotation, no delete, no status. (On
// b20dfeb the chart gave the planner patch nodes and no policy: a stolen
// token could do all of it.)
func TestPlannerPolicy(t *testing.T) {
	admin := kubetest.Client(t)
	planner, policy := ppInstall(t, "['all-1g.18gb', 'all-3g.71gb']")
	optedIn, other := kubetest.NewName(t, "in"), kubetest.NewName(t, "out")
	kubetest.CreateNode(t, optedIn, map[string]string{"migagent.io/planner": "enabled"})
	kubetest.CreateNode(t, other, nil)
	ctx := context.Background()
	patch := func(node, body string) error {
		_, err := planner.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(body),
			metav1.PatchOptions{FieldManager: record.PlannerFieldManager})
		return err
	}
	label := func(k, v string) string { return fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, k, v) }
	WaitFor(t, policyTimeout, "the policy "+policy+" to refuse the planner on a node that did not opt in", func() bool {
		return deniedBy(patch(other, label(record.LabelConfig, "all-1g.18gb")), policy, "only nodes labelled migagent.io/planner=enabled")
	})
	if err := patch(optedIn, label(record.LabelConfig, "all-3g.71gb")); err != nil {
		t.Fatalf("the planner cannot set an allowed config on an opted-in node: %v", err)
	}
	for _, tc := range []struct{ what, node, body, want string }{
		{"a config not allowed", optedIn, label(record.LabelConfig, "all-7g.141gb"), "only to an allowed config"},
		{"the label removed", optedIn, `{"metadata":{"labels":{"nvidia.com/mig.config":null}}}`, "only to an allowed config"},
		{"another label", optedIn, label("node-role.kubernetes.io/control-plane", ""), "only the label nvidia.com/mig.config"},
		{"opting out", optedIn, `{"metadata":{"labels":{"migagent.io/planner":null}}}`, "only nodes labelled"},
		{"opting a node in", other, label("migagent.io/planner", "enabled"), "only nodes labelled"},
		{"a cordon", optedIn, `{"spec":{"unschedulable":true}}`, "may not change a Node's annotations, taints"},
		{"a taint", optedIn, `{"spec":{"taints":[{"key":"x","effect":"NoSchedule"}]}}`, "may not change a Node's annotations, taints"},
		{"an annotation", optedIn, `{"metadata":{"annotations":{"x":"y"}}}`, "may not change a Node's annotations, taints"},
	} {
		if err := patch(tc.node, tc.body); !deniedBy(err, policy, tc.want) {
			t.Errorf("%s: %v, want denied (%s)", tc.what, err, tc.want)
		}
	}
	if err := planner.CoreV1().Nodes().Delete(ctx, other, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); !deniedBy(err, policy, "may only update Nodes") {
		t.Errorf("delete: %v", err)
	}
	n := GetNode(t, admin, optedIn)
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: "X", Status: corev1.ConditionTrue})
	if _, err := planner.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); !deniedBy(err, policy, "may only update Nodes") {
		t.Errorf("status: %v", err)
	}
	// A person (cluster-admin) is not bound by the planner's policy.
	if _, err := admin.CoreV1().Nodes().Patch(ctx, other, types.MergePatchType, []byte(label("team", "a")), metav1.PatchOptions{}); err != nil {
		t.Errorf("admin: %v", err)
	}
}

// The agent applies a change the planner asked for only on an opted-in
// node: a label written as the planner (its field manager) on a node
// without migagent.io/planner=enabled fails, nothing touched. (On b20dfeb
// the agent applied it, evicting as for a person.)
func TestAgentRefusesPlannerChangeOnNodeNotOptedIn(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := (&Opts{Node: node, Sim: "h200x1"}).Fill(t)
	StartAgent(t, o)
	WaitFor(t, 10*time.Second, "the simulated GPUs' state", func() bool { _, err := os.Stat(o.SimState); return err == nil })
	before := flReadSim(t, o.SimState)
	SetLabel(t, c, node, record.LabelConfig, "all-1g.18gb", record.PlannerFieldManager)
	flExpectFailed(t, c, node, "all-1g.18gb", o.SimState, before, drain.ErrPlannerNotOptedIn.Error())
	// A person's write is theirs: applied.
	SetLabel(t, c, node, record.LabelConfig, "all-3g.71gb", "kubectl-label")
	WaitState(t, c, node, record.StateSuccess, "all-3g.71gb", 30*time.Second)
}
