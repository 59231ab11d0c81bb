package kubetest_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/testkit/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

func TestNewName(t *testing.T) {
	dns1123 := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	for _, prefix := range []string{"node", "ns", "", strings.Repeat("p", 40)} {
		a, b := kubetest.NewName(t, prefix), kubetest.NewName(t, prefix)
		if a == b {
			t.Errorf("NewName(%q) twice gave %q", prefix, a)
		}
		if len(a) > 63 || !dns1123.MatchString(a) || !strings.HasPrefix(a, prefix) {
			t.Errorf("NewName(%q) = %q: not a DNS-1123 label with that prefix", prefix, a)
		}
	}
}

func podResourcesClient(t *testing.T, socket string) podresourcesv1.PodResourcesListerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc client: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return podresourcesv1.NewPodResourcesListerClient(conn)
}

// waitGone waits until pod is deleted (by UID).
func waitGone(t *testing.T, c kubernetes.Interface, pod *corev1.Pod, timeout time.Duration) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true,
		func(ctx context.Context) (bool, error) {
			p, err := c.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return err == nil && p.UID != pod.UID, nil
		})
	if err != nil {
		t.Fatalf("pod %s/%s still there after %s: %v", pod.Namespace, pod.Name, timeout, err)
	}
}

func evict(t *testing.T, c kubernetes.Interface, pod *corev1.Pod) {
	t.Helper()
	err := c.PolicyV1().Evictions(pod.Namespace).Evict(context.Background(), &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
	})
	if err != nil {
		t.Fatalf("evict %s/%s: %v", pod.Namespace, pod.Name, err)
	}
}

func TestKubeletPodResourcesAndEviction(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/gpu.present": "true"})
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	k := kubetest.StartKubelet(t, c, node)

	gpuPod := k.RunPod(t, ns, "gpu", map[string]string{"nvidia.com/gpu": "1"},
		map[string][]string{"nvidia.com/gpu": {"GPU-aaaa"}}, nil)
	migPod := k.RunPod(t, ns, "mig", map[string]string{"nvidia.com/mig-1g.18gb": "2"},
		map[string][]string{"nvidia.com/mig-1g.18gb": {"MIG-1111", "MIG-2222"}}, nil)
	if gpuPod.Status.Phase != corev1.PodRunning || gpuPod.Spec.NodeName != node {
		t.Fatalf("RunPod: phase %s node %q, want Running on %s", gpuPod.Status.Phase, gpuPod.Spec.NodeName, node)
	}
	k.SetAllocatableDevices("nvidia.com/gpu", "GPU-aaaa", "GPU-bbbb")

	pr := podResourcesClient(t, k.Socket())
	list, err := pr.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	got := map[string][]string{}
	for _, p := range list.GetPodResources() {
		for _, ctr := range p.GetContainers() {
			for _, d := range ctr.GetDevices() {
				got[p.GetNamespace()+"/"+p.GetName()+"/"+ctr.GetName()+"/"+d.GetResourceName()] = d.GetDeviceIds()
			}
		}
	}
	want := map[string][]string{
		ns + "/gpu/main/nvidia.com/gpu":         {"GPU-aaaa"},
		ns + "/mig/main/nvidia.com/mig-1g.18gb": {"MIG-1111", "MIG-2222"},
	}
	if len(got) != len(want) {
		t.Fatalf("List = %v, want %v", got, want)
	}
	for key, ids := range want {
		if !slices.Equal(got[key], ids) {
			t.Errorf("List[%s] = %v, want %v", key, got[key], ids)
		}
	}
	one, err := pr.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: ns, PodName: "mig"})
	if err != nil || one.GetPodResources().GetName() != "mig" {
		t.Errorf("Get mig = %v, %v", one, err)
	}
	if _, err := pr.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: ns, PodName: "nope"}); err == nil {
		t.Error("Get of an unknown pod: no error")
	}
	alloc, err := pr.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil || len(alloc.GetDevices()) != 1 || len(alloc.GetDevices()[0].GetDeviceIds()) != 2 {
		t.Errorf("GetAllocatableResources = %v, %v", alloc, err)
	}

	// Eviction: the API server marks the pod Terminating; the kubelet finishes it.
	evict(t, c, gpuPod)
	waitGone(t, c, gpuPod, 10*time.Second)
	if f := k.Finished(); !slices.Equal(f, []string{ns + "/gpu"}) {
		t.Errorf("Finished = %v, want [%s/gpu]", f, ns)
	}
	list, err = pr.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil || len(list.GetPodResources()) != 1 || list.GetPodResources()[0].GetName() != "mig" {
		t.Errorf("List after eviction = %v, %v; want only mig", list, err)
	}
	if _, err := c.CoreV1().Pods(ns).Get(ctx, migPod.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the other pod: %v", err)
	}

	// A pod kept Terminating stays.
	k.KeepTerminating(migPod)
	evict(t, c, migPod)
	time.Sleep(500 * time.Millisecond)
	p, err := c.CoreV1().Pods(ns).Get(ctx, migPod.Name, metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp == nil {
		t.Errorf("kept pod: %v, deletionTimestamp %v; want Terminating", err, p.GetDeletionTimestamp())
	}

	// Allocatable.
	k.SetAllocatable(corev1.ResourceList{"nvidia.com/mig-1g.18gb": resource.MustParse("7")})
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := n.Status.Allocatable["nvidia.com/mig-1g.18gb"]; q.Value() != 7 {
		t.Errorf("allocatable = %v, want 7", n.Status.Allocatable)
	}
}

func TestServiceAccountTokenBoundToPod(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	k := kubetest.StartKubelet(t, c, node)
	pod := k.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent"},
		Spec: corev1.PodSpec{
			ServiceAccountName: "mig-agent",
			Containers:         []corev1.Container{{Name: "agent", Image: "mig-agent:test"}},
		},
	})

	token := kubetest.ServiceAccountToken(t, ns, "mig-agent", pod)
	cfg := rest.AnonymousClientConfig(kubetest.RestConfig(t))
	cfg.BearerToken = token
	as, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	review, err := as.AuthenticationV1().SelfSubjectReviews().Create(context.Background(),
		&authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview with the token: %v", err)
	}
	ui := review.Status.UserInfo
	if ui.Username != "system:serviceaccount:"+ns+":mig-agent" {
		t.Errorf("username = %q", ui.Username)
	}
	if got := ui.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != node {
		t.Errorf("node-name claim = %v, want [%s] (extra: %v)", got, node, ui.Extra)
	}
	if got := ui.Extra["authentication.kubernetes.io/pod-name"]; len(got) != 1 || got[0] != "agent" {
		t.Errorf("pod-name claim = %v", got)
	}
}

func TestRestartAPIServer(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	k := kubetest.StartKubelet(t, c, node)

	kubetest.RestartAPIServer(t, time.Second)
	if _, err := c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{}); err != nil {
		t.Fatalf("after restart, the node (kept in etcd): %v", err)
	}
	// The kubelet's watch recovers and still finishes evicted pods.
	pod := k.RunPod(t, ns, "p", nil, nil, nil)
	evict(t, c, pod)
	waitGone(t, c, pod, 15*time.Second)
}

// The server serves the admission policy APIs the project ships, without a
// feature gate or --runtime-config: ValidatingAdmissionPolicy and
// MutatingAdmissionPolicy in admissionregistration.k8s.io/v1 (the latter GA
// and on by default since Kubernetes 1.36).
func TestServesAdmissionPolicies(t *testing.T) {
	c := kubetest.Client(t)
	res, err := c.Discovery().ServerResourcesForGroupVersion("admissionregistration.k8s.io/v1")
	if err != nil {
		t.Fatalf("discovery of admissionregistration.k8s.io/v1: %v", err)
	}
	var names []string
	for _, r := range res.APIResources {
		names = append(names, r.Name)
	}
	for _, want := range []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings",
		"mutatingadmissionpolicies", "mutatingadmissionpolicybindings"} {
		if !slices.Contains(names, want) {
			t.Errorf("admissionregistration.k8s.io/v1 does not serve %s (serves %v)", want, names)
		}
	}
}

// The kubelet stand-in's PodResources dynamic_resources, as the kubelet's
// GetDynamicResources builds them: per container only the claims it names,
// one ClaimResource per device, with the NVIDIA driver's CDI ids (and the
// kubelet's per-driver CDI list, which the second device repeats); a claim
// not reserved for the pod is not prepared.
func TestKubeletDynamicResources(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	k := kubetest.StartKubelet(t, c, node)
	pod := k.CreatePod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Spec: corev1.PodSpec{
		ResourceClaims: []corev1.PodResourceClaim{{Name: "migs", ResourceClaimName: ptr.To("two")}},
		Containers: []corev1.Container{
			{Name: "uses", Image: "registry.k8s.io/pause:3.10", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "migs"}}}},
			{Name: "sidecar", Image: "registry.k8s.io/pause:3.10"},
		}}})
	claim := kubetest.AllocateClaim(t, c, ns, "two", "mig.nvidia.com", pod,
		kubetest.AllocatedDevice{Driver: "gpu.nvidia.com", Pool: node, Device: "gpu-0-mig-1g18gb-19-0"},
		kubetest.AllocatedDevice{Driver: "gpu.nvidia.com", Pool: node, Device: "gpu-0-mig-1g18gb-19-1"})
	k.PrepareClaims(t, pod)
	resp, err := podResourcesClient(t, k.Socket()).Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: ns, PodName: "p"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ctr := range resp.GetPodResources().GetContainers() {
		for _, dr := range ctr.GetDynamicResources() {
			for _, r := range dr.GetClaimResources() {
				var cdi []string
				for _, d := range r.GetCdiDevices() {
					cdi = append(cdi, d.GetName())
				}
				got = append(got, fmt.Sprintf("%s %s/%s %s/%s/%s %v", ctr.GetName(), dr.GetClaimNamespace(), dr.GetClaimName(),
					r.GetDriverName(), r.GetPoolName(), r.GetDeviceName(), cdi))
			}
		}
	}
	cdi0 := "k8s.gpu.nvidia.com/claim=" + string(claim.UID) + "-gpu-0-mig-1g18gb-19-0"
	cdi1 := "k8s.gpu.nvidia.com/claim=" + string(claim.UID) + "-gpu-0-mig-1g18gb-19-1"
	want := []string{
		fmt.Sprintf("uses %s/two gpu.nvidia.com/%s/gpu-0-mig-1g18gb-19-0 [%s]", ns, node, cdi0),
		fmt.Sprintf("uses %s/two gpu.nvidia.com/%s/gpu-0-mig-1g18gb-19-1 [%s %s]", ns, node, cdi0, cdi1),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("dynamic_resources = %q, want %q", got, want)
	}
}

// The device plugin stand-in sees one device per MIG device, named by the
// compute instance where it is smaller than its GPU instance.
func TestPluginGPUsOf(t *testing.T) {
	got, err := kubetest.PluginGPUsOf([]byte(`{"gpus":[{"migMode":{"current":true},"instances":[{"profile":"3g.71gb","start":0},{"profile":"3g.71gb","start":4,"compute":"1c.3g.71gb"}]},{"migMode":{"current":false}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[0].MigEnabled || strings.Join(got[0].MIGDevices, ",") != "3g.71gb,1c.3g.71gb" || got[1].MigEnabled || len(got[1].MIGDevices) != 0 {
		t.Errorf("PluginGPUsOf = %+v", got)
	}
	if _, err := kubetest.PluginGPUsOf([]byte("not json")); err == nil {
		t.Error("no error for bad JSON")
	}
}
