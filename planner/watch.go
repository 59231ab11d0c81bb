package planner

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/migagent/mig-agent/internal/kclient"
)

// MinRoundGap is the least time between two rounds pod events start (the
// first round and those of the interval do not count):
// a burst of pods marked unschedulable is planned in one round, and a
// tenant who makes pods unschedulable without end costs the planner at
// most one round (1 + 3 requests per opted-in node) per MinRoundGap. A
// pod marked so on a quiet planner is planned at once.
const MinRoundGap = 500 * time.Millisecond

// Run plans a round at once, then as soon as the watch of unbound pods
// sees one marked unschedulable (PodScheduled=False, Unschedulable: a
// pending pod is planned for within MinRoundGap plus a round of it being
// so marked, not at the next tick), and every Interval for what no pod
// event says (an agent done, a hold time passed). The rounds read the
// pending pods from the watch's store once it holds them, before (or
// where the planner may not watch pods: an older RBAC) with a list.
func (p *Planner) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := make(chan struct{}, 1)
	inf := kclient.Watch(p.Client, &corev1.Pod{}, p.Client.CoreV1().Pods(metav1.NamespaceAll), kclient.Selector{Field: "spec.nodeName="})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if pod, ok := obj.(*corev1.Pod); ok && becameUnschedulable(nil, pod) {
				poke(wake)
			}
		},
		UpdateFunc: func(old, obj any) {
			o, _ := old.(*corev1.Pod)
			if pod, ok := obj.(*corev1.Pod); ok && becameUnschedulable(o, pod) {
				poke(wake)
			}
		},
	}); err != nil {
		return err
	}
	done := kclient.Start(ctx, inf)
	defer func() { cancel(); <-done }()
	p.watch = inf
	var lastWoken time.Time // the last round a pod event started
	woken := false
	warned, began := false, p.Clock.Now()
	for {
		if !warned && !inf.HasSynced() && p.Clock.Since(began) > time.Minute {
			warned = true
			p.Log.Warn("planner: the watch of unbound pods has not synced (may it watch pods?); listing them each round")
		}
		if wait := MinRoundGap - p.Clock.Since(lastWoken); woken && !lastWoken.IsZero() && wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-p.Clock.After(wait):
			}
		}
		if woken {
			lastWoken = p.Clock.Now()
		}
		if _, err := p.Round(ctx); err != nil && ctx.Err() == nil {
			p.Log.Warn("planner round failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			woken = true
		case <-p.Clock.After(p.Interval):
			woken = false
		}
	}
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// becameUnschedulable: pod is marked unschedulable now, and was not (or
// since another time) in old (nil: a pod first seen), and asks for
// something the planner serves (MIG limits or ResourceClaims).
func becameUnschedulable(old, pod *corev1.Pod) bool {
	since, ok := unschedulableSince(pod)
	if !ok || len(MigWants(pod)) == 0 && len(pod.Spec.ResourceClaims) == 0 {
		return false
	}
	if old == nil {
		return true
	}
	was, ok := unschedulableSince(old)
	return !ok || !was.Equal(since)
}

// unboundPods are the pods without a node: from the watch's store where
// Run keeps one, else listed.
func (p *Planner) unboundPods(ctx context.Context) ([]*corev1.Pod, error) {
	if p.watch != nil && p.watch.HasSynced() {
		objs := p.watch.GetStore().List()
		out := make([]*corev1.Pod, 0, len(objs))
		for _, o := range objs {
			if pod, ok := o.(*corev1.Pod); ok {
				out = append(out, pod)
			}
		}
		return out, nil
	}
	return listUnbound(ctx, p.Client)
}
