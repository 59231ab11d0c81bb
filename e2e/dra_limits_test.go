package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// On a node NVIDIA's DRA driver serves, a config that cuts a GPU instance
// into compute instances ("1c.3g.71gb": 2) is refused before anything is
// touched, with a reason that names the driver's limit (its kubelet plugin
// knows only compute instances that fill their GPU instance: nvlib.go
// getGpuInfo, and exits at start on another, getMigDevices): state failed,
// nothing evicted, the GPUs as they were, the plugin's slices as they were.
// A config of whole instances then goes through.
func TestDRARefusesUnannouncedGeometry(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	drv := kubetest.NewName(t, "dra")
	kubetest.CreateNamespace(t, drv)
	cfg := disConfig(t, `version: v1
mig-configs:
  split:
    - devices: [0]
      mig-enabled: false
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "1c.3g.71gb": 2
  whole:
    - devices: [0]
      mig-enabled: false
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "3g.71gb": 2
`)
	o := (&Opts{Node: node, Sim: "h200x2", Extra: []string{"-f", cfg, "--resource-wait-timeout", "60s", "--operand-namespace", drv}}).Fill(t)
	dp := kubetest.StartDRAPlugin(t, c, node, drv, func() ([]kubetest.NVIDIADevice, error) { return draDevices(t, o), nil })
	WaitFor(t, 60*time.Second, "the DRA plugin to publish", func() bool { return dp.Counted() && len(announced(t, c, node)) == 2 })
	// The stand-in publishes what NVIDIA's plugin does: attributes and
	// capacities (nvidiadra.Details).
	list, err := c.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for _, sl := range list.Items {
		for _, d := range sl.Spec.Devices {
			mem := d.Capacity["memory"].Value
			if a := d.Attributes["architecture"]; a.StringValue == nil || *a.StringValue != "Hopper" || mem.Value() == 0 {
				t.Errorf("device %s: attributes %v, capacity %v", d.Name, d.Attributes, d.Capacity)
			}
		}
	}
	before := flReadSim(t, o.SimState)
	slices := announced(t, c, node)
	StartAgent(t, o)
	SelectConfig(t, c, node, "split")
	rec := flExpectFailed(t, c, node, "split", o.SimState, before,
		"NVIDIA's DRA driver announces only GPU instances that hold exactly one compute instance filling them", "GPU 1: 2×1c.3g.71gb")
	if rec.ServedBy != record.ServedByDRA {
		t.Errorf("servedBy %q", rec.ServedBy)
	}
	if len(eventuallyNodeEvents(t, c, node, record.ReasonInvalid)) == 0 {
		t.Errorf("no %s Event", record.ReasonInvalid)
	}
	if got := announced(t, c, node); len(got) != len(slices) {
		t.Errorf("the slices changed: %v, were %v", got, slices)
	}
	SelectConfig(t, c, node, "whole")
	WaitState(t, c, node, record.StateSuccess, "whole", 90*time.Second)
}
