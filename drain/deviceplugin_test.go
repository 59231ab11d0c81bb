package drain

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestRestartDevicePlugins(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	mk := func(name string, labels map[string]string) *corev1.Pod {
		return e.k.CreatePod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name, Labels: labels, OwnerReferences: daemonSetOwner(name)},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "x"}}},
		})
	}
	mk("operator-plugin", map[string]string{"app": "nvidia-device-plugin-daemonset"})
	mk("operator-gfd", map[string]string{"app": "gpu-feature-discovery"})
	mk("chart-plugin", map[string]string{"app.kubernetes.io/name": "nvidia-device-plugin"})
	replaced := mk("chart-gfd", map[string]string{"app.kubernetes.io/name": "gpu-feature-discovery"})
	mk("dcgm", map[string]string{"app": "nvidia-dcgm-exporter"})
	mk("workload", nil)
	mk("validator", map[string]string{"app": "nvidia-operator-validator"})

	pods, err := listDevicePlugins(ctx, e.a, testLog(t), e.node, defaultSelectors(t))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods {
		names = append(names, strings.Join(strings.Split(p, "/")[:2], "/"))
	}
	want := []string{e.ns + "/chart-gfd", e.ns + "/chart-plugin", e.ns + "/operator-gfd", e.ns + "/operator-plugin", e.ns + "/validator"}
	if !slices.Equal(names, want) {
		t.Fatalf("ListDevicePlugins = %v, want %v", names, want)
	}

	// chart-gfd is replaced by a new pod of the same name (its DaemonSet
	// brought it back): it reads the new geometry and is left alone.
	if err := e.c.CoreV1().Pods(e.ns).Delete(ctx, replaced.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e, replaced.Name, replaced.UID)
	fresh := mk("chart-gfd", map[string]string{"app.kubernetes.io/name": "gpu-feature-discovery"})

	restarted, err := restartDevicePlugins(ctx, e.a, testLog(t), pods)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{e.ns + "/chart-plugin", e.ns + "/operator-gfd", e.ns + "/operator-plugin", e.ns + "/validator"}; !slices.Equal(restarted, want) {
		t.Errorf("restarted %v, want %v", restarted, want)
	}
	for _, n := range []string{"operator-plugin", "operator-gfd", "chart-plugin", "validator"} {
		waitGone(t, e, n, "")
	}
	got, err := e.c.CoreV1().Pods(e.ns).Get(ctx, "chart-gfd", metav1.GetOptions{})
	if err != nil || got.UID != fresh.UID || got.DeletionTimestamp != nil {
		t.Errorf("the replacement pod was touched: %v, %v", got, err)
	}
	if r := remaining(t, e); !slices.Equal(r, []string{e.ns + "/chart-gfd", e.ns + "/dcgm", e.ns + "/workload"}) {
		t.Errorf("remaining pods %v", r)
	}
	// Repeating it (a retry after a crash) restarts nothing more.
	again, err := restartDevicePlugins(ctx, e.a, testLog(t), pods)
	if err != nil || len(again) != 0 {
		t.Errorf("second RestartDevicePlugins = %v, %v", again, err)
	}
	if _, err := restartDevicePlugins(ctx, e.a, testLog(t), []string{"no-uid"}); err == nil {
		t.Error("a malformed pod reference was accepted")
	}
}

func waitGone(t *testing.T, e env, name string, uid types.UID) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		p, err := e.c.CoreV1().Pods(e.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || (uid != "" && p.UID != uid) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("pod %s still there", name)
}

// The wait wants exactly the new geometry: a MIG resource the plugin still
// advertises from the old one keeps it waiting.
func TestWaitAllocatableExact(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	small, big := corev1.ResourceName("nvidia.com/mig-1g.18gb"), corev1.ResourceName("nvidia.com/mig-3g.71gb")
	e.k.SetAllocatable(corev1.ResourceList{small: resource.MustParse("7"), big: resource.MustParse("2"), "nvidia.com/gpu": resource.MustParse("0"),
		"example.com/other": resource.MustParse("3")})
	ok, err := waitAllocatable(ctx, e.a, e.node, map[corev1.ResourceName]int64{small: 7}, time.Second)
	if ok || !errors.Is(err, errResourcesTimeout) || !strings.Contains(err.Error(), "nvidia.com/mig-3g.71gb: have 2, want 0") {
		t.Fatalf("stale resource: %v, %v", ok, err)
	}
	// The kubelet zeroes the allocatable of a resource whose plugin went.
	e.k.SetAllocatable(corev1.ResourceList{big: resource.MustParse("0")})
	ok, err = waitAllocatable(ctx, e.a, e.node, map[corev1.ResourceName]int64{small: 7}, 5*time.Second)
	if !ok || err != nil {
		t.Fatalf("converged: %v, %v", ok, err)
	}
	// More than wanted is no match either.
	ok, _ = waitAllocatable(ctx, e.a, e.node, map[corev1.ResourceName]int64{small: 6}, time.Second)
	if ok {
		t.Error("7 devices matched a want of 6")
	}
}
