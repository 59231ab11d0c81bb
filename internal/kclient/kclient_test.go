package kclient_test

import (
	"context"
	"os"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/kclient/restclient"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

func newClient(t *testing.T) kclient.Interface {
	t.Helper()
	c, err := restclient.New(kubetest.RestConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestEveryResourceOnARealAPIServer calls each method the agent uses on a
// real kube-apiserver, through the narrow scheme (protobuf where the
// generated clients prefer it).
func TestEveryResourceOnARealAPIServer(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	node := kubetest.NewName(t, "node")
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNode(t, node, map[string]string{"a": "1"})
	kubetest.CreateNamespace(t, ns)

	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil || n.Labels["a"] != "1" {
		t.Fatalf("get node: %v %v", n, err)
	}
	n.Labels["b"] = "2"
	if n, err = c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil || n.Labels["b"] != "2" {
		t.Fatalf("update node: %v %v", n, err)
	}
	n, err = c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"metadata":{"labels":{"c":"3"}}}`), metav1.PatchOptions{})
	if err != nil || n.Labels["b"] != "2" || n.Labels["c"] != "3" {
		t.Fatalf("patch node: %v %v", n.Labels, err)
	}
	list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("list nodes: %v %v", list, err)
	}

	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "slot", Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("me")}}
	if l, err = c.CoordinationV1().Leases(ns).Create(ctx, l, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create lease: %v", err)
	}
	l.Spec.HolderIdentity = ptr.To("you")
	if _, err = c.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update lease: %v", err)
	}
	if _, err = c.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("stale lease update: %v, want a conflict", err)
	}
	if got, err := c.CoordinationV1().Leases(ns).Get(ctx, "slot", metav1.GetOptions{}); err != nil || *got.Spec.HolderIdentity != "you" {
		t.Fatalf("get lease: %v %v", got, err)
	}
	if err := c.CoordinationV1().Leases(ns).Delete(ctx, "slot", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete lease: %v", err)
	}

	cm, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"},
		Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create configmap: %v", err)
	}
	cm.Data["k"] = "w"
	if _, err := c.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update configmap: %v", err)
	}
	if _, err := c.CoreV1().Events(ns).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "ev-"},
		InvolvedObject: corev1.ObjectReference{Kind: "ConfigMap", Namespace: ns, Name: "cm"}, Reason: "Test", Message: "m", Type: corev1.EventTypeNormal},
		metav1.CreateOptions{}); err != nil {
		t.Fatalf("create event: %v", err)
	}
	if _, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("list resourceslices: %v", err)
	}
	if _, err := c.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
		t.Fatalf("readyz: %v", err)
	}
}

func TestEvictAndPods(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	if _, err := kubetest.Client(t).CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.CoreV1().Pods(ns).Get(ctx, "p", metav1.GetOptions{}); err != nil || got.Name != "p" {
		t.Fatalf("get pod: %v %v", got, err)
	}
	err := c.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns}})
	if err != nil {
		t.Fatalf("evict: %v", err)
	}
	// An unscheduled pod is deleted at once by its eviction.
	if _, err := c.CoreV1().Pods(ns).Get(ctx, "p", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("pod after eviction: %v, want not found", err)
	}
	err = c.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns}})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("evicting a gone pod: %v, want not found", err)
	}
}

// TestInformerSeesChanges: NewInformer lists, then watches (watch-list
// where the API server offers it).
func TestInformerSeesChanges(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := newClient(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	sel := fields.OneTermEqualSelector("metadata.name", node).String()
	nodes := c.CoreV1().Nodes()
	inf := kclient.NewInformer(c, &corev1.Node{},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return nodes.List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return nodes.Watch(ctx, o)
		})
	updated := make(chan string, 10)
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(_, n any) {
		updated <- n.(*corev1.Node).Labels["x"]
	}}); err != nil {
		t.Fatal(err)
	}
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("no sync")
	}
	if _, ok, _ := inf.GetStore().GetByKey(node); !ok {
		t.Fatal("node not in the cache")
	}
	if _, err := nodes.Patch(ctx, node, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-updated:
		if v != "y" {
			t.Fatalf("update saw x=%q", v)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the informer did not see the update")
	}
}
