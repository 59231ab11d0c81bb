package kubetest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"
)

// PodContainer is the name of the one container of pods made by RunPod.
const PodContainer = "main"

// TB is what the kubelet stand-in needs of its caller: *testing.T and
// *testing.B have it, and so can a program that runs the stand-in outside a
// test (hack/demo).
type TB interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Failed() bool
}

var _ TB = testing.TB(nil)

// Kubelet plays the kubelet of one node in tests:
//   - it serves the kubelet PodResources v1 gRPC API (List, Get,
//     GetAllocatableResources) on a unix socket, reporting what Assign and
//     RunPod registered;
//   - it finishes pods of its node that got a deletionTimestamp (evicted or
//     deleted) by deleting them with grace period 0, as a kubelet does once
//     the containers stopped, and drops them from PodResources;
//   - it sets pod status (MarkRunning) and node allocatable (SetAllocatable)
//     when asked.
type Kubelet struct {
	t      TB
	client kubernetes.Interface
	node   string
	socket string

	mu          sync.Mutex
	pods        map[types.NamespacedName]map[string]map[string][]string // pod → container → resource → ids
	allocatable map[string][]string                                     // resource → ids
	keep        map[types.UID]bool                                      // left Terminating
	claims      map[types.NamespacedName]map[string][]preparedClaim     // pod → container → claims (DRA)
	finished    []string
	listCalls   int

	podresourcesv1.UnimplementedPodResourcesListerServer
}

var _ podresourcesv1.PodResourcesListerServer = (*Kubelet)(nil)

// StartKubelet starts playing the kubelet of node until the test ends.
func StartKubelet(t TB, client kubernetes.Interface, node string) *Kubelet {
	t.Helper()
	// A short directory: unix socket paths are limited to 108 bytes, and
	// t.TempDir() grows with the test's name.
	dir, err := os.MkdirTemp("", "kubelet-")
	if err != nil {
		t.Fatalf("StartKubelet: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	k := &Kubelet{
		t: t, client: client, node: node, socket: filepath.Join(dir, "kubelet.sock"),
		pods:        map[types.NamespacedName]map[string]map[string][]string{},
		allocatable: map[string][]string{},
		keep:        map[types.UID]bool{},
		claims:      map[types.NamespacedName]map[string][]preparedClaim{},
	}
	lis, err := net.Listen("unix", k.socket)
	if err != nil {
		t.Fatalf("StartKubelet: listen on %s: %v", k.socket, err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, k)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	finisher := make(chan struct{})
	go func() {
		defer close(finisher)
		k.finishLoop(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		srv.Stop()
		<-served
		<-finisher
	})
	return k
}

// Socket is the path of the PodResources socket.
func (k *Kubelet) Socket() string { return k.socket }

// Node is the node this kubelet plays.
func (k *Kubelet) Node() string { return k.node }

// Assign records that container of pod holds these devices of resource, as
// PodResources reports them.
func (k *Kubelet) Assign(pod *corev1.Pod, container, resource string, deviceIDs ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	if k.pods[key] == nil {
		k.pods[key] = map[string]map[string][]string{}
	}
	if k.pods[key][container] == nil {
		k.pods[key][container] = map[string][]string{}
	}
	k.pods[key][container][resource] = append(k.pods[key][container][resource], deviceIDs...)
}

// SetAllocatableDevices sets what GetAllocatableResources reports for resource.
func (k *Kubelet) SetAllocatableDevices(resource string, deviceIDs ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.allocatable[resource] = slices.Clone(deviceIDs)
}

// KeepTerminating makes the kubelet leave pod Terminating once it is evicted
// or deleted, like a process that ignores SIGTERM during a long grace period.
func (k *Kubelet) KeepTerminating(pod *corev1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keep[pod.UID] = true
}

// Finished lists the pods ("namespace/name") the kubelet finished, in order.
func (k *Kubelet) Finished() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.finished)
}

// ListCalls counts the List calls served.
func (k *Kubelet) ListCalls() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.listCalls
}

// RunPod creates pod ns/name bound to the node with one container
// (PodContainer) requesting resources (name → quantity, as requests and
// limits), owned by owner when given, marks it Running and Ready, and
// registers devices (resource → device ids) in PodResources. The pod is
// force-deleted when the test ends.
func (k *Kubelet) RunPod(t TB, ns, name string, resources map[string]string, devices map[string][]string,
	owner *metav1.OwnerReference) *corev1.Pod {
	t.Helper()
	rl := corev1.ResourceList{}
	for r, q := range resources {
		qty, err := resource.ParseQuantity(q)
		if err != nil {
			t.Fatalf("RunPod: quantity %s=%q: %v", r, q, err)
		}
		rl[corev1.ResourceName(r)] = qty
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: PodContainer, Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Requests: rl, Limits: rl},
			}},
		},
	}
	if owner != nil {
		pod.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	created := k.CreatePod(t, pod)
	for r, ids := range devices {
		k.Assign(created, PodContainer, r, ids...)
	}
	return created
}

// CreatePod creates pod bound to the node (spec.nodeName is set), registers
// its containers in PodResources (with no devices; see Assign), and marks it
// Running and Ready. The pod is force-deleted when the test ends.
func (k *Kubelet) CreatePod(t TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	pod = pod.DeepCopy()
	pod.Spec.NodeName = k.node
	ns, name := pod.Namespace, pod.Name
	created, err := k.client.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		err := k.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &created.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			t.Logf("cleanup: delete pod %s/%s: %v", ns, name, err)
		}
	})
	k.mu.Lock()
	key := types.NamespacedName{Namespace: ns, Name: name}
	if k.pods[key] == nil {
		k.pods[key] = map[string]map[string][]string{}
	}
	for _, c := range created.Spec.Containers {
		if k.pods[key][c.Name] == nil {
			k.pods[key][c.Name] = map[string][]string{}
		}
	}
	k.mu.Unlock()
	return k.MarkRunning(t, created)
}

// MarkRunning sets pod's status to Running with every container ready, as the
// kubelet does once the containers started. The API server applies
// PodDisruptionBudgets only to such pods.
func (k *Kubelet) MarkRunning(t TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	var out *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := k.client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		p.Status.Phase = corev1.PodRunning
		p.Status.StartTime = &now
		p.Status.Conditions = nil
		for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
		}
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, Ready: true, Started: ptr.To(true),
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			})
		}
		out, err = k.client.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("MarkRunning %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return out
}

// SetAllocatable sets these resources in the node's capacity and
// allocatable, as the kubelet does for what device plugins advertise; other
// resources are kept (set a quantity of 0 to withdraw one). Errors are
// reported with t.Errorf, so it may run in another goroutine.
func (k *Kubelet) SetAllocatable(res corev1.ResourceList) {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := k.client.CoreV1().Nodes().Get(context.Background(), k.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Status.Capacity == nil {
			n.Status.Capacity = corev1.ResourceList{}
		}
		if n.Status.Allocatable == nil {
			n.Status.Allocatable = corev1.ResourceList{}
		}
		for r, q := range res {
			n.Status.Capacity[r] = q
			n.Status.Allocatable[r] = q
		}
		_, err = k.client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		k.t.Errorf("SetAllocatable on %s: %v", k.node, err)
	}
}

// List implements the PodResources v1 List call.
func (k *Kubelet) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.listCalls++
	keys := make([]types.NamespacedName, 0, len(k.pods))
	for key := range k.pods {
		keys = append(keys, key)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for _, key := range keys {
		resp.PodResources = append(resp.PodResources, k.podResources(key))
	}
	return resp, nil
}

// Get implements the PodResources v1 Get call.
func (k *Kubelet) Get(_ context.Context, req *podresourcesv1.GetPodResourcesRequest) (*podresourcesv1.GetPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := types.NamespacedName{Namespace: req.GetPodNamespace(), Name: req.GetPodName()}
	if _, ok := k.pods[key]; !ok {
		return nil, status.Errorf(codes.NotFound, "pod %s in namespace %s not found", key.Name, key.Namespace)
	}
	return &podresourcesv1.GetPodResourcesResponse{PodResources: k.podResources(key)}, nil
}

// GetAllocatableResources implements the PodResources v1 call.
func (k *Kubelet) GetAllocatableResources(context.Context, *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return &podresourcesv1.AllocatableResourcesResponse{Devices: devicesOf(k.allocatable)}, nil
}

// podResources builds a fresh message (proto messages must not be shared).
func (k *Kubelet) podResources(key types.NamespacedName) *podresourcesv1.PodResources {
	pr := &podresourcesv1.PodResources{Namespace: key.Namespace, Name: key.Name}
	containers := make([]string, 0, len(k.pods[key]))
	for c := range k.pods[key] {
		containers = append(containers, c)
	}
	sort.Strings(containers)
	for _, c := range containers {
		pr.Containers = append(pr.Containers, &podresourcesv1.ContainerResources{Name: c, Devices: devicesOf(k.pods[key][c]),
			DynamicResources: dynamicResourcesOf(k.claims[key][c])})
	}
	return pr
}

func devicesOf(m map[string][]string) []*podresourcesv1.ContainerDevices {
	names := make([]string, 0, len(m))
	for r := range m {
		names = append(names, r)
	}
	sort.Strings(names)
	out := make([]*podresourcesv1.ContainerDevices, 0, len(names))
	for _, r := range names {
		out = append(out, &podresourcesv1.ContainerDevices{ResourceName: r, DeviceIds: slices.Clone(m[r])})
	}
	return out
}

// finishLoop watches the node's pods and finishes those being deleted. It
// survives API server restarts by listing and watching again.
func (k *Kubelet) finishLoop(ctx context.Context) {
	sel := fields.OneTermEqualSelector("spec.nodeName", k.node).String()
	for ctx.Err() == nil {
		if err := k.finishOnce(ctx, sel); err != nil && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

func (k *Kubelet) finishOnce(ctx context.Context, sel string) error {
	return watchPods(ctx, k.client, metav1.NamespaceAll, metav1.ListOptions{FieldSelector: sel}, func(p *corev1.Pod, deleted bool) {
		if deleted {
			k.forget(p)
		} else {
			k.maybeFinish(ctx, p)
		}
	})
}

func (k *Kubelet) maybeFinish(ctx context.Context, p *corev1.Pod) {
	if p.DeletionTimestamp == nil {
		return
	}
	k.mu.Lock()
	keep := k.keep[p.UID]
	k.mu.Unlock()
	if keep {
		return
	}
	err := k.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      &metav1.Preconditions{UID: &p.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		if ctx.Err() == nil {
			k.t.Logf("kubelet %s: finishing pod %s/%s: %v", k.node, p.Namespace, p.Name, err)
		}
		return
	}
	k.forget(p)
}

func (k *Kubelet) forget(p *corev1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	delete(k.pods, key)
	delete(k.claims, key)
	name := key.String()
	if !slices.Contains(k.finished, name) && p.DeletionTimestamp != nil {
		k.finished = append(k.finished, name)
	}
}
