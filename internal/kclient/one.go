package kclient

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// Resource lists and watches one resource: a typed client of client-go
// (CoreV1().Nodes(), CoordinationV1().Leases(ns), ...), L its list type.
type Resource[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Selector is what an informer lists and watches of a resource: the
// field and label selectors of its ListOptions ("": all).
type Selector struct{ Field, Label string }

// ByName selects the one object named name: a field selector on
// metadata.name, which the API server serves for every resource.
func ByName(name string) Selector {
	return Selector{Field: fields.OneTermEqualSelector("metadata.name", name).String()}
}

// Watch is an informer (NewInformer) on the objects of res that sel
// selects, each like example; client is the Interface in use. The caller
// adds its handlers, then runs it (Start).
func Watch[L runtime.Object](client any, example runtime.Object, res Resource[L], sel Selector) cache.SharedIndexInformer {
	with := func(o metav1.ListOptions) metav1.ListOptions {
		o.FieldSelector, o.LabelSelector = sel.Field, sel.Label
		return o
	}
	return NewInformer(client, example,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return res.List(ctx, with(o)) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return res.Watch(ctx, with(o))
		})
}

// Start runs inf until ctx ends; the channel closes once it stopped.
func Start(ctx context.Context, inf cache.SharedIndexInformer) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		inf.RunWithContext(ctx)
	}()
	return done
}

// Synced waits until inf's store holds its first list; false when ctx
// ended first.
func Synced(ctx context.Context, inf cache.SharedIndexInformer) bool {
	return cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
}
