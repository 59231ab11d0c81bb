package kclient

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// ListFunc lists one resource, WatchFunc watches it (a typed client's List
// and Watch, with the agent's selectors applied).
type (
	ListFunc  func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error)
	WatchFunc func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
)

// NewInformer is a shared informer on the objects that list and watch
// return, each like example, built as client-go's informer factory builds
// one (informers/core/v1/node.go, NewTypedNodeInformerWithOptions): no
// resync, no indexers, and the watch-list protocol unless client (the
// Interface in use) says it does not support it, as a fake clientset does.
// The caller runs it (RunWithContext) and stops it with the context.
func NewInformer(client any, example runtime.Object, list ListFunc, watch WatchFunc) cache.SharedIndexInformer {
	lw := &cache.ListWatch{ListWithContextFunc: cache.ListWithContextFunc(list),
		WatchFuncWithContext: cache.WatchFuncWithContext(watch)}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client),
		example, cache.SharedIndexInformerOptions{})
}
