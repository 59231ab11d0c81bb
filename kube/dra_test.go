package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/internal/kclient/clientset"
	"github.com/migagent/mig-agent/internal/readonce"
	"github.com/migagent/mig-agent/internal/testsupport"
	"github.com/migagent/mig-agent/settings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/record"
)

// nvidiaSlice is the NVIDIA DRA driver's one slice for n1 without
// DynamicMIG (driver.go publishResources), devices by name → uuid.
func nvidiaSlice(devs ...[2]string) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "00000-gpu.nvidia.com-n1-abcde"},
		Spec: resourcev1.ResourceSliceSpec{Driver: NVIDIADRADriver, NodeName: ptr.To("n1"), Pool: resourcev1.ResourcePool{Name: "n1"}}}
	for _, d := range devs {
		typ := "mig"
		if strings.HasPrefix(d[1], "GPU-") {
			typ = "gpu"
		}
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: d[0], Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"type": {StringValue: ptr.To(typ)}, "uuid": {StringValue: ptr.To(d[1])}}})
	}
	return s
}

func gpuNode(allocatable corev1.ResourceList) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Allocatable: allocatable}}
}

func TestServedBy(t *testing.T) {
	mig := corev1.ResourceList{"nvidia.com/mig-1g.18gb": resource.MustParse("7"), "cpu": resource.MustParse("8")}
	gone := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("0")} // the device plugin left: 0 stays
	slice := nvidiaSlice([2]string{"gpu-0-mig-1g18gb-19-0", "MIG-a"})
	for _, tc := range []struct {
		name               string
		objects            []runtime.Object
		path, conflictPart string
	}{
		{name: "nothing", objects: []runtime.Object{gpuNode(nil)}},
		{name: "device plugin", objects: []runtime.Object{gpuNode(mig)}, path: record.ServedByDevicePlugin},
		{name: "DRA", objects: []runtime.Object{gpuNode(gone), slice}, path: record.ServedByDRA},
		{name: "DRA driver without devices", objects: []runtime.Object{gpuNode(mig), nvidiaSlice()}, path: record.ServedByDevicePlugin},
		{name: "both", objects: []runtime.Object{gpuNode(mig), slice},
			conflictPart: "the Node's allocatable has nvidia.com/mig-1g.18gb, and the NVIDIA DRA driver announces 1 devices"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &Disruptor{Client: clientset.Wrap(fake.NewClientset(tc.objects...)), Log: testsupport.Discard(), Node: "n1", S: &settings.Settings{}}
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

// inventory is one H200 with MIG on and two MIG devices, and one GPU with
// MIG off.
func inventory() *gpus.Inventory {
	return &gpus.Inventory{
		Devices: []nvmlx.Device{{UUID: "GPU-0", MigCapable: true, MigMode: nvmlx.MigMode{Current: true}}, {UUID: "GPU-1", MigCapable: true}},
		Instances: [][]nvmlx.GPUInstance{
			{{ComputeInstances: []nvmlx.ComputeInstance{{UUID: "MIG-b"}}}, {ComputeInstances: []nvmlx.ComputeInstance{{UUID: "MIG-a"}}}},
			nil,
		},
	}
}

func TestWaitResourcesDRA(t *testing.T) {
	if got := ExpectedDRAUUIDs(inventory()); strings.Join(got, ",") != "GPU-1,MIG-a,MIG-b" {
		t.Fatalf("ExpectedDRAUUIDs = %v", got)
	}
	old := nvidiaSlice([2]string{"gpu-0-mig-3g71gb-9-0", "MIG-old"}, [2]string{"gpu-1", "GPU-1"})
	c := fake.NewClientset(gpuNode(nil), old)
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", S: &settings.Settings{}}
	if path, _, err := k.ServedBy(context.Background()); err != nil || path != record.ServedByDRA {
		t.Fatalf("ServedBy = %q, %v", path, err)
	}
	// The old plugin's slice: not converged, and the error says why.
	waited, ok, err := k.WaitResources(context.Background(), "", inventory(), 1500*time.Millisecond)
	if !waited || ok || err == nil || !strings.Contains(err.Error(), "1 not on the GPUs [MIG-old], 2 missing [MIG-a MIG-b]") {
		t.Fatalf("WaitResources = %v, %v, %v", waited, ok, err)
	}
	// The restarted plugin republishes the new devices while the agent waits.
	go func() {
		time.Sleep(300 * time.Millisecond)
		s := nvidiaSlice([2]string{"gpu-0-mig-1g18gb-19-0", "MIG-a"}, [2]string{"gpu-0-mig-1g18gb-19-1", "MIG-b"}, [2]string{"gpu-1", "GPU-1"})
		s.Name = old.Name
		_, _ = c.ResourceV1().ResourceSlices().Update(context.Background(), s, metav1.UpdateOptions{})
	}()
	waited, ok, err = k.WaitResources(context.Background(), "", inventory(), 10*time.Second)
	if !waited || !ok || err != nil {
		t.Fatalf("WaitResources = %v, %v, %v", waited, ok, err)
	}
}

// The DRA kubelet plugin pod is one of the pods restarted after a change.
func TestDevicePluginsListsDRAPlugin(t *testing.T) {
	pod := func(name string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "nvidia-dra-driver-gpu", Name: name, UID: "u-" + "x", Labels: labels},
			Spec: corev1.PodSpec{NodeName: "n1"}}
	}
	c := fake.NewClientset(pod("dra-driver-nvidia-gpu-kubelet-plugin-x7k2p", map[string]string{
		"app.kubernetes.io/name": "dra-driver-nvidia-gpu", "dra-driver-nvidia-gpu-component": "kubelet-plugin"}),
		pod("dra-driver-nvidia-gpu-controller-1", map[string]string{"dra-driver-nvidia-gpu-component": "controller"}))
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", S: &settings.Settings{}}
	got, err := k.DevicePlugins(context.Background())
	if err != nil || len(got) != 1 || got[0] != "nvidia-dra-driver-gpu/dra-driver-nvidia-gpu-kubelet-plugin-x7k2p/u-x" {
		t.Fatalf("DevicePlugins = %v, %v", got, err)
	}
}

// One look at the node before a change (a readonce memo, as the reconciler
// makes it for checkNode and the device plugin list) reads the node's
// pods and ResourceSlices once, however many checks want them: the
// allocation path, another MIG manager (its pod, the DRA driver's
// DynamicMIG), the device plugin pods. Outside a look, each reads.
func TestOneLookReadsOnce(t *testing.T) {
	c := fake.NewClientset(gpuNode(nil), nvidiaSlice([2]string{"gpu-0", "GPU-a"}))
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", S: &settings.Settings{}}
	lists := func() map[string]int {
		n := map[string]int{}
		for _, a := range c.Actions() {
			if a.GetVerb() == "list" {
				n[a.GetResource().Resource]++
			}
		}
		c.ClearActions()
		return n
	}
	look := func(ctx context.Context) {
		if _, _, err := k.ServedBy(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := OtherManager(ctx, clientset.Wrap(c), nil, gpuNode(nil)); err != nil {
			t.Fatal(err)
		}
		if _, err := k.DevicePlugins(ctx); err != nil {
			t.Fatal(err)
		}
	}
	look(readonce.With(context.Background()))
	if n := lists(); n["pods"] != 1 || n["resourceslices"] != 1 {
		t.Errorf("one look listed %v; want pods and resourceslices once each", n)
	}
	look(context.Background())
	if n := lists(); n["pods"] != 2 || n["resourceslices"] != 2 {
		t.Errorf("without a look: %v; want each check to read (pods and resourceslices twice)", n)
	}
}
