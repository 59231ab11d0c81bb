package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// A node whose GPUs the DRA driver serves also carries NVIDIA's NICs: the
// Network Operator's device plugins advertise nvidia.com/hostdev and
// nvidia.com/rdma_shared_device_a in its allocatable, as the kubelet
// reports them. They are no GPU resource: the change is not refused as
// served by both paths, and it ends in success with the slices announcing
// the new devices.
func TestDRANodeWithNetworkOperatorResources(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/mig.strategy": "mixed"})
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		nics := corev1.ResourceList{"nvidia.com/hostdev": resource.MustParse("8"), "nvidia.com/rdma_shared_device_a": resource.MustParse("63")}
		n.Status.Capacity, n.Status.Allocatable = nics, nics.DeepCopy()
		_, err = c.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	drv := kubetest.NewName(t, "dra")
	kubetest.CreateNamespace(t, drv)
	o := (&Opts{Node: node, Sim: "h200x2", Extra: []string{"--resource-wait-timeout", "60s", "--operand-namespace", drv}}).Fill(t)
	dp := kubetest.StartDRAPlugin(t, c, node, drv, func() ([]kubetest.NVIDIADevice, error) { return draDevices(t, o), nil })
	WaitFor(t, 60*time.Second, "the DRA plugin to publish", func() bool { return dp.Counted() && len(announced(t, c, node)) == 2 })
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 90*time.Second)
	if rec.ServedBy != record.ServedByDRA || len(rec.GPUsChanged) != 2 {
		t.Errorf("record servedBy %q changed %v", rec.ServedBy, rec.GPUsChanged)
	}
	if got := len(announced(t, c, node)); got != 14 {
		t.Errorf("the slices announce %d devices, want 14 (7 per H200)", got)
	}
	if alloc := GetNode(t, c, node).Status.Allocatable; alloc.Name("nvidia.com/hostdev", resource.DecimalSI).Value() != 8 {
		t.Errorf("allocatable %v", alloc)
	}
}

// The DRA driver's chart installed with nameOverride gpu-dra labels its
// kubelet plugin pods "gpu-dra-component: kubelet-plugin", which no
// default selector names: the agent finds the pods by their DaemonSet,
// which runs the driver's gpu-kubelet-plugin, with no setting. The plugin
// is restarted after the change (it starts a second time) and the change
// ends in success with the new devices.
func TestDRAPluginNameOverrideRestarted(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/mig.strategy": "mixed"})
	drv := kubetest.NewName(t, "dra")
	kubetest.CreateNamespace(t, drv)
	o := (&Opts{Node: node, Sim: "h200x2", Extra: []string{"--resource-wait-timeout", "60s", "--operand-namespace", drv}}).Fill(t)
	dp := kubetest.StartDRAPluginNamed(t, c, node, drv, "gpu-dra", func() ([]kubetest.NVIDIADevice, error) { return draDevices(t, o), nil })
	WaitFor(t, 60*time.Second, "the DRA plugin to publish", func() bool { return dp.Counted() && len(announced(t, c, node)) == 2 })
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 90*time.Second)
	if rec.ServedBy != record.ServedByDRA || dp.Starts() < 2 {
		t.Errorf("servedBy %q, plugin starts %d (want a restart)", rec.ServedBy, dp.Starts())
	}
	if got := len(announced(t, c, node)); got != 14 {
		t.Errorf("the slices announce %d devices, want 14", got)
	}
}
