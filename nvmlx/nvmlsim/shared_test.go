package nvmlsim_test

import (
	"path/filepath"
	"testing"

	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/profiles"
)

// Two simulators on one state file see each other's changes, as two
// processes see the same real GPUs.
func TestSimSharedStateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	a, err := nvmlx.NewSim("h200x1", nvmlsim.Options{StatePath: path})
	if err != nil {
		t.Fatal(err)
	}
	b, err := nvmlx.NewSim("h200x1", nvmlsim.Options{StatePath: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetMigMode(0, true); err != nil {
		t.Fatal(err)
	}
	devs, _ := b.Devices()
	if !devs[0].MigMode.Current {
		t.Fatal("b does not see the MIG mode a set")
	}
	gi, err := b.CreateGPUInstance(0, 0, profiles.Placement{Start: 0, Size: 8})
	if err != nil {
		t.Fatal(err)
	}
	insts, _ := a.Instances(0)
	if len(insts) != 1 || insts[0].ID != gi {
		t.Fatalf("a sees %v, want the instance b created", insts)
	}
	// a's next change builds on b's: the 7g instance blocks another one.
	if _, err := a.CreateGPUInstance(0, 0, profiles.Placement{Start: 0, Size: 8}); err == nil {
		t.Fatal("a created a second 7g instance over b's")
	}
	if err := nvmlsim.Reboot(path); err != nil {
		t.Fatal(err)
	}
	if insts, _ := b.Instances(0); len(insts) != 0 {
		t.Fatalf("after sim reboot b still sees %v", insts)
	}
	if a.BootCount() != 1 {
		t.Fatalf("boot count %d, want 1", a.BootCount())
	}
}
