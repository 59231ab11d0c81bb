package drain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// env is one node with its kubelet and a namespace.
type env struct {
	c    kubernetes.Interface
	a    kclient.Interface // c, as the agent's code takes it
	node string
	ns   string
	k    *kubetest.Kubelet
}

func newEnv(t *testing.T, labels map[string]string) env {
	t.Helper()
	c := kubetest.Client(t)
	e := env{c: c, a: clientset.Wrap(c), node: kubetest.NewName(t, "node"), ns: kubetest.NewName(t, "ns")}
	kubetest.CreateNode(t, e.node, labels)
	kubetest.CreateNamespace(t, e.ns)
	e.k = kubetest.StartKubelet(t, c, e.node)
	return e
}

func rsOwner(name string) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name,
		UID: "00000000-0000-0000-0000-000000000001", Controller: ptr.To(true)}
}

func gpuUUID(i int) string { return fmt.Sprintf("GPU-4f1c6a2e-0000-0000-0000-%012d", i) }

// remaining lists "ns/name" of the namespace's pods that exist and are not terminating.
func remaining(t *testing.T, e env) []string {
	t.Helper()
	list, err := e.c.CoreV1().Pods(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	slices.Sort(out)
	return out
}

func keys(ns string, names ...string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = ns + "/" + n
	}
	slices.Sort(out)
	return out
}

// An 8-GPU node with two pods per GPU (time-sliced replicas); one GPU
// changes: only its two pods are affected, and only they are evicted.
func TestWholeGPUChangeEvictsOnlyItsPods(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	var all []string
	for g := range 8 {
		for r := range 2 {
			name := fmt.Sprintf("gpu%d-r%d", g, r)
			e.k.RunPod(t, e.ns, name, map[string]string{"nvidia.com/gpu": "1"},
				map[string][]string{"nvidia.com/gpu": {fmt.Sprintf("%s::%d", gpuUUID(g), r)}}, rsOwner("rs"))
			all = append(all, e.ns+"/"+name)
		}
	}
	e.k.RunPod(t, e.ns, "cpu-only", nil, nil, rsOwner("rs"))
	slices.Sort(all)

	aff, err := findAffected(ctx, e.a, testLog(t), e.node, e.k.Socket(), deviceChange{GPUs: []string{gpuUUID(3)}})
	if err != nil {
		t.Fatal(err)
	}
	want := keys(e.ns, "gpu3-r0", "gpu3-r1")
	if aff.How != howPodResources || !slices.Equal(aff.Names(), want) {
		t.Fatalf("FindAffected = %v by %q, want %v by pod-resources", aff.Names(), aff.How, want)
	}
	if e.k.ListCalls() == 0 {
		t.Error("PodResources was not asked")
	}
	if got := aff.Devices[e.ns+"/gpu3-r0"]; !slices.Equal(got, []string{gpuUUID(3)}) {
		t.Errorf("Devices = %v", aff.Devices)
	}

	evicted, err := evict(ctx, e.a, testLog(t), aff.Pods, evictOptions{Timeout: 30 * time.Second, RetryDelay: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(evicted, want) {
		t.Errorf("evicted %v, want %v", evicted, want)
	}
	stay := slices.DeleteFunc(slices.Clone(all), func(s string) bool { return slices.Contains(want, s) })
	stay = append(stay, e.ns+"/cpu-only")
	slices.Sort(stay)
	if got := remaining(t, e); !slices.Equal(got, stay) {
		t.Errorf("pods left %v, want %v", got, stay)
	}
	if got := e.k.Finished(); len(got) != 2 {
		t.Errorf("kubelet finished %v, want the 2 evicted pods", got)
	}

	// Repeating the drain (a resumed change) is harmless.
	again, err := evict(ctx, e.a, testLog(t), aff.Pods, evictOptions{Timeout: 10 * time.Second, RetryDelay: time.Second})
	if err != nil || !slices.Equal(again, want) {
		t.Errorf("second Evict = %v, %v", again, err)
	}
	// Nothing changes: nothing affected, and PodResources is not even asked.
	calls := e.k.ListCalls()
	aff, err = findAffected(ctx, e.a, testLog(t), e.node, e.k.Socket(), deviceChange{})
	if err != nil || len(aff.Pods) != 0 || aff.How != howNothing || e.k.ListCalls() != calls {
		t.Errorf("empty change: %v by %q, %v", aff.Names(), aff.How, err)
	}
}

// Pods on MIG devices of several GPU instances; some instances are destroyed:
// only their pods are affected, also on a GPU that changes otherwise.
func TestMIGDevicesDestroyedAffectOnlyTheirPods(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.k.RunPod(t, e.ns, "small-a", map[string]string{"nvidia.com/mig-1g.18gb": "1"},
		map[string][]string{"nvidia.com/mig-1g.18gb": {"MIG-aaaa"}}, rsOwner("rs"))
	e.k.RunPod(t, e.ns, "small-b", map[string]string{"nvidia.com/mig-1g.18gb": "1"},
		map[string][]string{"nvidia.com/mig-1g.18gb": {"MIG-bbbb"}}, rsOwner("rs"))
	e.k.RunPod(t, e.ns, "big", map[string]string{"nvidia.com/mig-3g.71gb": "1"},
		map[string][]string{"nvidia.com/mig-3g.71gb": {"MIG-cccc"}}, rsOwner("rs"))
	two := e.k.RunPod(t, e.ns, "two", map[string]string{"nvidia.com/mig-1g.18gb": "1", "nvidia.com/mig-2g.35gb": "1"},
		nil, rsOwner("rs"))
	// One pod, two containers on different instances: one of them is destroyed.
	e.k.Assign(two, "main", "nvidia.com/mig-2g.35gb", "MIG-dddd")
	e.k.Assign(two, "sidecar", "nvidia.com/mig-1g.18gb", "MIG-eeee")
	e.k.RunPod(t, e.ns, "whole", map[string]string{"nvidia.com/gpu": "1"},
		map[string][]string{"nvidia.com/gpu": {gpuUUID(1)}}, rsOwner("rs"))

	change := deviceChange{MIGDevices: []string{"MIG-bbbb", "MIG-eeee", "MIG-ffff-unused"}}
	aff, err := findAffected(ctx, e.a, testLog(t), e.node, e.k.Socket(), change)
	if err != nil {
		t.Fatal(err)
	}
	want := keys(e.ns, "small-b", "two")
	if !slices.Equal(aff.Names(), want) || aff.How != howPodResources {
		t.Fatalf("FindAffected = %v by %q, want %v", aff.Names(), aff.How, want)
	}
	evicted, err := evict(ctx, e.a, testLog(t), aff.Pods, evictOptions{Timeout: 30 * time.Second, RetryDelay: time.Second})
	if err != nil || !slices.Equal(evicted, want) {
		t.Fatalf("Evict = %v, %v; want %v", evicted, err, want)
	}
	if got, stay := remaining(t, e), keys(e.ns, "small-a", "big", "whole"); !slices.Equal(got, stay) {
		t.Errorf("pods left %v, want %v", got, stay)
	}
}

// Without PodResources every pod of the node that requests an nvidia.com/
// resource is affected, and How says why.
func TestNoPodResourcesMeansAllGPUPods(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.k.RunPod(t, e.ns, "gpu", map[string]string{"nvidia.com/gpu": "1"}, nil, rsOwner("rs"))
	e.k.RunPod(t, e.ns, "mig", map[string]string{"nvidia.com/mig-1g.18gb": "1"}, nil, nil)
	e.k.RunPod(t, e.ns, "cpu", map[string]string{"cpu": "100m"}, nil, rsOwner("rs"))
	done := e.k.RunPod(t, e.ns, "done", map[string]string{"nvidia.com/gpu": "1"}, nil, nil)
	done.Status.Phase = corev1.PodSucceeded
	if _, err := e.c.CoreV1().Pods(e.ns).UpdateStatus(ctx, done, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A GPU pod of another node is not ours.
	other := kubetest.StartKubelet(t, e.c, kubetest.NewName(t, "other"))
	other.RunPod(t, e.ns, "elsewhere", map[string]string{"nvidia.com/gpu": "1"}, nil, nil)

	missing := filepath.Join(t.TempDir(), "no-kubelet.sock")
	for _, socket := range []string{missing, ""} {
		aff, err := findAffected(ctx, e.a, testLog(t), e.node, socket, deviceChange{GPUs: []string{gpuUUID(0)}})
		if err != nil {
			t.Fatal(err)
		}
		if want := keys(e.ns, "gpu", "mig"); !slices.Equal(aff.Names(), want) {
			t.Errorf("socket %q: affected %v, want %v", socket, aff.Names(), want)
		}
		if !aff.FellBack() || !strings.HasPrefix(aff.How, "all-gpu-pods: ") || !strings.Contains(aff.How, "PodResources") {
			t.Errorf("socket %q: How = %q", socket, aff.How)
		}
		if socket == missing && !strings.Contains(aff.How, missing) {
			t.Errorf("How does not name the socket: %q", aff.How)
		}
	}
}

func createPDB(t *testing.T, e env, name string, selector map[string]string, allowed int32) {
	t.Helper()
	ctx := context.Background()
	pdb, err := e.c.PolicyV1().PodDisruptionBudgets(e.ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: selector},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No disruption controller runs: write the status it would compute.
	pdb.Status = policyv1.PodDisruptionBudgetStatus{
		ObservedGeneration: pdb.Generation, DisruptionsAllowed: allowed,
		CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1,
	}
	if _, err := e.c.PolicyV1().PodDisruptionBudgets(e.ns).UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A PodDisruptionBudget with no disruption allowed blocks its pod: the drain
// fails after the timeout naming it, and the other pod is evicted.
func TestPDBBlocksDrainUntilTimeout(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	guarded := e.k.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "guarded", Labels: map[string]string{"app": "db"},
			OwnerReferences: []metav1.OwnerReference{*rsOwner("db")}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "db"}}},
	})
	free := e.k.RunPod(t, e.ns, "free", nil, nil, rsOwner("rs"))
	createPDB(t, e, "db", map[string]string{"app": "db"}, 0)

	start := time.Now()
	evicted, err := evict(ctx, e.a, testLog(t), []corev1.Pod{*guarded, *free},
		evictOptions{Timeout: 3 * time.Second, RetryDelay: time.Second})
	took := time.Since(start)
	if !errors.Is(err, errDrainTimeout) {
		t.Fatalf("Evict err = %v, want ErrDrainTimeout", err)
	}
	for _, s := range []string{e.ns + "/guarded", "disruption budget"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if strings.Contains(err.Error(), e.ns+"/free") {
		t.Errorf("error names the evicted pod: %v", err)
	}
	if !slices.Equal(evicted, []string{e.ns + "/free"}) {
		t.Errorf("evicted = %v, want only free", evicted)
	}
	if took < 3*time.Second || took > 20*time.Second {
		t.Errorf("Evict took %s with a 3s timeout", took)
	}
	if got := remaining(t, e); !slices.Equal(got, []string{e.ns + "/guarded"}) {
		t.Errorf("pods left %v", got)
	}
	t.Logf("blocked drain returned after %s: %v", took.Round(time.Millisecond), err)

	// Once the budget allows it, the same call succeeds.
	pdb, err := e.c.PolicyV1().PodDisruptionBudgets(e.ns).Get(ctx, "db", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pdb.Status.DisruptionsAllowed = 1
	if _, err := e.c.PolicyV1().PodDisruptionBudgets(e.ns).UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	evicted, err = evict(ctx, e.a, testLog(t), []corev1.Pod{*guarded}, evictOptions{Timeout: 20 * time.Second, RetryDelay: time.Second})
	if err != nil || !slices.Equal(evicted, []string{e.ns + "/guarded"}) {
		t.Errorf("Evict after the budget allows it = %v, %v", evicted, err)
	}
}

// A pod that does not terminate in time is named with its state.
func TestSlowTerminationTimesOut(t *testing.T) {
	e := newEnv(t, nil)
	slow := e.k.RunPod(t, e.ns, "slow", nil, nil, rsOwner("rs"))
	e.k.KeepTerminating(slow)
	_, err := evict(context.Background(), e.a, testLog(t), []corev1.Pod{*slow},
		evictOptions{Timeout: 2 * time.Second, RetryDelay: time.Second})
	if !errors.Is(err, errDrainTimeout) || !strings.Contains(err.Error(), e.ns+"/slow (terminating, grace period until") {
		t.Errorf("err = %v", err)
	}
}

// Static pods are never evicted, and pods without a controller only when
// allowed: both fail before anything is evicted.
func TestNotEvictable(t *testing.T) {
	e := newEnv(t, nil)
	static := e.k.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "static",
			Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "hash"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "x"}}},
	})
	bare := e.k.RunPod(t, e.ns, "bare", nil, nil, nil)
	managed := e.k.RunPod(t, e.ns, "managed", nil, nil, rsOwner("rs"))
	opts := evictOptions{Timeout: 5 * time.Second, RetryDelay: time.Second}

	_, err := evict(context.Background(), e.a, testLog(t), []corev1.Pod{*managed, *static}, opts)
	if !errors.Is(err, errNotEvictable) || !strings.Contains(err.Error(), e.ns+"/static") {
		t.Errorf("static: err = %v", err)
	}
	opts.RefuseUnmanaged = true
	_, err = evict(context.Background(), e.a, testLog(t), []corev1.Pod{*managed, *bare}, opts)
	if !errors.Is(err, errNotEvictable) || !strings.Contains(err.Error(), e.ns+"/bare") {
		t.Errorf("unmanaged refused: err = %v", err)
	}
	if got, want := remaining(t, e), keys(e.ns, "bare", "managed", "static"); !slices.Equal(got, want) {
		t.Errorf("a refused drain evicted pods: left %v, want %v", got, want)
	}
	opts.RefuseUnmanaged = false
	evicted, err := evict(context.Background(), e.a, testLog(t), []corev1.Pod{*bare}, opts)
	if err != nil || !slices.Equal(evicted, []string{e.ns + "/bare"}) {
		t.Errorf("unmanaged by default: %v, %v", evicted, err)
	}
}

// evictAsync runs evict in a goroutine; the result comes on the channel.
func evictAsync(t *testing.T, e env, pods []corev1.Pod, opts evictOptions) <-chan evictResult {
	out := make(chan evictResult, 1)
	go func() {
		gone, err := evict(context.Background(), e.a, testLog(t), pods, opts)
		out <- evictResult{gone, err}
	}()
	return out
}

type evictResult struct {
	gone []string
	err  error
}

// An eviction that a PodDisruptionBudget refuses (429) is retried within the
// same drain, and succeeds once the budget allows it.
func TestPDBRefusalRetriedUntilAllowed(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	guarded := e.k.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "guarded", Labels: map[string]string{"app": "db"},
			OwnerReferences: []metav1.OwnerReference{*rsOwner("db")}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "db"}}},
	})
	createPDB(t, e, "db", map[string]string{"app": "db"}, 0)
	start := time.Now()
	res := evictAsync(t, e, []corev1.Pod{*guarded}, evictOptions{Timeout: 30 * time.Second, RetryDelay: 300 * time.Millisecond})
	time.Sleep(1500 * time.Millisecond)
	select {
	case r := <-res:
		t.Fatalf("Evict returned while the budget forbids it: %v, %v", r.gone, r.err)
	default:
	}
	pdb, err := e.c.PolicyV1().PodDisruptionBudgets(e.ns).Get(ctx, "db", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pdb.Status.DisruptionsAllowed = 1
	if _, err := e.c.PolicyV1().PodDisruptionBudgets(e.ns).UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil || !slices.Equal(r.gone, []string{e.ns + "/guarded"}) {
		t.Fatalf("Evict = %v, %v", r.gone, r.err)
	}
	if took := time.Since(start); took < 1500*time.Millisecond || took > 20*time.Second {
		t.Errorf("Evict took %s", took)
	}
	if got := remaining(t, e); len(got) != 0 {
		t.Errorf("pods left %v", got)
	}
}

// The eviction deletes each pod with its own terminationGracePeriodSeconds,
// and evict waits until the pod is really gone: a new pod that takes the
// name (a StatefulSet's) is not the evicted one, and is left alone.
func TestEvictionGracePeriodAndWaitByUID(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	spec := corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](42),
		Containers: []corev1.Container{{Name: "main", Image: "db"}}}
	slow := e.k.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "db-0", OwnerReferences: []metav1.OwnerReference{*rsOwner("db")}},
		Spec:       spec,
	})
	e.k.KeepTerminating(slow)
	res := evictAsync(t, e, []corev1.Pod{*slow}, evictOptions{Timeout: 30 * time.Second, RetryDelay: time.Second})

	var cur *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := e.c.CoreV1().Pods(e.ns).Get(ctx, "db-0", metav1.GetOptions{})
		cur = p
		return err == nil && p.DeletionTimestamp != nil, nil
	})
	if err != nil {
		t.Fatalf("pod not evicted: %v", err)
	}
	if g := cur.DeletionGracePeriodSeconds; g == nil || *g != 42 {
		t.Errorf("deletion grace period = %v, want the pod's 42", g)
	}
	time.Sleep(1500 * time.Millisecond)
	select {
	case r := <-res:
		t.Fatalf("Evict returned while the pod terminates: %v, %v", r.gone, r.err)
	default:
	}
	// The pod finishes and a new one of the same name comes at once.
	if err := e.c.CoreV1().Pods(e.ns).Delete(ctx, "db-0", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0),
		Preconditions: &metav1.Preconditions{UID: &slow.UID}}); err != nil {
		t.Fatal(err)
	}
	next := e.k.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "db-0", OwnerReferences: []metav1.OwnerReference{*rsOwner("db")}},
		Spec:       spec,
	})
	r := <-res
	if r.err != nil || !slices.Equal(r.gone, []string{e.ns + "/db-0"}) {
		t.Fatalf("Evict = %v, %v", r.gone, r.err)
	}
	p, err := e.c.CoreV1().Pods(e.ns).Get(ctx, "db-0", metav1.GetOptions{})
	if err != nil || p.UID != next.UID || p.DeletionTimestamp != nil {
		t.Errorf("the new pod of the name was touched: %v, %v", p, err)
	}

	// Evicting the old pod again (a resumed drain) leaves the new one alone:
	// the eviction names the old UID.
	again, err := evict(ctx, e.a, testLog(t), []corev1.Pod{*slow}, evictOptions{Timeout: 10 * time.Second, RetryDelay: time.Second})
	if err != nil || !slices.Equal(again, []string{e.ns + "/db-0"}) {
		t.Errorf("second Evict = %v, %v", again, err)
	}
	if got := remaining(t, e); !slices.Equal(got, []string{e.ns + "/db-0"}) {
		t.Errorf("pods left %v, want the new db-0", got)
	}
}

// DaemonSet pods that hold a device are evicted like any other; mirror pods
// are refused (see TestNotEvictable).
func TestDaemonSetPodEvicted(t *testing.T) {
	e := newEnv(t, nil)
	ds := e.k.RunPod(t, e.ns, "ds-pod", map[string]string{"nvidia.com/gpu": "1"}, nil, &metav1.OwnerReference{
		APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "00000000-0000-0000-0000-000000000002", Controller: ptr.To(true)})
	gone, err := evict(context.Background(), e.a, testLog(t), []corev1.Pod{*ds},
		evictOptions{Timeout: 20 * time.Second, RetryDelay: time.Second, RefuseUnmanaged: true})
	if err != nil || !slices.Equal(gone, []string{e.ns + "/ds-pod"}) {
		t.Errorf("Evict = %v, %v", gone, err)
	}
	if got := remaining(t, e); len(got) != 0 {
		t.Errorf("pods left %v", got)
	}
}

// In a namespace being deleted the API server refuses evictions (403,
// NamespaceTerminating): a pod not yet terminating is retried until the
// timeout (errDrainTimeout, not a failure at once); a terminating one is
// waited for.
func TestEvictionInTerminatingNamespace(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	running := e.k.RunPod(t, e.ns, "running", nil, nil, rsOwner("rs"))
	leaving := e.k.RunPod(t, e.ns, "leaving", nil, nil, rsOwner("rs"))
	e.k.KeepTerminating(leaving)
	if err := e.c.CoreV1().Pods(e.ns).Delete(ctx, "leaving", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	leaving, err := e.c.CoreV1().Pods(e.ns).Get(ctx, "leaving", metav1.GetOptions{})
	if err != nil || leaving.DeletionTimestamp == nil {
		t.Fatalf("leaving: %v, %v", leaving, err)
	}
	// Left Terminating: no namespace controller runs.
	if err := e.c.CoreV1().Namespaces().Delete(ctx, e.ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	_, err = evict(ctx, e.a, testLog(t), []corev1.Pod{*running}, evictOptions{Timeout: 3 * time.Second, RetryDelay: 500 * time.Millisecond})
	if !errors.Is(err, errDrainTimeout) || !strings.Contains(err.Error(), e.ns+"/running") {
		t.Errorf("running pod: err = %v, want ErrDrainTimeout", err)
	}
	if took := time.Since(start); took < 3*time.Second {
		t.Errorf("gave up after %s, before the timeout", took)
	}

	res := evictAsync(t, e, []corev1.Pod{*leaving}, evictOptions{Timeout: 30 * time.Second, RetryDelay: time.Second})
	time.Sleep(time.Second)
	if err := e.c.CoreV1().Pods(e.ns).Delete(ctx, "leaving", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	if r := <-res; r.err != nil || !slices.Equal(r.gone, []string{e.ns + "/leaving"}) {
		t.Errorf("terminating pod: Evict = %v, %v", r.gone, r.err)
	}
}

// Cancelling the caller's context ends the drain at once, naming what stays.
func TestEvictInterrupted(t *testing.T) {
	e := newEnv(t, nil)
	slow := e.k.RunPod(t, e.ns, "slow", nil, nil, rsOwner("rs"))
	e.k.KeepTerminating(slow)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := evict(ctx, e.a, testLog(t), []corev1.Pod{*slow}, evictOptions{Timeout: time.Minute, RetryDelay: time.Second})
	if err == nil || !strings.Contains(err.Error(), "drain interrupted") || !strings.Contains(err.Error(), e.ns+"/slow (terminating") {
		t.Errorf("err = %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %s after the context ended", took)
	}
}

func taints(t *testing.T, e env) []string {
	t.Helper()
	n, err := e.c.CoreV1().Nodes().Get(context.Background(), e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tn := range n.Spec.Taints {
		out = append(out, tn.ToString())
	}
	slices.Sort(out)
	return out
}

// The taint from the agent's watch of its Node: one patch carrying the
// watched resourceVersion. A Node changed since (a stale copy) is not
// written: the caller reads it (addTaint, removeTaint) instead.
func TestTaintFromWatchedNode(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	before := taints(t, e)
	read := func() *corev1.Node {
		n, err := e.c.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	stale := read()
	added, done, err := addTaintFrom(ctx, e.a, stale)
	if err != nil || !done || !added {
		t.Fatalf("addTaintFrom = %v, %v, %v", added, done, err)
	}
	if got := taints(t, e); len(got) != len(before)+1 || !slices.Contains(got, "migagent.io/reconfiguring=true:NoSchedule") {
		t.Errorf("taints %v after addTaintFrom; before %v", got, before)
	}
	// The copy from before the patch is stale: nothing is written.
	fresh := read()
	stale.Spec.Taints = fresh.Spec.Taints
	if removed, done, err := removeTaintFrom(ctx, e.a, stale); err != nil || done || removed {
		t.Errorf("RemoveTaintFrom with a stale copy = %v, %v, %v; want nothing done", removed, done, err)
	}
	// A copy that already shows the taint is left to addTaint.
	if added, done, err := addTaintFrom(ctx, e.a, fresh); err != nil || done || added {
		t.Errorf("addTaintFrom over a copy with the taint = %v, %v, %v; want nothing done", added, done, err)
	}
	if removed, done, err := removeTaintFrom(ctx, e.a, fresh); err != nil || !done || !removed {
		t.Fatalf("RemoveTaintFrom = %v, %v, %v", removed, done, err)
	}
	if got := taints(t, e); !slices.Equal(got, before) {
		t.Errorf("taints %v after RemoveTaintFrom, want %v", got, before)
	}
}

func TestTaint(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	before := taints(t, e) // admission's not-ready taint
	ours := "migagent.io/reconfiguring=true:NoSchedule"

	added, err := addTaint(ctx, e.a, e.node)
	if err != nil || !added {
		t.Fatalf("addTaint = %v, %v", added, err)
	}
	want := slices.Sorted(slices.Values(append(slices.Clone(before), ours)))
	if got := taints(t, e); !slices.Equal(got, want) {
		t.Errorf("taints %v, want %v", got, want)
	}
	added, err = addTaint(ctx, e.a, e.node)
	if err != nil || added {
		t.Errorf("second addTaint = %v, %v; want false (already there)", added, err)
	}
	if got := taints(t, e); !slices.Equal(got, want) {
		t.Errorf("taints after a second add %v, want %v", got, want)
	}
	for _, wantRemoved := range []bool{true, false} {
		removed, err := removeTaint(ctx, e.a, e.node)
		if err != nil || removed != wantRemoved {
			t.Errorf("RemoveTaint = %v, %v; want %v", removed, err, wantRemoved)
		}
		if got := taints(t, e); !slices.Equal(got, before) {
			t.Errorf("taints after remove %v, want %v", got, before)
		}
	}

	// The user's own taint with our key is left alone, before and after.
	n, err := e.c.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: TaintKey, Value: "maintenance", Effect: corev1.TaintEffectNoSchedule})
	if _, err := e.c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	userTaints := taints(t, e)
	added, err = addTaint(ctx, e.a, e.node)
	if err != nil || added {
		t.Errorf("addTaint over a user's taint = %v, %v; want false", added, err)
	}
	removed, err := removeTaint(ctx, e.a, e.node)
	if err != nil || removed {
		t.Errorf("RemoveTaint with only the user's taint = %v, %v; want false", removed, err)
	}
	if got := taints(t, e); !slices.Equal(got, userTaints) {
		t.Errorf("user's taint touched: %v, want %v", got, userTaints)
	}
	if _, err := addTaint(ctx, e.a, ""); !errors.Is(err, errNoNode) {
		t.Errorf("addTaint without node: %v", err)
	}
}

// playDaemonSets deletes (gracefully) the operand pods of node whose deploy
// label is paused, as the DaemonSet controller does; the kubelet finishes them.
func playDaemonSets(ctx context.Context, t *testing.T, e env, pods map[string]string /*label→pod*/) {
	_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		n, err := e.c.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for label, pod := range pods {
			if n.Labels[label] == PausedValue {
				err := e.c.CoreV1().Pods(e.ns).Delete(ctx, pod, metav1.DeleteOptions{})
				if err == nil || apierrors.IsNotFound(err) {
					delete(pods, label)
				}
			}
		}
		return len(pods) == 0, nil
	})
}

func nodeLabels(t *testing.T, e env) map[string]string {
	t.Helper()
	n, err := e.c.CoreV1().Nodes().Get(context.Background(), e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels
}

func TestOperandsPausedAndRestoredExactly(t *testing.T) {
	const (
		dp   = "nvidia.com/gpu.deploy.device-plugin"
		gfd  = "nvidia.com/gpu.deploy.gpu-feature-discovery"
		dex  = "nvidia.com/gpu.deploy.dcgm-exporter"
		dcgm = "nvidia.com/gpu.deploy.dcgm"
		nvsm = "nvidia.com/gpu.deploy.nvsm"
	)
	e := newEnv(t, map[string]string{dp: "true", gfd: "false", dcgm: "true", nvsm: PausedValue, "keep": "me"})
	ctx := context.Background()
	// As the GPU Operator's DaemonSets make them: the app label, and the
	// deploy label in the node selector.
	operand := func(name, app, label string) {
		e.k.CreatePod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name, Labels: map[string]string{"app": app}, OwnerReferences: daemonSetOwner(name)},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{label: "true"},
				Containers: []corev1.Container{{Name: "main", Image: app}}},
		})
	}
	operand("device-plugin", "nvidia-device-plugin-daemonset", dp)
	operand("dcgm", "nvidia-dcgm", dcgm)
	operand("gfd", "gpu-feature-discovery", gfd) // its label is "false": not ours to stop

	saved, err := readOperands(ctx, e.a, e.node)
	if err != nil {
		t.Fatal(err)
	}
	// Through the journal and back.
	b, err := json.Marshal(saved)
	if err != nil {
		t.Fatal(err)
	}
	var journaled savedLabels
	if err := json.Unmarshal(b, &journaled); err != nil {
		t.Fatal(err)
	}
	if want := []string{dcgm, dp, nvsm}; !slices.Equal(journaled.Paused(), want) {
		t.Errorf("Paused = %v, want %v (journal %s)", journaled.Paused(), want, b)
	}

	dsCtx, stopDS := context.WithCancel(ctx)
	dsDone := make(chan struct{})
	go func() {
		defer close(dsDone)
		playDaemonSets(dsCtx, t, e, map[string]string{dp: "device-plugin", dcgm: "dcgm"})
	}()
	start := time.Now()
	err = pauseOperands(ctx, e.a, testLog(t), e.node, journaled, defaultSelectors(t), 20*time.Second)
	stopDS()
	<-dsDone
	if err != nil {
		t.Fatalf("pauseOperands: %v", err)
	}
	t.Logf("operands left after %s", time.Since(start).Round(time.Millisecond))
	l := nodeLabels(t, e)
	for label, want := range map[string]string{dp: PausedValue, dcgm: PausedValue, nvsm: PausedValue, gfd: "false"} {
		if l[label] != want {
			t.Errorf("paused: %s=%q, want %q", label, l[label], want)
		}
	}
	if _, ok := l[dex]; ok {
		t.Errorf("paused: absent %s was set", dex)
	}
	if got := remaining(t, e); !slices.Equal(got, []string{e.ns + "/gfd"}) {
		t.Errorf("pods left %v, want only gfd", got)
	}

	for range 2 { // restoring twice is harmless
		if err := restoreOperands(ctx, e.a, testLog(t), e.node, journaled); err != nil {
			t.Fatal(err)
		}
		l = nodeLabels(t, e)
		for label, want := range map[string]string{dp: "true", dcgm: "true", nvsm: "true", gfd: "false", "keep": "me"} {
			if l[label] != want {
				t.Errorf("restored: %s=%q, want %q", label, l[label], want)
			}
		}
		if _, ok := l[dex]; ok {
			t.Errorf("restored: absent %s was set", dex)
		}
	}
}

func TestOperandsThatDoNotLeaveTimeOut(t *testing.T) {
	const dp = "nvidia.com/gpu.deploy.device-plugin"
	e := newEnv(t, map[string]string{dp: "custom-value"})
	ctx := context.Background()
	e.k.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "stuck-plugin", Labels: map[string]string{"app": "nvidia-device-plugin-daemonset"},
			OwnerReferences: daemonSetOwner("stuck-plugin")},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{dp: "true"},
			Containers: []corev1.Container{{Name: "main", Image: "dp"}}},
	})
	saved, err := readOperands(ctx, e.a, e.node)
	if err != nil {
		t.Fatal(err)
	}
	err = pauseOperands(ctx, e.a, testLog(t), e.node, saved, defaultSelectors(t), time.Second)
	if !errors.Is(err, errOperandsTimeout) || !strings.Contains(err.Error(), e.ns+"/stuck-plugin") {
		t.Errorf("err = %v", err)
	}
	if err := restoreOperands(ctx, e.a, testLog(t), e.node, saved); err != nil {
		t.Fatal(err)
	}
	if got := nodeLabels(t, e)[dp]; got != "custom-value" {
		t.Errorf("restored %s=%q, want custom-value", dp, got)
	}
}

func TestWaitAllocatable(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	mig := corev1.ResourceName("nvidia.com/mig-1g.18gb")
	want := map[corev1.ResourceName]int64{mig: 7}

	// No device plugin advertises anything: skipped at once.
	start := time.Now()
	ok, err := waitAllocatable(ctx, e.a, e.node, want, 10*time.Second)
	if !ok || err != nil || time.Since(start) > 2*time.Second {
		t.Fatalf("no nvidia.com resources: %v, %v after %s; want an immediate true", ok, err, time.Since(start))
	}

	e.k.SetAllocatable(corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), mig: resource.MustParse("0")})
	go func() {
		time.Sleep(time.Second)
		e.k.SetAllocatable(corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("0"), mig: resource.MustParse("7")})
	}()
	start = time.Now()
	ok, err = waitAllocatable(ctx, e.a, e.node, want, 15*time.Second)
	if !ok || err != nil {
		t.Fatalf("WaitAllocatable = %v, %v", ok, err)
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("returned after %s, before the resources changed", took)
	}

	ok, err = waitAllocatable(ctx, e.a, e.node, map[corev1.ResourceName]int64{mig: 8, "nvidia.com/gpu": 1}, time.Second)
	if ok || !errors.Is(err, errResourcesTimeout) ||
		!strings.Contains(err.Error(), "nvidia.com/mig-1g.18gb: have 7, want 8") || !strings.Contains(err.Error(), "nvidia.com/gpu: have 0, want 1") {
		t.Errorf("short wait = %v, %v", ok, err)
	}
}

// The wait keeps reading the Node through an API server outage.
func TestWaitAllocatableSurvivesAPIServerRestart(t *testing.T) {
	e := newEnv(t, nil)
	mig := corev1.ResourceName("nvidia.com/mig-3g.71gb")
	e.k.SetAllocatable(corev1.ResourceList{mig: resource.MustParse("0")})
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := waitAllocatable(context.Background(), e.a, e.node, map[corev1.ResourceName]int64{mig: 2}, time.Minute)
		done <- result{ok, err}
	}()
	kubetest.RestartAPIServer(t, 2*time.Second)
	select {
	case r := <-done:
		t.Fatalf("WaitAllocatable returned during the outage: %v, %v", r.ok, r.err)
	default:
	}
	e.k.SetAllocatable(corev1.ResourceList{mig: resource.MustParse("2")})
	if r := <-done; !r.ok || r.err != nil {
		t.Errorf("WaitAllocatable = %v, %v", r.ok, r.err)
	}
}

// Pods holding MIG devices and a whole GPU through ResourceClaims on the
// NVIDIA DRA driver: the kubelet stand-in reports them in PodResources
// dynamic_resources, the node's ResourceSlice gives their UUIDs, and only
// the pods whose claimed devices go are affected.
func TestClaimsOnDevicesThatGoAreAffected(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	gpu0, gpu1 := gpuUUID(0), gpuUUID(1)
	kubetest.PublishNVIDIASlice(t, e.c, e.node,
		kubetest.NVIDIADevice{Name: "gpu-0-mig-1g18gb-19-0", UUID: "MIG-go", ParentUUID: gpu0, Profile: "1g.18gb"},
		kubetest.NVIDIADevice{Name: "gpu-0-mig-1g18gb-19-1", UUID: "MIG-stay", ParentUUID: gpu0, Profile: "1g.18gb"},
		kubetest.NVIDIADevice{Name: "gpu-1", UUID: gpu1})
	claimPod := func(name string, devices ...string) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name, OwnerReferences: []metav1.OwnerReference{*rsOwner("rs")}},
			Spec: corev1.PodSpec{
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name + "-claim")}},
				Containers: []corev1.Container{{Name: kubetest.PodContainer, Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}}}
		created := e.k.CreatePod(t, pod)
		var devs []kubetest.AllocatedDevice
		for _, d := range devices {
			devs = append(devs, kubetest.AllocatedDevice{Driver: dra.NVIDIADRADriver, Pool: e.node, Device: d})
		}
		kubetest.AllocateClaim(t, e.c, e.ns, name+"-claim", "mig.nvidia.com", created, devs...)
		e.k.PrepareClaims(t, created)
	}
	claimPod("on-go", "gpu-0-mig-1g18gb-19-0")
	claimPod("on-stay", "gpu-0-mig-1g18gb-19-1")
	claimPod("whole", "gpu-1")

	for _, tc := range []struct {
		name   string
		change deviceChange
		want   []string
	}{
		{"MIG device destroyed", deviceChange{GPUs: []string{gpu0}, MIGDevices: []string{"MIG-go"}}, keys(e.ns, "on-go")},
		{"whole GPU changes", deviceChange{GPUs: []string{gpu1}}, keys(e.ns, "whole")},
	} {
		aff, err := findAffected(ctx, clientset.Wrap(e.c), testLog(t), e.node, e.k.Socket(), tc.change)
		if err != nil {
			t.Fatal(err)
		}
		if aff.How != howPodResources || !slices.Equal(aff.Names(), tc.want) {
			t.Fatalf("%s: FindAffected = %v by %q, want %v by pod-resources", tc.name, aff.Names(), aff.How, tc.want)
		}
	}
	aff, err := findAffected(ctx, clientset.Wrap(e.c), testLog(t), e.node, e.k.Socket(), deviceChange{MIGDevices: []string{"MIG-go"}})
	if err != nil {
		t.Fatal(err)
	}
	evicted, err := evict(ctx, clientset.Wrap(e.c), testLog(t), aff.Pods, evictOptions{Timeout: 30 * time.Second, RetryDelay: time.Second})
	if err != nil || !slices.Equal(evicted, keys(e.ns, "on-go")) {
		t.Fatalf("Evict = %v, %v", evicted, err)
	}
	if got, stay := remaining(t, e), keys(e.ns, "on-stay", "whole"); !slices.Equal(got, stay) {
		t.Errorf("pods left %v, want %v", got, stay)
	}
}
