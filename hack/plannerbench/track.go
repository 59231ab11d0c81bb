package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/record"
)

// tracker watches one pod and one node and notes when each step showed.
type tracker struct {
	c         kubernetes.Interface
	node, pod string

	mu sync.Mutex
	t  steps
}

// steps are the times the watches saw each step (zero: not yet).
type steps struct {
	unschedulable time.Time // PodScheduled=False, Unschedulable
	label         time.Time // nvidia.com/mig.config set on the node
	success       time.Time // the agent's state success for that label
	bound         time.Time // spec.nodeName set
}

func (tr *tracker) times() steps {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.t
}

func (tr *tracker) bound() bool { return !tr.times().bound.IsZero() }

func (tr *tracker) String() string {
	t := tr.times()
	return fmt.Sprintf("unschedulable %v, label %v, success %v, bound %v", !t.unschedulable.IsZero(), !t.label.IsZero(),
		!t.success.IsZero(), !t.bound.IsZero())
}

// watch starts the two watches; the returned func stops them.
func (tr *tracker) watch(ctx context.Context) func() {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		tr.loop(ctx, func(opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = fields.OneTermEqualSelector("metadata.name", tr.pod).String()
			return tr.c.CoreV1().Pods(podNS).Watch(ctx, opts)
		}, tr.sawPod)
	}()
	go func() {
		defer wg.Done()
		tr.loop(ctx, func(opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = fields.OneTermEqualSelector("metadata.name", tr.node).String()
			return tr.c.CoreV1().Nodes().Watch(ctx, opts)
		}, tr.sawNode)
	}()
	// Both watches open before the pod is created.
	time.Sleep(200 * time.Millisecond)
	return func() { cancel(); wg.Wait() }
}

// loop re-opens a watch until ctx ends, handing each object to saw.
func (tr *tracker) loop(ctx context.Context, open func(metav1.ListOptions) (watch.Interface, error), saw func(any, time.Time)) {
	for ctx.Err() == nil {
		w, err := open(metav1.ListOptions{})
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			saw(ev.Object, time.Now())
		}
		w.Stop()
	}
}

func (tr *tracker) sawPod(obj any, now time.Time) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable && tr.t.unschedulable.IsZero() {
			tr.t.unschedulable = now
		}
	}
	if p.Spec.NodeName != "" && tr.t.bound.IsZero() {
		tr.t.bound = now
	}
}

func (tr *tracker) sawNode(obj any, now time.Time) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	want := n.Labels[record.LabelConfig]
	if want != "" && tr.t.label.IsZero() {
		tr.t.label = now
	}
	if want != "" && n.Labels[record.LabelState] == record.StateSuccess && tr.t.success.IsZero() {
		if r, err := record.Decode([]byte(n.Annotations[record.AnnotationLastChange])); err == nil && r.Config == want {
			tr.t.success = now
		}
	}
}
