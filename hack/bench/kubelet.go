package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"
)

// kubelet plays the kubelet of one node for the benchmark: PodResources
// over gRPC on a unix socket, and pods that get a deletionTimestamp
// (evicted) are finished at once and counted.
type kubelet struct {
	client kubernetes.Interface
	node   string
	socket string
	srv    *grpc.Server
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	devices  map[string]map[string][]string // "ns/name" → resource → device ids
	finished []string

	podresourcesv1.UnimplementedPodResourcesListerServer
}

func startKubelet(client kubernetes.Interface, node string) (*kubelet, error) {
	dir, err := os.MkdirTemp("", "bench-kubelet-")
	if err != nil {
		return nil, err
	}
	k := &kubelet{client: client, node: node, socket: filepath.Join(dir, "kubelet.sock"),
		devices: map[string]map[string][]string{}, done: make(chan struct{})}
	lis, err := net.Listen("unix", k.socket)
	if err != nil {
		return nil, err
	}
	k.srv = grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(k.srv, k)
	go func() { _ = k.srv.Serve(lis) }()
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	go k.finishLoop(ctx)
	return k, nil
}

func (k *kubelet) stop() {
	k.cancel()
	k.srv.Stop()
	<-k.done
	_ = os.RemoveAll(filepath.Dir(k.socket))
}

// List implements the PodResources v1 List call.
func (k *kubelet) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for key, res := range k.devices {
		ns, name, _ := cutKey(key)
		c := &podresourcesv1.ContainerResources{Name: "main"}
		for r, ids := range res {
			c.Devices = append(c.Devices, &podresourcesv1.ContainerDevices{ResourceName: r, DeviceIds: ids})
		}
		resp.PodResources = append(resp.PodResources, &podresourcesv1.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesv1.ContainerResources{c}})
	}
	return resp, nil
}

// GetAllocatableResources implements the PodResources v1 call.
func (k *kubelet) GetAllocatableResources(context.Context, *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	return &podresourcesv1.AllocatableResourcesResponse{}, nil
}

func cutKey(key string) (string, string, bool) {
	for i := range key {
		if key[i] == '/' {
			return key[:i], key[i+1:], true
		}
	}
	return "", key, false
}

// runPod creates a Running pod bound to the node that holds device of resource.
func (k *kubelet) runPod(ctx context.Context, ns, name, res, device string) error {
	q := resource.MustParse("1")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{NodeName: k.node, Containers: []corev1.Container{{
			Name: "main", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceName(res): q}, Limits: corev1.ResourceList{corev1.ResourceName(res): q}},
		}}},
	}
	created, err := k.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now()
	created.Status.Phase = corev1.PodRunning
	created.Status.StartTime = &now
	for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		created.Status.Conditions = append(created.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	created.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Image: "registry.k8s.io/pause:3.10", Ready: true, Started: ptr.To(true),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	if _, err := k.client.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	k.mu.Lock()
	k.devices[ns+"/"+name] = map[string][]string{res: {device}}
	k.mu.Unlock()
	return nil
}

// evicted lists the pods finished after an eviction.
func (k *kubelet) evicted() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.finished...)
}

func (k *kubelet) finishLoop(ctx context.Context) {
	defer close(k.done)
	sel := fields.OneTermEqualSelector("spec.nodeName", k.node).String()
	for ctx.Err() == nil {
		w, err := k.client.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			continue
		}
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) || p.DeletionTimestamp == nil {
				continue
			}
			err := k.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			if err != nil && !apierrors.IsNotFound(err) {
				continue
			}
			key := p.Namespace + "/" + p.Name
			k.mu.Lock()
			if _, held := k.devices[key]; held {
				delete(k.devices, key)
				k.finished = append(k.finished, key)
			}
			k.mu.Unlock()
		}
	}
}
