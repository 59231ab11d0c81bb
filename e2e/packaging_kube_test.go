package e2e

// Tests of the Kubernetes packaging on the real API server: the plain
// manifests (packaging/kubernetes) and the Helm chart's golden renders
// (packaging/test/testdata, rendered there with Helm's own packages)
// are accepted; the admission policy lets the agent's ServiceAccount, with
// a token bound to a pod on node A, change node A's own keys and nothing
// else; and the real binary, started with the DaemonSet's args, env and
// settings file and that token, converges its node under the shipped RBAC
// and policy.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// policyTimeout bounds how long the API server takes to start enforcing a
// new ValidatingAdmissionPolicy (its policy informer must see it).
const policyTimeout = 60 * time.Second

// pkgInstall is one way of installing the agent: its objects and who the
// agent is.
type pkgInstall struct {
	objs             []*unstructured.Unstructured
	namespace, sa    string
	policy           string // the ValidatingAdmissionPolicy's name
	pauseGpuOperator bool
	// startupTaintKeys: the keys the policy lets the agent remove
	// (--startup-taint), as its variable startupTaintKeys lists them.
	startupTaintKeys  []string
	daemonSet, config *unstructured.Unstructured
}

// pkgDecode reads every object of a multi-document YAML file.
func pkgDecode(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		obj := map[string]any{}
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(obj) > 0 {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

// pkgKindOrder is the order objects are created in (as kubectl apply -k
// orders them: what others refer to first).
var pkgKindOrder = []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "Role",
	"ClusterRoleBinding", "RoleBinding", "ConfigMap", "Service", "DaemonSet",
	"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}

func pkgKindRank(kind string) int {
	if i := slices.Index(pkgKindOrder, kind); i >= 0 {
		return i
	}
	return len(pkgKindOrder)
}

// pkgApply creates or updates objs with server-side apply, as `kubectl
// apply --server-side` would; with dryRun the server validates and admits
// them but stores nothing.
func pkgApply(t *testing.T, objs []*unstructured.Unstructured, dryRun bool) {
	t.Helper()
	cfg := kubetest.RestConfig(t)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	sorted := pkgScopeAudit(objs)
	sort.SliceStable(sorted, func(i, j int) bool { return pkgKindRank(sorted[i].GetKind()) < pkgKindRank(sorted[j].GetKind()) })
	opts := metav1.PatchOptions{FieldManager: "e2e-packaging", Force: ptr.To(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, obj := range sorted {
		gvk := obj.GroupVersionKind()
		var mapping *meta.RESTMapping
		// A kind served by a CRD created just before appears once the CRD
		// is established.
		WaitFor(t, 30*time.Second, "the API of "+gvk.String(), func() bool {
			mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if meta.IsNoMatchError(err) {
				mapper.Reset()
				return false
			}
			return true
		})
		if err != nil {
			t.Fatalf("%s: %v", gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		data, err := json.Marshal(obj.Object)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ri.Patch(context.Background(), obj.GetName(), types.ApplyPatchType, data, opts); err != nil {
			t.Fatalf("the API server refuses %s %s/%s (dry run %v): %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), dryRun, err)
		}
	}
}

// pkgAuditScope is the Node label that the audit policies' bindings
// select in these tests (pkgScopeAudit).
const pkgAuditScope = "e2e.migagent.io/audit-scope"

// pkgScopeAudit returns objs with the bindings of the audit policies
// (*-records, *-requester) narrowed to the Nodes labelled pkgAuditScope=
// the install's namespace. The API server is shared by every test of the
// package, and most run the agent as the admin: bound cluster-wide, the
// records policy would refuse their agents, and the requester policy would
// change what their records name. The policies themselves are as shipped.
func pkgScopeAudit(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	scope := "none"
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			scope = o.GetNamespace()
		}
	}
	out := make([]*unstructured.Unstructured, len(objs))
	for i, o := range objs {
		out[i] = o
		policy, _, _ := unstructured.NestedString(o.Object, "spec", "policyName")
		if !strings.HasSuffix(o.GetKind(), "AdmissionPolicyBinding") ||
			!(strings.HasSuffix(policy, "-records") || strings.HasSuffix(policy, "-requester")) {
			continue
		}
		o = o.DeepCopy()
		if err := unstructured.SetNestedStringMap(o.Object, map[string]string{pkgAuditScope: scope},
			"spec", "matchResources", "objectSelector", "matchLabels"); err != nil {
			panic(err)
		}
		out[i] = o
	}
	return out
}

func pkgFind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func pkgOne(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	f := pkgFind(objs, kind)
	if len(f) != 1 {
		t.Fatalf("want one %s, have %d", kind, len(f))
	}
	return f[0]
}

// pkgNamed returns the one object of kind whose name ends with suffix.
func pkgNamed(t *testing.T, objs []*unstructured.Unstructured, kind, suffix string) *unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, o := range pkgFind(objs, kind) {
		if strings.HasSuffix(o.GetName(), suffix) {
			out = append(out, o)
		}
	}
	if len(out) != 1 {
		t.Fatalf("want one %s named *%s, have %d", kind, suffix, len(out))
	}
	return out[0]
}

// pkgDescribe fills in who the agent of objs is.
func pkgDescribe(t *testing.T, objs []*unstructured.Unstructured) *pkgInstall {
	t.Helper()
	in := &pkgInstall{objs: objs, daemonSet: pkgOne(t, objs, "DaemonSet")}
	in.namespace = in.daemonSet.GetNamespace()
	in.sa, _, _ = unstructured.NestedString(in.daemonSet.Object, "spec", "template", "spec", "serviceAccountName")
	vap := pkgNamed(t, objs, "ValidatingAdmissionPolicy", "-node-scope")
	in.policy = vap.GetName()
	if b := pkgNamed(t, objs, "ValidatingAdmissionPolicyBinding", "-node-scope"); b.Object["spec"].(map[string]any)["policyName"] != in.policy {
		t.Fatalf("the binding %s does not bind the policy %s", b.GetName(), in.policy)
	}
	vars, _, _ := unstructured.NestedSlice(vap.Object, "spec", "variables")
	for _, v := range vars {
		if m := v.(map[string]any); m["name"] == "pauseGpuOperator" {
			in.pauseGpuOperator = m["expression"] == "true"
		}
		if m := v.(map[string]any); m["name"] == "startupTaintKeys" {
			if err := json.Unmarshal([]byte(fmt.Sprint(m["expression"])), &in.startupTaintKeys); err != nil {
				t.Fatalf("startupTaintKeys %v: %v", m["expression"], err)
			}
		}
	}
	volumes, _, _ := unstructured.NestedSlice(in.daemonSet.Object, "spec", "template", "spec", "volumes")
	for _, v := range volumes {
		if name, ok, _ := unstructured.NestedString(v.(map[string]any), "configMap", "name"); ok {
			for _, cm := range pkgFind(objs, "ConfigMap") {
				if cm.GetName() == name {
					in.config = cm
				}
			}
		}
	}
	if in.config == nil {
		t.Fatal("the DaemonSet mounts no ConfigMap of the install (the settings)")
	}
	if in.sa == "" || !slices.ContainsFunc(pkgFind(objs, "ServiceAccount"), func(o *unstructured.Unstructured) bool { return o.GetName() == in.sa }) {
		t.Fatalf("the DaemonSet runs as ServiceAccount %q, which the install does not create", in.sa)
	}
	return in
}

// pkgPlain reads packaging/kubernetes in the order its kustomization
// lists, checking that it lists every manifest there.
func pkgPlain(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	dir := filepath.Join(pkgRoot(t), "packaging/kubernetes")
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(pkgRead(t, filepath.Join(dir, "kustomization.yaml")), &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	var want []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			want = append(want, b)
		}
	}
	if got := slices.Sorted(slices.Values(k.Resources)); !slices.Equal(got, want) {
		t.Errorf("kustomization.yaml lists %v, the directory holds %v", got, want)
	}
	var objs []*unstructured.Unstructured
	for _, r := range k.Resources {
		objs = append(objs, pkgDecode(t, filepath.Join(dir, r))...)
	}
	return objs
}

func pkgChart(t *testing.T, name string) []*unstructured.Unstructured {
	t.Helper()
	return pkgDecode(t, filepath.Join(pkgRoot(t), "packaging/test/testdata", name+".yaml"))
}

// TestPackagingPlainManifests installs packaging/kubernetes and checks the
// policy and the agent under it.
func TestPackagingPlainManifests(t *testing.T) {
	in := pkgDescribe(t, pkgPlain(t))
	if in.namespace != "mig-agent" || in.sa != "mig-agent" {
		t.Fatalf("the plain manifests run the agent as %s/%s, want mig-agent/mig-agent", in.namespace, in.sa)
	}
	pkgOne(t, in.objs, "Namespace")
	pkgApply(t, in.objs, false)
	t.Run("policy", func(t *testing.T) { pkgCheckPolicy(t, in) })
	t.Run("agent", func(t *testing.T) { pkgRunAgent(t, in, "all-1g.18gb") })
}

// TestPackagingChart: the default render and the render with
// values-gpu-operator.yaml are accepted by the server over an install of
// the plain manifests (dry run: they name the same objects, so this is
// `helm install mig-agent` taking over from `kubectl apply -k`, and
// immutable fields such as the DaemonSet's selector must agree); the render
// with every option on is installed in its own namespace, and its policy
// and agent checked as the plain ones.
func TestPackagingChart(t *testing.T) {
	pkgApply(t, pkgPlain(t), false)
	pkgApply(t, pkgChart(t, "default"), true)
	// The chart with its GPU Operator values (toolkit-ready initContainer,
	// host paths with mount propagation, RuntimeClass, deploy-label
	// nodeSelector) over the same install, as docs/install.md installs it.
	pkgApply(t, pkgChart(t, "gpu-operator"), true)

	full := pkgChart(t, "full")
	in := pkgDescribe(t, full)
	if !in.pauseGpuOperator {
		t.Error("the full render (pauseGpuOperator: true) does not let the agent change the operand labels")
	}
	ensureNamespace(t, in.namespace)
	pkgApply(t, pkgMonitoringCRDs(), false)
	pkgApply(t, full, false)
	for _, kind := range []string{"ServiceMonitor", "PodMonitor", "Service"} {
		pkgOne(t, full, kind)
	}
	t.Run("policy", func(t *testing.T) { pkgCheckPolicy(t, in) })
	// defaultConfig: all-balanced; the node has no label.
	t.Run("agent", func(t *testing.T) { pkgRunAgent(t, in, "") })
}

// pkgMonitoringCRDs are stand-ins for the Prometheus Operator's CRDs (any
// spec accepted), so the chart's ServiceMonitor and PodMonitor can be
// created.
func pkgMonitoringCRDs() []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, kind := range []string{"ServiceMonitor", "PodMonitor"} {
		plural := strings.ToLower(kind) + "s"
		out = append(out, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
			"metadata": map[string]any{"name": plural + ".monitoring.coreos.com"},
			"spec": map[string]any{
				"group": "monitoring.coreos.com", "scope": "Namespaced",
				"names": map[string]any{"kind": kind, "listKind": kind + "List", "plural": plural, "singular": strings.ToLower(kind)},
				"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
					"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object",
						"x-kubernetes-preserve-unknown-fields": true}}}},
			},
		}})
	}
	return out
}

// pkgBoundToken returns a token of the install's ServiceAccount bound to a
// (never running) pod on node, as the kubelet projects into the agent's
// pod.
func pkgBoundToken(t *testing.T, in *pkgInstall, node string) string {
	t.Helper()
	c := kubetest.Client(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: kubetest.NewName(t, "agent"), Namespace: in.namespace},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: in.sa,
			Containers: []corev1.Container{{Name: "mig-agent", Image: "mig-agent:test"}}},
	}
	pod, err := c.CoreV1().Pods(in.namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("bound pod: %v", err)
	}
	t.Cleanup(func() {
		_ = c.CoreV1().Pods(in.namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	return kubetest.ServiceAccountToken(t, in.namespace, in.sa, pod)
}

func pkgTokenConfig(t *testing.T, token string) *rest.Config {
	t.Helper()
	cfg := rest.AnonymousClientConfig(kubetest.RestConfig(t))
	cfg.BearerToken = token
	return cfg
}

func pkgTokenClient(t *testing.T, token string) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(pkgTokenConfig(t, token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pkgMergePatch(c kubernetes.Interface, node string, patch map[string]any) error {
	data, _ := json.Marshal(patch)
	_, err := c.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, data, metav1.PatchOptions{})
	return err
}

// pkgUpdate reads node and writes it back changed, as drain's taint and
// operand code does.
func pkgUpdate(c kubernetes.Interface, node string, change func(*corev1.Node)) error {
	n, err := c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	change(n)
	_, err = c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	return err
}

func pkgLabels(kv ...string) map[string]any {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return map[string]any{"metadata": map[string]any{"labels": m}}
}

// pkgDeniedByPolicy reports whether err is the policy's refusal.
func pkgDeniedByPolicy(err error, policy string) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
}

// pkgCheckPolicy: with a token bound to a pod on node A, the agent's
// ServiceAccount may change A's own keys and nothing else.
func pkgCheckPolicy(t *testing.T, in *pkgInstall) {
	admin := kubetest.Client(t)
	nodeA, nodeB := kubetest.NewName(t, "a"), kubetest.NewName(t, "b")
	for _, n := range []string{nodeA, nodeB} {
		kubetest.CreateNode(t, n, map[string]string{record.LabelConfig: "all-balanced", "example.com/team": "ml",
			drain.Operands()[0].Label: "true"})
		if err := pkgMergePatch(admin, n, map[string]any{"metadata": map[string]any{"annotations": map[string]any{"example.com/owner": "ops"}}}); err != nil {
			t.Fatal(err)
		}
	}
	token := pkgBoundToken(t, in, nodeA)
	c := pkgTokenClient(t, token)

	// The premise: the API server names node A in the token's user extra.
	review, err := c.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	ui := review.Status.UserInfo
	if want := "system:serviceaccount:" + in.namespace + ":" + in.sa; ui.Username != want {
		t.Fatalf("the token authenticates as %q, want %q", ui.Username, want)
	}
	if got := ui.Extra["authentication.kubernetes.io/node-name"]; !slices.Equal(got, authenticationv1.ExtraValue{nodeA}) {
		t.Fatalf("the token's node-name extra is %v, want [%s] (extra: %v)", got, nodeA, ui.Extra)
	}

	// The API server enforces a new policy once its informer has it: until
	// then a foreign label on node A goes through (a harmless probe).
	start := time.Now()
	WaitFor(t, policyTimeout, "the policy "+in.policy+" to be enforced", func() bool {
		return pkgDeniedByPolicy(pkgMergePatch(c, nodeA, pkgLabels("e2e.migagent.io/probe", time.Now().Format("150405.000"))), in.policy)
	})
	t.Logf("policy %s enforced %s after the test started waiting", in.policy, time.Since(start).Round(time.Millisecond))

	operand := drain.Operands()[0].Label
	readyPatch := func(status string) []byte {
		return []byte(`{"status":{"conditions":[{"type":"` + record.ConditionConfigReady + `","status":"` + status + `","reason":"Pending","message":"e2e"}]}}`)
	}
	allowed := []struct {
		name string
		do   func() error
	}{
		{"its condition MIGConfigReady", func() error {
			_, err := c.CoreV1().Nodes().PatchStatus(context.Background(), nodeA, readyPatch("False"))
			return err
		}},
		{"own state label and audit annotations", func() error {
			return pkgMergePatch(c, nodeA, map[string]any{"metadata": map[string]any{
				"labels":      map[string]any{record.LabelState: record.StatePending},
				"annotations": map[string]any{record.AnnotationLastChange: `{"config":"all-balanced"}`, record.AnnotationHistory: "[]"}}})
		}},
		{"own taint added", func() error {
			return pkgUpdate(c, nodeA, func(n *corev1.Node) {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: drain.TaintKey, Value: "true", Effect: corev1.TaintEffectNoSchedule})
			})
		}},
		{"own taint removed", func() error {
			return pkgUpdate(c, nodeA, func(n *corev1.Node) {
				n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == drain.TaintKey })
			})
		}},
		{"state label removed", func() error { return pkgMergePatch(c, nodeA, pkgLabels(record.LabelState, "")) }},
	}
	denied := []struct {
		name string
		do   func() error
	}{
		{"the condition MIGConfigReady of another node", func() error {
			_, err := c.CoreV1().Nodes().PatchStatus(context.Background(), nodeB, readyPatch("True"))
			return err
		}},
		{"its capacity, in a status patch", func() error {
			_, err := c.CoreV1().Nodes().PatchStatus(context.Background(), nodeA, []byte(`{"status":{"capacity":{"nvidia.com/gpu":"8"}}}`))
			return err
		}},
		{"another condition, in a status patch", func() error {
			_, err := c.CoreV1().Nodes().PatchStatus(context.Background(), nodeA,
				[]byte(`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"e2e","message":"e2e"}]}}`))
			return err
		}},
		{"another node's state label", func() error { return pkgMergePatch(c, nodeB, pkgLabels(record.LabelState, "success")) }},
		{"the desired config label", func() error { return pkgMergePatch(c, nodeA, pkgLabels(record.LabelConfig, "all-disabled")) }},
		{"another label", func() error { return pkgMergePatch(c, nodeA, pkgLabels("example.com/team", "web")) }},
		{"a new label", func() error { return pkgMergePatch(c, nodeA, pkgLabels("nvidia.com/mig.config.extra", "x")) }},
		{"another annotation", func() error {
			return pkgMergePatch(c, nodeA, map[string]any{"metadata": map[string]any{"annotations": map[string]any{"example.com/owner": "me"}}})
		}},
		{"its taint as NoExecute", func() error {
			return pkgUpdate(c, nodeA, func(n *corev1.Node) {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: drain.TaintKey, Value: "true", Effect: corev1.TaintEffectNoExecute})
			})
		}},
		{"another taint", func() error {
			return pkgUpdate(c, nodeA, func(n *corev1.Node) {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "example.com/x", Effect: corev1.TaintEffectNoSchedule})
			})
		}},
		{"cordon", func() error { return pkgUpdate(c, nodeA, func(n *corev1.Node) { n.Spec.Unschedulable = true }) }},
		{"the node's status", func() error {
			n, err := c.CoreV1().Nodes().Get(context.Background(), nodeA, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Status.Capacity = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}
			_, err = c.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
			return err
		}},
	}
	operandChange := struct {
		name string
		do   func() error
	}{"an operand pause label", func() error { return pkgMergePatch(c, nodeA, pkgLabels(operand, drain.PausedValue)) }}
	if in.pauseGpuOperator {
		allowed = append(allowed, operandChange)
	} else {
		denied = append(denied, operandChange)
	}
	// A startup taint: the agent may remove it, never add it; another taint
	// stays out of reach. Without startup taints, neither.
	startup := corev1.Taint{Key: "migagent.io/geometry-pending", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	if err := pkgUpdate(admin, nodeA, func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, startup) }); err != nil {
		t.Fatal(err)
	}
	removeStartup := struct {
		name string
		do   func() error
	}{"a startup taint removed", func() error {
		return pkgUpdate(c, nodeA, func(n *corev1.Node) {
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t == startup })
		})
	}}
	denied = append(denied, struct {
		name string
		do   func() error
	}{"a startup taint added", func() error {
		return pkgUpdate(c, nodeA, func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: startup.Key, Value: "again", Effect: corev1.TaintEffectPreferNoSchedule})
		})
	}})
	if slices.Contains(in.startupTaintKeys, startup.Key) {
		allowed = append(allowed, removeStartup)
	} else {
		denied = append(denied, removeStartup)
	}
	for _, tc := range allowed {
		if err := tc.do(); err != nil {
			t.Errorf("allowed: %s: %v", tc.name, err)
		}
	}
	for _, tc := range denied {
		if err := tc.do(); !apierrors.IsForbidden(err) {
			t.Errorf("denied: %s: got %v, want Forbidden", tc.name, err)
		} else if !pkgDeniedByPolicy(err, in.policy) && !strings.Contains(err.Error(), "cannot") {
			t.Errorf("denied: %s: refused, but neither by the policy nor by RBAC: %v", tc.name, err)
		} else {
			t.Logf("denied: %s: %v", tc.name, err)
		}
	}

	// Refused whoever refuses it (RBAC or the policy).
	for name, do := range map[string]func() error{
		"delete a node": func() error { return c.CoreV1().Nodes().Delete(context.Background(), nodeA, metav1.DeleteOptions{}) },
		"create a node": func() error {
			_, err := c.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeA + "-x"}}, metav1.CreateOptions{})
			return err
		},
		"list secrets in its namespace": func() error {
			_, err := c.CoreV1().Secrets(in.namespace).List(context.Background(), metav1.ListOptions{})
			return err
		},
		"read a secret in kube-system": func() error {
			_, err := c.CoreV1().Secrets("kube-system").Get(context.Background(), "any", metav1.GetOptions{})
			return err
		},
		"list secrets of the cluster": func() error {
			_, err := c.CoreV1().Secrets("").List(context.Background(), metav1.ListOptions{})
			return err
		},
	} {
		if err := do(); !apierrors.IsForbidden(err) {
			t.Errorf("denied: %s: got %v, want Forbidden", name, err)
		} else {
			t.Logf("denied: %s: %v", name, err)
		}
	}

	// What RBAC refuses today the policy refuses too, should someone grant
	// more: with the rights to create, delete and update status granted,
	// the policy still refuses.
	pkgGrant(t, in, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"create", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"update", "patch"}},
	})
	WaitFor(t, policyTimeout, "the extra grant to apply", func() bool {
		err := c.CoreV1().Nodes().Delete(context.Background(), nodeA, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil || pkgDeniedByPolicy(err, in.policy)
	})
	for name, do := range map[string]func() error{
		"delete a node (granted)": func() error { return c.CoreV1().Nodes().Delete(context.Background(), nodeA, metav1.DeleteOptions{}) },
		"create a node (granted)": func() error {
			_, err := c.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeA + "-x"}}, metav1.CreateOptions{})
			return err
		},
		"its own node's status (granted)": func() error {
			_, err := c.CoreV1().Nodes().PatchStatus(context.Background(), nodeA, []byte(`{"status":{"capacity":{"nvidia.com/gpu":"8"}}}`))
			return err
		},
	} {
		if err := do(); !pkgDeniedByPolicy(err, in.policy) {
			t.Errorf("denied by the policy: %s: got %v", name, err)
		} else {
			t.Logf("denied: %s: %v", name, err)
		}
	}

	// A host install (the .deb/.rpm in Kubernetes mode) has no pod: a token
	// bound to the Node object names the node too (docs/install.md).
	nodeObj := GetNode(t, admin, nodeA)
	tr, err := admin.CoreV1().ServiceAccounts(in.namespace).CreateToken(context.Background(), in.sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: nodeA, UID: nodeObj.UID}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node-bound token: %v", err)
	}
	host := pkgTokenClient(t, tr.Status.Token)
	if err := pkgMergePatch(host, nodeA, pkgLabels(record.LabelState, record.StateSuccess)); err != nil {
		t.Errorf("a token bound to node A cannot set A's state: %v", err)
	}
	if err := pkgMergePatch(host, nodeB, pkgLabels(record.LabelState, record.StateSuccess)); !pkgDeniedByPolicy(err, in.policy) {
		t.Errorf("a token bound to node A changed node B: %v", err)
	}

	// A token that is not bound to a pod or node names no node: no Node changes.
	plain := pkgTokenClient(t, kubetest.ServiceAccountToken(t, in.namespace, in.sa, nil))
	if err := pkgMergePatch(plain, nodeA, pkgLabels(record.LabelState, "success")); !pkgDeniedByPolicy(err, in.policy) {
		t.Errorf("a token bound to no pod changed node A: %v", err)
	}

	// Nothing denied took effect.
	n := GetNode(t, admin, nodeA)
	if n.Labels[record.LabelConfig] != "all-balanced" || n.Labels["example.com/team"] != "ml" || n.Annotations["example.com/owner"] != "ops" ||
		n.Spec.Unschedulable || len(slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(t corev1.Taint) bool { return t == startup })) > 1 ||
		slices.Contains(n.Spec.Taints, startup) == slices.Contains(in.startupTaintKeys, startup.Key) {
		t.Errorf("node A after the denied requests: labels %v, annotations %v, spec %+v", n.Labels, n.Annotations, n.Spec)
	}
	if b := GetNode(t, admin, nodeB); b.Labels[record.LabelState] != "" {
		t.Errorf("node B's state label is %q", b.Labels[record.LabelState])
	}
}

// pkgGrant gives the install's ServiceAccount more rights until the test
// ends.
func pkgGrant(t *testing.T, in *pkgInstall, rules []rbacv1.PolicyRule) {
	t.Helper()
	c := kubetest.Client(t)
	name := kubetest.NewName(t, "grant")
	ctx := context.Background()
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: in.namespace, Name: in.sa}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = c.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// pkgRunAgent runs the real binary as the DaemonSet would: its args and
// env (the downward API filled in), its settings ConfigMap as the files
// under /etc/mig-agent, and a token bound to a pod on the node; flags
// appended after them (later flags win) swap what a test machine lacks:
// the simulator for NVML, no PodResources socket, no reboots, temporary
// state. With config "" the node gets no label and the settings'
// default-config must apply.
func pkgRunAgent(t *testing.T, in *pkgInstall, config string) {
	admin := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/gpu.present": "true", drain.Operands()[0].Label: "true"})
	a, settings := pkgStartAgent(t, in, node, "--nvml", "sim:h200x1")

	want := config
	if config == "" {
		want, _ = settings["default-config"].(string)
		if want == "" {
			t.Fatal("no config to select and no default-config in the settings")
		}
	} else {
		SelectConfig(t, admin, node, config)
	}
	rec := WaitState(t, admin, node, record.StateSuccess, want, changeTimeout)
	if len(rec.GPUsChanged) != 1 {
		t.Errorf("record: %+v", rec)
	}
	if strings.Contains(strings.ToLower(a.Log()), "forbidden") {
		t.Errorf("the agent was refused something:\n%s", a.Log())
	}
	n := GetNode(t, admin, node)
	if n.Labels[drain.Operands()[0].Label] != "true" || len(n.Spec.Taints) > 1 {
		t.Errorf("after the change: labels %v, taints %v", n.Labels, n.Spec.Taints)
	}
	if _, err := admin.CoreV1().ConfigMaps(in.namespace).Get(context.Background(), node+"-mig-config", metav1.GetOptions{}); err != nil {
		t.Errorf("the agent's ConfigMap: %v", err)
	}
	if p, _ := settings["pause-gpu-operator"].(bool); p && !strings.Contains(a.Log(), "operands paused") {
		t.Errorf("pause-gpu-operator is set, but the agent paused no operand:\n%s", a.Log())
	}
}

// pkgStartAgent starts the real binary for node as the DaemonSet would
// (see pkgRunAgent), flags in extra appended last, waits until its probes
// answer and returns it with the install's settings.
func pkgStartAgent(t *testing.T, in *pkgInstall, node string, extra ...string) (*Agent, map[string]any) {
	t.Helper()
	token := pkgBoundToken(t, in, node)

	dir := t.TempDir()
	// The ConfigMap, mounted at /etc/mig-agent.
	etc := filepath.Join(dir, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	data, _, _ := unstructured.NestedStringMap(in.config.Object, "data")
	mount := func(s string) string { return strings.ReplaceAll(s, "/etc/mig-agent/", etc+"/") }
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(etc, k), []byte(mount(v)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var settings map[string]any
	if err := yaml.Unmarshal([]byte(data["settings.yaml"]), &settings); err != nil {
		t.Fatalf("the settings of %s: %v", in.config.GetName(), err)
	}

	// A kubeconfig with the bound token, as in-cluster config would give.
	cfg := pkgTokenConfig(t, token)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	if cfg.CAFile != "" {
		kc.Clusters["c"].CertificateAuthority = cfg.CAFile
	}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "agent"}
	kc.CurrentContext = "c"
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}

	containers, _, _ := unstructured.NestedSlice(in.daemonSet.Object, "spec", "template", "spec", "containers")
	ctr := containers[0].(map[string]any)
	env := map[string]string{}
	for _, e := range ctr["env"].([]any) {
		e := e.(map[string]any)
		name := e["name"].(string)
		switch path, _, _ := unstructured.NestedString(e, "valueFrom", "fieldRef", "fieldPath"); path {
		case "spec.nodeName":
			env[name] = node
		case "metadata.namespace":
			env[name] = in.namespace
		case "":
			env[name], _ = e["value"].(string)
		default:
			t.Fatalf("env %s from %s: not emulated here", name, path)
		}
	}
	if env["NODE_NAME"] != node || env["POD_NAMESPACE"] != in.namespace {
		t.Errorf("the DaemonSet does not pass NODE_NAME and POD_NAMESPACE from the downward API: %v", env)
	}
	var args []string
	expand := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, a := range ctr["args"].([]any) {
		a := expand.ReplaceAllStringFunc(a.(string), func(m string) string { return env[m[2:len(m)-1]] })
		args = append(args, mount(a))
	}
	if len(args) == 0 || args[0] != "run" {
		t.Fatalf("the DaemonSet's args do not start with run: %v", args)
	}
	port := freePort(t)
	args = append(args, "--kubeconfig", kubeconfig, "--sim-state", filepath.Join(dir, "sim.json"),
		"--state-dir", filepath.Join(dir, "state"), "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port),
		"--pod-resources-socket", filepath.Join(dir, "no-kubelet.sock"), "--reboot-method", "none",
		"--resource-wait-timeout", "0", "--drift-interval", "1s")
	args = append(args, extra...)
	a := startProcess(t, args, fmt.Sprintf("http://127.0.0.1:%d", port))

	// The probes of the DaemonSet answer.
	for _, probe := range []string{"livenessProbe", "readinessProbe"} {
		path, _, _ := unstructured.NestedString(ctr, probe, "httpGet", "path")
		WaitFor(t, 30*time.Second, probe+" "+path, func() bool {
			resp, err := http.Get(a.Metrics + path)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}

	return a, settings
}
