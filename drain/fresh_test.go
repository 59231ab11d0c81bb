package drain

import (
	"context"
	"errors"
	"github.com/migagent/mig-agent/drain/sharing"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

var pluginLabels = map[string]string{"app": "nvidia-device-plugin-daemonset"}

// swapNode: GPU 0 with MIG off and GPU 1 in 7 MIG devices, as the old
// plugin advertised them; after the change GPU 0 holds the 7 MIG devices
// and GPU 1 is whole: the same figures.
func swapNode() *corev1.Node {
	return gpuNode(corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), "nvidia.com/mig-1g.18gb": resource.MustParse("7")})
}

func swapExposed() (map[string]bool, map[string]string) {
	mig := map[string]string{}
	for _, u := range []string{"MIG-1", "MIG-2", "MIG-3", "MIG-4", "MIG-5", "MIG-6", "MIG-7"} {
		mig[u] = "1g.18gb"
	}
	return map[string]bool{"GPU-0": true, "GPU-1": false}, mig
}

// Two GPUs swapping roles: the old plugin's figures equal the new
// geometry's. They count only once a plugin pod started after the change is
// Ready with the old one gone, and then only when the figures moved or
// stayed for the settle time.
func TestWaitResourcesWantsTheNewPlugin(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(swapNode(), readyPod("plugin-old", "u-old", pluginLabels))
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}, PluginSettle: 3 * time.Second}
	if path, _, err := k.ServedBy(ctx); err != nil || path == "" {
		t.Fatalf("ServedBy = %q, %v", path, err)
	}
	pods, err := k.DevicePlugins(ctx)
	if err != nil || len(pods) != 1 {
		t.Fatalf("DevicePlugins = %v, %v", pods, err)
	}
	ch := changeOn(record.ServedByDevicePlugin, pods...)
	migMode, migDevices := swapExposed()
	wait := func(timeout time.Duration) (bool, error) {
		waited, ok, err := k.WaitResources(ctx, ch, "mixed", migMode, migDevices, timeout)
		if !waited {
			t.Fatalf("WaitResources did not wait: %v", err)
		}
		return ok, err
	}
	// The old plugin still runs: its figures are not the new geometry's.
	if ok, err := wait(1500 * time.Millisecond); ok || err == nil || !strings.Contains(err.Error(), "read the GPUs before the change still runs: nvidia-dra-driver-gpu/plugin-old") {
		t.Fatalf("old plugin running: ok %v, err %v", ok, err)
	}
	// Restarted: no plugin pod yet, the kubelet has not written anything.
	if err := c.CoreV1().Pods("nvidia-dra-driver-gpu").Delete(ctx, "plugin-old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if ok, err := wait(1500 * time.Millisecond); ok || err == nil || !strings.Contains(err.Error(), "no device plugin pod started after the change is Running and Ready (none on the node)") {
		t.Fatalf("no plugin pod: ok %v, err %v", ok, err)
	}
	// A new pod, not Ready yet.
	newPod := readyPod("plugin-new", "u-new", pluginLabels)
	newPod.Status = corev1.PodStatus{Phase: corev1.PodPending}
	if _, err := c.CoreV1().Pods(newPod.Namespace).Create(ctx, newPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ok, err := wait(1500 * time.Millisecond); ok || err == nil || !strings.Contains(err.Error(), "plugin-new not yet") {
		t.Fatalf("plugin pod pending: ok %v, err %v", ok, err)
	}
	// Ready, the figures unchanged: not before the settle time.
	newPod = readyPod("plugin-new", "u-new", pluginLabels)
	if _, err := c.CoreV1().Pods(newPod.Namespace).UpdateStatus(ctx, newPod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ok, err := wait(1500 * time.Millisecond); ok || err == nil || !strings.Contains(err.Error(), "waiting 3s after nvidia-dra-driver-gpu/plugin-new became Ready") {
		t.Fatalf("within the settle time: ok %v, err %v", ok, err)
	}
	start := time.Now()
	if ok, err := wait(10 * time.Second); !ok || err != nil {
		t.Fatalf("after the settle time: ok %v, err %v", ok, err)
	}
	if d := time.Since(start); d < 2500*time.Millisecond {
		t.Errorf("success after %s, before the settle time", d)
	}
}

// Figures that moved (the old plugin's devices went, the new plugin's came)
// are the new plugin's: no settle time.
func TestWaitResourcesFiguresMoved(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(swapNode(), readyPod("plugin-old", "u-old", pluginLabels))
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}, PluginSettle: time.Minute}
	if _, _, err := k.ServedBy(ctx); err != nil {
		t.Fatal(err)
	}
	pods, err := k.DevicePlugins(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ch := changeOn(record.ServedByDevicePlugin, pods...)
	if err := c.CoreV1().Pods("nvidia-dra-driver-gpu").Delete(ctx, "plugin-old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		n := gpuNode(corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("0"), "nvidia.com/mig-1g.18gb": resource.MustParse("0")})
		_, _ = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		time.Sleep(300 * time.Millisecond)
		_, _ = c.CoreV1().Pods("nvidia-dra-driver-gpu").Create(ctx, readyPod("plugin-new", "u-new", pluginLabels), metav1.CreateOptions{})
		time.Sleep(300 * time.Millisecond)
		_, _ = c.CoreV1().Nodes().UpdateStatus(ctx, swapNode(), metav1.UpdateOptions{})
	}()
	migMode, migDevices := swapExposed()
	start := time.Now()
	waited, ok, err := k.WaitResources(ctx, ch, "mixed", migMode, migDevices, 20*time.Second)
	if !waited || !ok || err != nil {
		t.Fatalf("WaitResources = %v, %v, %v", waited, ok, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("success after %s: the settle time was waited", d)
	}
}

// Replicas beyond the bound are refused: 2^62 × 4 devices overflows to 0.
func TestSharingReplicasBounded(t *testing.T) {
	for _, tc := range []struct {
		replicas string
		bad      bool
	}{{"4", false}, {"65536", false}, {"65537", true}, {"4611686018427387904", true}} {
		cfg := "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/mig-1g.18gb\n      replicas: " + tc.replicas + "\n"
		res, err := sharing.Parse([]byte(cfg))
		if tc.bad != errors.Is(err, sharing.ErrReplicas) {
			t.Fatalf("replicas %s: %v, %v", tc.replicas, res, err)
		}
		if !tc.bad {
			s := &sharing.Config{Resources: res}
			if got := s.Advertised(map[corev1.ResourceName]int64{"nvidia.com/mig-1g.18gb": 4})["nvidia.com/mig-1g.18gb"]; got <= 0 {
				t.Errorf("replicas %s: advertised %d", tc.replicas, got)
			}
		}
	}
	// The wait fails at once with the reason, instead of taking 0 for the
	// expected devices.
	ctx := context.Background()
	pod := readyPod("plugin", "u", pluginLabels)
	pod.Spec.Containers = []corev1.Container{{Name: "config-manager", Env: []corev1.EnvVar{{Name: "CONFIG_FILE_SRCDIR", Value: "/available-configs"}, {Name: "DEFAULT_CONFIG", Value: "huge"}},
		VolumeMounts: []corev1.VolumeMount{{Name: "cfg", MountPath: "/available-configs"}}}}
	pod.Spec.Volumes = []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "ts"}}}}}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "ts"}, Data: map[string]string{
		"huge": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/mig-1g.18gb\n      replicas: 4611686018427387904\n"}}
	c := fake.NewClientset(gpuNode(corev1.ResourceList{"nvidia.com/mig-1g.18gb": resource.MustParse("0")}), pod, cm)
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}}
	if _, _, err := k.ServedBy(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, mig := swapExposed()
	waited, ok, err := k.WaitResources(ctx, changeOn(record.ServedByDevicePlugin), "mixed", map[string]bool{"GPU-0": true}, mig, time.Minute)
	if !waited || ok || !errors.Is(err, sharing.ErrReplicas) || time.Since(start) > 10*time.Second {
		t.Fatalf("WaitResources = %v, %v, %v after %s", waited, ok, err, time.Since(start))
	}
}

// A retry's wait that finds the new plugin Ready for longer than the
// settle time (its Ready condition's transition) takes the figures at once.
func TestWaitResourcesPluginReadyBefore(t *testing.T) {
	ctx := context.Background()
	newPod := readyPod("plugin-new", "u-new", pluginLabels)
	newPod.Status.Conditions[0].LastTransitionTime = metav1.NewTime(time.Now().Add(-time.Minute))
	c := fake.NewClientset(swapNode(), newPod)
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}, PluginSettle: 30 * time.Second}
	ch := changeOn(record.ServedByDevicePlugin, "nvidia-dra-driver-gpu/plugin-old/u-old")
	migMode, migDevices := swapExposed()
	if waited, ok, err := k.WaitResources(ctx, ch, "mixed", migMode, migDevices, 3*time.Second); !waited || !ok || err != nil {
		t.Fatalf("WaitResources = %v, %v, %v", waited, ok, err)
	}
	// Ready 5 s ago: 25 s to go.
	newPod.Status.Conditions[0].LastTransitionTime = metav1.NewTime(time.Now().Add(-5 * time.Second))
	if _, err := c.CoreV1().Pods(newPod.Namespace).UpdateStatus(ctx, newPod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := k.WaitResources(ctx, ch, "mixed", migMode, migDevices, 1500*time.Millisecond); ok || err == nil || !strings.Contains(err.Error(), "waiting 30s after") {
		t.Fatalf("Ready 5 s ago: ok %v, err %v", ok, err)
	}
}

// changeOn is a change served by path whose listed device plugin pods
// ("namespace/name/uid") are old.
func changeOn(path string, old ...string) *journal.Change {
	ch := &journal.Change{ServedBy: path}
	ch.NotePlugins(old)
	return ch
}
