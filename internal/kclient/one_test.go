package kclient_test

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// TestWatchByName: an informer on one Node by name holds that Node only,
// sees its changes, and not another Node's; Start's channel closes once
// the informer stopped.
func TestWatchByName(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := newClient(t)
	node, other := kubetest.NewName(t, "node"), kubetest.NewName(t, "other")
	kubetest.CreateNode(t, node, nil)
	kubetest.CreateNode(t, other, nil)
	inf := kclient.Watch(c, &corev1.Node{}, c.CoreV1().Nodes(), kclient.ByName(node))
	updated := make(chan string, 10)
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(_, n any) {
		updated <- n.(*corev1.Node).Name
	}}); err != nil {
		t.Fatal(err)
	}
	done := kclient.Start(ctx, inf)
	if !kclient.Synced(ctx, inf) {
		t.Fatal("no sync")
	}
	if keys := inf.GetStore().ListKeys(); len(keys) != 1 || keys[0] != node {
		t.Fatalf("cache holds %v, want only %s", keys, node)
	}
	for _, n := range []string{other, node} {
		if _, err := c.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case n := <-updated:
		if n != node {
			t.Fatalf("the informer saw an update of %s, want %s", n, node)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the informer did not see the update")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Start's channel did not close after ctx ended")
	}
}

// TestWatchByLabel: a label selector picks the objects of a namespaced
// resource that carry it.
func TestWatchByLabel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := newClient(t)
	ns := kubetest.CreateNamespace(t, kubetest.NewName(t, "ns")).Name
	leases := c.CoordinationV1().Leases(ns)
	for name, labels := range map[string]map[string]string{"picked": {"pick": "yes"}, "left": nil} {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}}
		if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	inf := kclient.Watch(c, &coordinationv1.Lease{}, leases, kclient.Selector{Label: "pick=yes"})
	kclient.Start(ctx, inf)
	if !kclient.Synced(ctx, inf) {
		t.Fatal("no sync")
	}
	if keys := inf.GetStore().ListKeys(); len(keys) != 1 || keys[0] != ns+"/picked" {
		t.Fatalf("cache holds %v, want only %s/picked", keys, ns)
	}
}
