package gpus_test

import (
	"strings"
	"testing"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// A device-filter with a PCI subsystem id matches the GPUs NVML reports it
// for (the simulated H200 reports the measured 0x18BF10DE) and no other.
func TestApplySubsystemDeviceFilter(t *testing.T) {
	f := testsupport.ParseSpec(t, `version: v1
mig-configs:
  by-subsystem:
    - device-filter: ["0x233510DE:0x18BF10DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"7g.141gb": 1}
    - device-filter: ["0x20B010DE"]
      devices: all
      mig-enabled: false
`)
	s := testsupport.NewSim(t, "h200x1,a100-40gbx1", nvmlsim.Options{})
	res, err := testsupport.ApplyConfig(t, s, f, "by-subsystem", gpus.ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changed) != 1 || res.Changed[0] != 0 {
		t.Fatalf("changed %v, want [0]", res.Changed)
	}
	insts, err := s.Instances(0)
	if err != nil || len(insts) != 1 || insts[0].Profile != "7g.141gb" || insts[0].ID != 0 {
		t.Fatalf("GPU 0 instances %+v (%v), want 7g.141gb as GI 0", insts, err)
	}
}

// Ampere with a host client attached: SetMigMode leaves the mode pending
// (activation IN_USE); the apply resets just that GPU and converges.
func TestApplyAmpereClientAttachedResets(t *testing.T) {
	s := testsupport.NewSim(t, "a30x1", nvmlsim.Options{})
	res, err := testsupport.ApplyConfig(t, s, nil, "all-1g.6gb", gpus.ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Reset) != 1 || len(res.RebootGPUs) != 0 {
		t.Fatalf("reset %v reboot %v, want a reset of GPU 0", res.Reset, res.RebootGPUs)
	}
	insts, _ := s.Instances(0)
	if len(insts) != 4 || insts[0].ID != 3 {
		t.Fatalf("instances %+v, want four 1g with the first as GI 3", insts)
	}
}

// A config names a GPU NVML cannot open when an entry lists its index or
// says devices: all (also under a device-filter: the model of a GPU that
// cannot be opened is unknown); Discover lists such a GPU in Unusable, not
// in Devices.
func TestUnusableNamed(t *testing.T) {
	f := testsupport.ParseSpec(t, `version: v1
mig-configs:
  all:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  others:
    - devices: [0, 2]
      mig-enabled: false
  one:
    - devices: [1]
      mig-enabled: true
      mig-devices: {}
  filtered:
    - device-filter: ["0x233510DE"]
      devices: all
      mig-enabled: true
      mig-devices: {}
`)
	s := testsupport.NewSim(t, "h200x3", nvmlsim.Options{})
	if err := s.SetHandleError(1, "ERROR_NO_PERMISSION"); err != nil {
		t.Fatal(err)
	}
	n, err := gpus.Discover(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Devices) != 2 || len(n.Unusable) != 1 || n.Unusable[0].Index != 1 || n.Unusable[0].Return != "ERROR_NO_PERMISSION" {
		t.Fatalf("devices %d, unusable %+v", len(n.Devices), n.Unusable)
	}
	for name, want := range map[string]bool{"all": true, "others": false, "one": true, "filtered": true} {
		if got := len(gpus.UnusableNamed(f.Spec, name, n.Unusable)) == 1; got != want {
			t.Errorf("config %s names GPU 1: %v, want %v", name, got, want)
		}
	}
	if msg := gpus.UnusableReason("one", n.Unusable, false); !strings.Contains(msg, "GPU 1") || !strings.Contains(msg, "ERROR_NO_PERMISSION") {
		t.Errorf("reason %q", msg)
	}
}
