package gpus

import (
	"maps"
	"testing"

	"github.com/migagent/mig-agent/nvmlx"
)

// Exposed: every GPU's MIG mode, and the MIG devices of the GPUs whose MIG
// mode is on (one H200 with MIG on and two MIG devices, one GPU with MIG off).
func TestExposed(t *testing.T) {
	n := &Inventory{
		Devices: []nvmlx.Device{{UUID: "GPU-0", MigCapable: true, MigMode: nvmlx.MigMode{Current: true}}, {UUID: "GPU-1", MigCapable: true}},
		Instances: [][]nvmlx.GPUInstance{
			{{ComputeInstances: []nvmlx.ComputeInstance{{UUID: "MIG-b", Profile: "1g.18gb"}}}, {ComputeInstances: []nvmlx.ComputeInstance{{UUID: "MIG-a", Profile: "3g.71gb"}}}},
			nil,
		},
	}
	migMode, migDevices := n.Exposed()
	if want := map[string]bool{"GPU-0": true, "GPU-1": false}; !maps.Equal(migMode, want) {
		t.Errorf("migMode = %v, want %v", migMode, want)
	}
	if want := map[string]string{"MIG-a": "3g.71gb", "MIG-b": "1g.18gb"}; !maps.Equal(migDevices, want) {
		t.Errorf("migDevices = %v, want %v", migDevices, want)
	}
}
