package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// --reboot-method kured: a MIG mode change that needs a reboot writes
// kured's sentinel and waits in rebooting; the agent reboots nothing
// itself (the simulated machine's boot count stays 0, the mode stays
// pending), and a restart on the same boot neither writes it again nor
// removes it. After the boot (kured's reboot, simulated by `sim reboot`)
// the change resumes to success and the sentinel of the earlier boot is
// removed, as on a host whose /var/run survives a reboot.
func TestRebootThroughKuredSentinel(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	sentinel := filepath.Join(t.TempDir(), "reboot-required")
	o := &Opts{Node: node, Sim: "a100-40gbx2", Extra: []string{"--sim-no-reset", "--reboot-method", "kured", "--reboot-sentinel", sentinel}}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.5gb")
	rec := WaitState(t, c, node, record.StateRebooting, "all-1g.5gb", 30*time.Second)
	if !rec.Reboot {
		t.Errorf("rebooting record without reboot:true: %+v", rec)
	}
	WaitFor(t, 10*time.Second, "the sentinel", func() bool { _, err := os.Stat(sentinel); return err == nil })
	body, err := os.ReadFile(sentinel)
	if err != nil || !strings.HasPrefix(string(body), "*** System restart required ***\nmig-agent: ") || !strings.Contains(string(body), "all-1g.5gb") {
		t.Fatalf("sentinel %q, %v", body, err)
	}
	info, _ := os.Stat(sentinel)
	time.Sleep(2 * time.Second)
	if _, exited := a.Wait(time.Millisecond); exited {
		t.Fatal("the agent exited: --reboot-method kured must leave the reboot to kured")
	}
	if b := rbReadSim(t, o.SimState).bootCount(); b != 0 {
		t.Fatalf("boot count %d: something rebooted besides kured", b)
	}
	for _, g := range disProfiles(t, o.Sim, o.SimState) {
		if g.MigMode.Current || !g.MigMode.Pending {
			t.Fatalf("GPU %d before the reboot: MIG current %v pending %v", g.Index, g.MigMode.Current, g.MigMode.Pending)
		}
	}
	if v := rbMetric(a.Scrape(t), "migagent_reboots_total"); v != "1" {
		t.Errorf("migagent_reboots_total = %q", v)
	}
	a.Stop()

	// Restarted on the same boot: still waiting, the sentinel as it was.
	a2 := StartAgent(t, o)
	WaitFor(t, 20*time.Second, "the restarted agent waiting for the reboot", func() bool {
		return strings.Contains(a2.Log(), "waiting for the reboot requested for this change")
	})
	if again, err := os.Stat(sentinel); err != nil || !again.ModTime().Equal(info.ModTime()) {
		t.Fatalf("the sentinel after a restart on the same boot: %v, %v", again, err)
	}
	a2.Stop()

	// kured reboots the node.
	if _, errOut, code := RunCLI(t, "sim", "reboot", "--sim-state", o.SimState); code != 0 {
		t.Fatalf("sim reboot: %d %s", code, errOut)
	}
	StartAgent(t, o)
	rec = WaitState(t, c, node, record.StateSuccess, "all-1g.5gb", 30*time.Second)
	if !rec.Reboot || len(rec.GPUsChanged) != 2 {
		t.Errorf("final record: reboot %v, gpusChanged %v", rec.Reboot, rec.GPUsChanged)
	}
	if _, err := os.Stat(sentinel); !os.IsNotExist(err) {
		t.Errorf("the sentinel of the earlier boot is still there: %v", err)
	}
	if b := rbReadSim(t, o.SimState).bootCount(); b != 1 {
		t.Errorf("boot count %d, want the one reboot", b)
	}
}
