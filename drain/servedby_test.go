package drain

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// gpuNode is n1 with allocatable.
func gpuNode(allocatable corev1.ResourceList) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Allocatable: allocatable}}
}

func TestServedBy(t *testing.T) {
	mig := corev1.ResourceList{"nvidia.com/mig-1g.18gb": resource.MustParse("7"), "cpu": resource.MustParse("8")}
	gone := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("0")} // the device plugin left: 0 stays
	slice := staticSlice("n1", map[string]string{"gpu-0-mig-1g18gb-19-0": "MIG-a"})
	for _, tc := range []struct {
		name               string
		objects            []runtime.Object
		path, conflictPart string
	}{
		{name: "nothing", objects: []runtime.Object{gpuNode(nil)}},
		{name: "device plugin", objects: []runtime.Object{gpuNode(mig)}, path: record.ServedByDevicePlugin},
		{name: "DRA", objects: []runtime.Object{gpuNode(gone), slice}, path: record.ServedByDRA},
		{name: "DRA driver without devices", objects: []runtime.Object{gpuNode(mig), staticSlice("n1", nil)}, path: record.ServedByDevicePlugin},
		{name: "both", objects: []runtime.Object{gpuNode(mig), slice},
			conflictPart: "the Node's allocatable has nvidia.com/mig-1g.18gb, and the NVIDIA DRA driver announces 1 devices"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &Disruptor{Client: clientset.Wrap(fake.NewClientset(tc.objects...)), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}}
			path, conflict, err := k.ServedBy(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if path != tc.path || (tc.conflictPart == "") != (conflict == "") || !strings.Contains(conflict, tc.conflictPart) {
				t.Fatalf("ServedBy = %q, %q; want %q, %q", path, conflict, tc.path, tc.conflictPart)
			}
		})
	}
}

// exposedGPUs is one H200 with MIG on and two MIG devices, and one GPU with
// MIG off, as WaitResources takes them.
func exposedGPUs() (map[string]bool, map[string]string) {
	return map[string]bool{"GPU-0": true, "GPU-1": false}, map[string]string{"MIG-b": "1g.18gb", "MIG-a": "1g.18gb"}
}

func TestWaitResourcesDRA(t *testing.T) {
	if got := announced(exposedGPUs()); strings.Join(got, ",") != "GPU-1,MIG-a,MIG-b" {
		t.Fatalf("announced = %v", got)
	}
	old := staticSlice("n1", map[string]string{"gpu-0-mig-3g71gb-9-0": "MIG-old", "gpu-1": "GPU-1"})
	oldPod := readyPod("kubelet-plugin-old", "u-old", draPluginLabels)
	c := fake.NewClientset(gpuNode(nil), old, oldPod)
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}}
	if path, _, err := k.ServedBy(context.Background()); err != nil || path != record.ServedByDRA {
		t.Fatalf("ServedBy = %q, %v", path, err)
	}
	// The plugin pod that read the GPUs before the change.
	pods, err := k.DevicePlugins(context.Background())
	if err != nil || len(pods) != 1 {
		t.Fatalf("DevicePlugins = %v, %v", pods, err)
	}
	ch := changeOn(record.ServedByDRA, pods...)
	migMode, migDevices := exposedGPUs()
	// The old plugin's slice: not converged, and the error says why.
	waited, ok, err := k.WaitResources(context.Background(), ch, "", migMode, migDevices, 1500*time.Millisecond)
	if !waited || ok || err == nil || !strings.Contains(err.Error(), "1 not on the GPUs [MIG-old], 2 missing [MIG-a MIG-b]") {
		t.Fatalf("WaitResources = %v, %v, %v", waited, ok, err)
	}
	// The slices announce the new devices, but no plugin pod started after
	// the change runs yet (the old one still does, then none): no success.
	s := staticSlice("n1", map[string]string{"gpu-0-mig-1g18gb-19-0": "MIG-a", "gpu-0-mig-1g18gb-19-1": "MIG-b", "gpu-1": "GPU-1"})
	s.Name = old.Name
	if _, err := c.ResourceV1().ResourceSlices().Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waited, ok, err = k.WaitResources(context.Background(), ch, "", migMode, migDevices, 1500*time.Millisecond)
	if !waited || ok || err == nil || !strings.Contains(err.Error(), "DRA kubelet plugin pod that read the GPUs before the change still runs: nvidia-dra-driver-gpu/kubelet-plugin-old") {
		t.Fatalf("WaitResources with the old plugin pod = %v, %v, %v", waited, ok, err)
	}
	if err := c.CoreV1().Pods(oldPod.Namespace).Delete(context.Background(), oldPod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waited, ok, err = k.WaitResources(context.Background(), ch, "", migMode, migDevices, 1500*time.Millisecond)
	if !waited || ok || err == nil || !strings.Contains(err.Error(), "no DRA kubelet plugin pod started after the change is Running and Ready") {
		t.Fatalf("WaitResources with no plugin pod = %v, %v, %v", waited, ok, err)
	}
	if _, err := c.ResourceV1().ResourceSlices().Update(context.Background(), old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The restarted plugin runs and republishes the new devices while the agent waits.
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, _ = c.CoreV1().Pods("nvidia-dra-driver-gpu").Create(context.Background(), readyPod("kubelet-plugin-new", "u-new", draPluginLabels), metav1.CreateOptions{})
		s := staticSlice("n1", map[string]string{"gpu-0-mig-1g18gb-19-0": "MIG-a", "gpu-0-mig-1g18gb-19-1": "MIG-b", "gpu-1": "GPU-1"})
		s.Name = old.Name
		_, _ = c.ResourceV1().ResourceSlices().Update(context.Background(), s, metav1.UpdateOptions{})
	}()
	waited, ok, err = k.WaitResources(context.Background(), ch, "", migMode, migDevices, 10*time.Second)
	if !waited || !ok || err != nil {
		t.Fatalf("WaitResources = %v, %v, %v", waited, ok, err)
	}
}

var draPluginLabels = map[string]string{"app.kubernetes.io/name": "dra-driver-nvidia-gpu", "dra-driver-nvidia-gpu-component": "kubelet-plugin"}

// readyPod is a plugin pod on n1, Running and Ready.
func readyPod(name, uid string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "nvidia-dra-driver-gpu", Name: name, UID: types.UID(uid), Labels: labels,
		OwnerReferences: daemonSetOwner(name)},
		Spec:   corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
}

// The DRA kubelet plugin pod is one of the pods restarted after a change.
func TestDevicePluginsListsDRAPlugin(t *testing.T) {
	pod := func(name string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "nvidia-dra-driver-gpu", Name: name, UID: "u-" + "x", Labels: labels,
			OwnerReferences: daemonSetOwner(name)},
			Spec: corev1.PodSpec{NodeName: "n1"}}
	}
	c := fake.NewClientset(pod("dra-driver-nvidia-gpu-kubelet-plugin-x7k2p", map[string]string{
		"app.kubernetes.io/name": "dra-driver-nvidia-gpu", "dra-driver-nvidia-gpu-component": "kubelet-plugin"}),
		pod("dra-driver-nvidia-gpu-controller-1", map[string]string{"dra-driver-nvidia-gpu-component": "controller"}))
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}}
	got, err := k.DevicePlugins(context.Background())
	if err != nil || len(got) != 1 || got[0] != "nvidia-dra-driver-gpu/dra-driver-nvidia-gpu-kubelet-plugin-x7k2p/u-x" {
		t.Fatalf("DevicePlugins = %v, %v", got, err)
	}
}
