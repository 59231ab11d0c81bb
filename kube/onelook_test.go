package kube

import (
	"context"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/internal/readonce"
	"github.com/migagent/mig-agent/settings"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/drain"
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

// One look at the node before a change (a readonce memo, as the reconciler
// makes it for checkNode and the device plugin list) reads the node's
// pods and ResourceSlices once, however many checks want them: the
// allocation path, another MIG manager (its pod, the DRA driver's
// DynamicMIG), the device plugin pods. Outside a look, each reads.
func TestOneLookReadsOnce(t *testing.T) {
	c := fake.NewClientset(gpuNode(nil), nvidiaSlice([2]string{"gpu-0", "GPU-a"}))
	k := &drain.Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}}
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
