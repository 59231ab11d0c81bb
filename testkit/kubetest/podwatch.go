package kubetest

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// watchPods lists the pods of ns that opts selects, hands each to on, then
// watches them from the list's resourceVersion and hands on every pod an
// event names (deleted: the event is a deletion). It returns when ctx ends
// or the watch does (an error either way): the callers' loops list again.
// The stand-ins' kubelets and the device plugin's DaemonSet play act on
// pods this way, as an informer's list-and-watch does.
func watchPods(ctx context.Context, c kubernetes.Interface, ns string, opts metav1.ListOptions, on func(pod *corev1.Pod, deleted bool)) error {
	list, err := c.CoreV1().Pods(ns).List(ctx, opts)
	if err != nil {
		return err
	}
	for i := range list.Items {
		on(&list.Items[i], false)
	}
	opts.ResourceVersion = list.ResourceVersion
	w, err := c.CoreV1().Pods(ns).Watch(ctx, opts)
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return errors.New("watch closed")
			}
			if ev.Type == watch.Error {
				return apierrors.FromObject(ev.Object)
			}
			if pod, isPod := ev.Object.(*corev1.Pod); isPod {
				on(pod, ev.Type == watch.Deleted)
			}
		}
	}
}
