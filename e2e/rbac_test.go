package e2e

// The agent under packaging/kubernetes/rbac.yaml and nothing else: its
// ServiceAccount, a token bound to a pod on its node, a full change with a
// DRA check, the ConfigMap, Events, records, the taint, an eviction and a
// rollout Lease; and what the rules do not grant is refused.

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/migagent/mig-agent/lease"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// The agent's identity as the manifests name it.
const (
	rbacNamespace = "mig-agent"
	rbacSA        = "mig-agent"
	rbacUser      = "system:serviceaccount:" + rbacNamespace + ":" + rbacSA
)

// rbacObjects is packaging/kubernetes/rbac.yaml, typed.
type rbacObjects struct {
	clusterRoles        []*rbacv1.ClusterRole
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
	roles               []*rbacv1.Role
	roleBindings        []*rbacv1.RoleBinding
}

// rbacLoad parses the manifest strictly into typed objects.
func rbacLoad(t *testing.T) rbacObjects {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "packaging", "kubernetes", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out rbacObjects
	for i, doc := range bytes.Split(raw, []byte("\n---\n")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("rbac.yaml document %d: %v", i, err)
		}
		if tm.APIVersion != rbacv1.SchemeGroupVersion.String() {
			t.Fatalf("rbac.yaml document %d: apiVersion %q, want %s", i, tm.APIVersion, rbacv1.SchemeGroupVersion)
		}
		var obj any
		switch tm.Kind {
		case "ClusterRole":
			o := &rbacv1.ClusterRole{}
			out.clusterRoles, obj = append(out.clusterRoles, o), o
		case "ClusterRoleBinding":
			o := &rbacv1.ClusterRoleBinding{}
			out.clusterRoleBindings, obj = append(out.clusterRoleBindings, o), o
		case "Role":
			o := &rbacv1.Role{}
			out.roles, obj = append(out.roles, o), o
		case "RoleBinding":
			o := &rbacv1.RoleBinding{}
			out.roleBindings, obj = append(out.roleBindings, o), o
		default:
			t.Fatalf("rbac.yaml document %d: unexpected kind %q", i, tm.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("rbac.yaml document %d (%s): %v", i, tm.Kind, err)
		}
	}
	if len(out.clusterRoles) != 1 || len(out.clusterRoleBindings) != 1 || len(out.roles) != 1 || len(out.roleBindings) != 1 {
		t.Fatalf("rbac.yaml: want one ClusterRole, ClusterRoleBinding, Role and RoleBinding, got %d %d %d %d",
			len(out.clusterRoles), len(out.clusterRoleBindings), len(out.roles), len(out.roleBindings))
	}
	return out
}

// rbacApply creates the objects, or updates them when they exist (another
// test may have installed the same manifests).
func rbacApply(t *testing.T, c kubernetes.Interface, objs rbacObjects) {
	t.Helper()
	ctx := context.Background()
	rbac := c.RbacV1()
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for _, o := range objs.clusterRoles {
		_, err := rbac.ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cur, gerr := rbac.ClusterRoles().Get(ctx, o.Name, metav1.GetOptions{})
			check("get ClusterRole", gerr)
			o.ResourceVersion = cur.ResourceVersion
			_, err = rbac.ClusterRoles().Update(ctx, o, metav1.UpdateOptions{})
		}
		check("ClusterRole "+o.Name, err)
	}
	for _, o := range objs.clusterRoleBindings {
		_, err := rbac.ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cur, gerr := rbac.ClusterRoleBindings().Get(ctx, o.Name, metav1.GetOptions{})
			check("get ClusterRoleBinding", gerr)
			o.ResourceVersion = cur.ResourceVersion
			_, err = rbac.ClusterRoleBindings().Update(ctx, o, metav1.UpdateOptions{})
		}
		check("ClusterRoleBinding "+o.Name, err)
	}
	for _, o := range objs.roles {
		_, err := rbac.Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cur, gerr := rbac.Roles(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
			check("get Role", gerr)
			o.ResourceVersion = cur.ResourceVersion
			_, err = rbac.Roles(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		}
		check("Role "+o.Name, err)
	}
	for _, o := range objs.roleBindings {
		_, err := rbac.RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cur, gerr := rbac.RoleBindings(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
			check("get RoleBinding", gerr)
			o.ResourceVersion = cur.ResourceVersion
			_, err = rbac.RoleBindings(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		}
		check("RoleBinding "+o.Name, err)
	}
}

// rbacKubeconfig writes a kubeconfig for the test server that
// authenticates with token only.
func rbacKubeconfig(t *testing.T, token string) string {
	t.Helper()
	admin, err := clientcmd.LoadFromFile(kubetest.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	cluster := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	if cluster == nil {
		t.Fatalf("admin kubeconfig %s has no cluster for its context", kubetest.Kubeconfig())
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = cluster.DeepCopy()
	cfg.AuthInfos[rbacSA] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["agent"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: rbacSA, Namespace: rbacNamespace}
	cfg.CurrentContext = "agent"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// rbacAccess is one request the agent's identity makes, or must not.
type rbacAccess struct {
	verb, group, resource, subresource, namespace string
}

func (a rbacAccess) String() string {
	r := a.resource
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.group != "" {
		r += "." + a.group
	}
	if a.namespace != "" {
		r = a.namespace + "/" + r
	}
	return a.verb + " " + r
}

// rbacAllowed asks the server whether the agent's ServiceAccount may.
func rbacAllowed(t *testing.T, c kubernetes.Interface, a rbacAccess) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   rbacUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + rbacNamespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Namespace: a.namespace,
		},
	}}
	got, err := c.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview %s: %v", a, err)
	}
	return got.Status.Allowed
}

// The manifests grant what the agent uses and no more; the agent, with a
// token of its ServiceAccount bound to a pod on its node, goes through a
// full change under them.
func TestRBAC(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	ensureNamespace(t, rbacNamespace)
	if _, err := c.CoreV1().ServiceAccounts(rbacNamespace).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: rbacSA}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	objs := rbacLoad(t)
	for _, s := range append(slices.Clone(objs.clusterRoleBindings[0].Subjects), objs.roleBindings[0].Subjects...) {
		if s.Kind != rbacv1.ServiceAccountKind || s.Name != rbacSA || s.Namespace != rbacNamespace {
			t.Errorf("binding subject %+v is not the ServiceAccount %s/%s", s, rbacNamespace, rbacSA)
		}
	}
	if ns := objs.roles[0].Namespace; ns != rbacNamespace || objs.roleBindings[0].Namespace != rbacNamespace {
		t.Errorf("Role/RoleBinding in %q/%q, want %s", ns, objs.roleBindings[0].Namespace, rbacNamespace)
	}
	rbacApply(t, c, objs)

	// Least privilege, asked of the authorizer.
	const other = "default"
	allowed := []rbacAccess{
		{verb: "get", resource: "nodes"}, {verb: "list", resource: "nodes"}, {verb: "watch", resource: "nodes"},
		{verb: "patch", resource: "nodes"}, {verb: "update", resource: "nodes"},
		{verb: "patch", resource: "nodes", subresource: "status"},
		{verb: "get", resource: "pods", namespace: other}, {verb: "list", resource: "pods"}, {verb: "watch", resource: "pods"},
		{verb: "create", resource: "pods", subresource: "eviction", namespace: other},
		{verb: "get", group: "policy", resource: "poddisruptionbudgets", namespace: other},
		{verb: "list", group: "policy", resource: "poddisruptionbudgets"},
		{verb: "create", resource: "events", namespace: other}, {verb: "patch", resource: "events", namespace: other},
		{verb: "create", group: "events.k8s.io", resource: "events", namespace: other},
		{verb: "patch", group: "events.k8s.io", resource: "events", namespace: other},
		{verb: "get", group: "resource.k8s.io", resource: "resourceslices"},
		{verb: "list", group: "resource.k8s.io", resource: "resourceslices"},
		{verb: "get", group: "nvidia.com", resource: "clusterpolicies"},
		{verb: "list", group: "nvidia.com", resource: "clusterpolicies"},
		{verb: "get", resource: "configmaps", namespace: rbacNamespace},
		{verb: "create", resource: "configmaps", namespace: rbacNamespace},
		{verb: "update", resource: "configmaps", namespace: rbacNamespace},
		{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: rbacNamespace},
		{verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: rbacNamespace},
		{verb: "watch", group: "coordination.k8s.io", resource: "leases", namespace: rbacNamespace},
		{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: rbacNamespace},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: rbacNamespace},
		{verb: "patch", group: "coordination.k8s.io", resource: "leases", namespace: rbacNamespace},
	}
	denied := []rbacAccess{
		{verb: "create", resource: "nodes"}, {verb: "delete", resource: "nodes"},
		{verb: "update", resource: "nodes", subresource: "status"},
		{verb: "create", resource: "pods", namespace: other}, {verb: "delete", resource: "pods", namespace: other},
		{verb: "update", resource: "pods", namespace: other}, {verb: "deletecollection", resource: "pods", namespace: other},
		{verb: "get", resource: "secrets", namespace: rbacNamespace}, {verb: "list", resource: "secrets"},
		{verb: "get", resource: "configmaps", namespace: other}, {verb: "create", resource: "configmaps", namespace: other},
		{verb: "delete", resource: "configmaps", namespace: rbacNamespace},
		{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: "kube-system"},
		{verb: "delete", group: "coordination.k8s.io", resource: "leases", namespace: rbacNamespace},
		{verb: "delete", resource: "events", namespace: other},
		{verb: "create", group: "resource.k8s.io", resource: "resourceslices"},
		{verb: "update", group: "nvidia.com", resource: "clusterpolicies"},
		{verb: "get", group: "nvidia.com", resource: "nvidiadrivers"},
		{verb: "create", group: "policy", resource: "poddisruptionbudgets", namespace: other},
		{verb: "get", group: "apps", resource: "daemonsets", namespace: other},
		{verb: "create", group: "rbac.authorization.k8s.io", resource: "clusterrolebindings"},
		{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: rbacNamespace},
	}
	for _, a := range allowed {
		if !rbacAllowed(t, c, a) {
			t.Errorf("the agent may not %s", a)
		}
	}
	for _, a := range denied {
		if rbacAllowed(t, c, a) {
			t.Errorf("the agent may %s, which it does not need", a)
		}
	}

	// The node, a kubelet serving PodResources, the agent's own pod (its
	// token is bound to it and so names the node) and a workload on GPU 0.
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	kl := kubetest.StartKubelet(t, c, node)
	agentPod := kl.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: rbacNamespace, Name: kubetest.NewName(t, "mig-agent")},
		Spec: corev1.PodSpec{ServiceAccountName: rbacSA,
			Containers: []corev1.Container{{Name: "agent", Image: "mig-agent:test"}}},
	})
	token := kubetest.ServiceAccountToken(t, rbacNamespace, rbacSA, agentPod)
	kubeconfig := rbacKubeconfig(t, token)
	saCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}
	review, err := sa.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("who am I: %v", err)
	}
	if u := review.Status.UserInfo; u.Username != rbacUser || !slices.Contains(u.Extra["authentication.kubernetes.io/node-name"], node) {
		t.Errorf("the token is %q with extra %v; want %s bound to node %s", u.Username, u.Extra, rbacUser, node)
	}

	// Outside the rules: refused with 403.
	for what, err := range map[string]error{
		"list secrets": func() error {
			_, err := sa.CoreV1().Secrets(rbacNamespace).List(ctx, metav1.ListOptions{})
			return err
		}(),
		"delete the node": sa.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}),
		"delete a pod":    sa.CoreV1().Pods(rbacNamespace).Delete(ctx, agentPod.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}),
		"create a ConfigMap in default": func() error {
			_, err := sa.CoreV1().ConfigMaps(other).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}},
				metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}(),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s as the agent: %v, want 403 Forbidden", what, err)
		}
	}

	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	devs, _, code := RunCLI(t, "profiles", "--nvml", "sim:h200x8", "-o", "json")
	if code != 0 {
		t.Fatal("profiles failed")
	}
	gpu0 := gpuUUID(t, devs, 0)
	owner := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "trainer", UID: "0b7c1a52-0000-4000-8000-000000000001", Controller: ptr.To(true)}
	workload := kl.RunPod(t, ns, "trainer-0", map[string]string{"nvidia.com/gpu": "1"}, map[string][]string{"nvidia.com/gpu": {gpu0}}, owner)

	// A DRA driver that makes MIG devices: the agent must see it (list
	// ResourceSlices) and refuse.
	// (DynamicMIG: shared counters.)
	dynamic := kubetest.CreateSlices(t, c, kubetest.DynamicMIGSlices(node, kubetest.NewName(t, "slice"))...)
	slice := dynamic[0]

	o := &Opts{Node: node, Namespace: rbacNamespace, Kubeconfig: kubeconfig,
		Extra: []string{"--pod-resources-socket", kl.Socket(), "--max-concurrent", "1"}}
	a := StartAgent(t, o)
	SetLabel(t, c, node, record.LabelConfig, "all-1g.18gb", "erin-kubectl")
	rec := WaitState(t, c, node, record.StateFailed, "all-1g.18gb", changeTimeout)
	if !strings.Contains(rec.Reason, "DRA") || !strings.Contains(rec.Reason, slice.Name) {
		t.Errorf("with a MIG-making DRA driver: reason %q, want it named", rec.Reason)
	}
	for _, s := range dynamic {
		if err := c.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The full change: taint, Lease, eviction, NVML, record, Events.
	w := watchNode(t, c, node)
	start := time.Now()
	SetLabel(t, c, node, record.LabelConfig, "all-balanced", "erin-kubectl")
	w.wait(t, 0, record.StatePending, changeTimeout)
	rec = WaitState(t, c, node, record.StateSuccess, "all-balanced", changeTimeout)
	checkRecord(t, rawRecord(t, GetNode(t, c, node)), start)
	if want := []string{ns + "/" + workload.Name}; !slices.Equal(rec.EvictedPods, want) {
		t.Errorf("evictedPods %v, want %v", rec.EvictedPods, want)
	}
	if rec.RequestedBy != "erin-kubectl" || rec.PreviousConfig != "" {
		t.Errorf("record: requestedBy %q previousConfig %q", rec.RequestedBy, rec.PreviousConfig)
	}
	if got := kl.Finished(); !slices.Equal(got, []string{ns + "/" + workload.Name}) {
		t.Errorf("pods the kubelet finished: %v", got)
	}
	assertNoTaint(t, c, node)
	assertGeometry(t, o, "all-balanced", "")
	if _, err := c.CoreV1().ConfigMaps(rbacNamespace).Get(ctx, node+"-mig-config", metav1.GetOptions{}); err != nil {
		t.Errorf("ConfigMap: %v", err)
	}
	if cm, err := c.CoreV1().ConfigMaps(rbacNamespace).Get(ctx, record.HistoryConfigMapName(node), metav1.GetOptions{}); err != nil ||
		!strings.Contains(cm.Data[record.HistoryConfigMapKey], workload.Name) {
		t.Errorf("history ConfigMap: %v", err)
	}
	if cond := lnCondition(GetNode(t, c, node)); cond == nil || cond.Status != corev1.ConditionTrue {
		t.Errorf("condition %s: %+v", record.ConditionConfigReady, cond)
	}
	lease, err := c.CoordinationV1().Leases(rbacNamespace).Get(ctx, lease.SlotLeaseName(0), metav1.GetOptions{})
	if err != nil {
		t.Errorf("rollout Lease: %v", err)
	} else if lease.Spec.AcquireTime == nil || lease.Spec.AcquireTime.Time.Before(start.Add(-time.Second)) {
		t.Errorf("rollout Lease not taken for this change: %+v", lease.Spec)
	}
	for _, reason := range []string{record.ReasonStarted, record.ReasonEvicting, record.ReasonApplied, record.ReasonManagerConflict} {
		WaitFor(t, 10*time.Second, "an Event "+reason, func() bool { return len(nodeEvents(t, c, node, reason)) == 1 })
	}
	for _, ev := range nodeEvents(t, c, node, "") {
		if ev.Source.Component != "mig-agent" {
			t.Errorf("Event %s from %q", ev.Reason, ev.Source.Component)
		}
	}
	// Nothing the agent tried was refused (some refusals are only logged).
	if strings.Contains(strings.ToLower(a.Log()), "forbidden") {
		t.Errorf("the agent was refused something:\n%s", grepLines(strings.ToLower(a.Log()), "forbidden"))
	}
}

// gpuUUID returns the UUID of GPU index in `mig-agent profiles -o json` output.
func gpuUUID(t *testing.T, profilesJSON string, index int) string {
	t.Helper()
	var p struct {
		GPUs []struct {
			Index int    `json:"index"`
			UUID  string `json:"uuid"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(profilesJSON), &p); err != nil {
		t.Fatal(err)
	}
	for _, g := range p.GPUs {
		if g.Index == index {
			return g.UUID
		}
	}
	t.Fatalf("no GPU %d", index)
	return ""
}
