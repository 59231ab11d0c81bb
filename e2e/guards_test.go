package e2e

// Issue 19, guards that hold when the agent itself is in trouble: one
// reboot per change across restarts and a lost journal, no journal no
// change, one agent per node, no right to record no change, records that
// always land, bounded reads of the files the user names.

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/agent"
	"github.com/migagent/mig-agent/internal/kubetest"
)

// grReadyz returns the status code of the agent's /readyz (0: no answer).
func grReadyz(a *Agent) int {
	resp, err := http.Get(a.Metrics + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// grAlive fails the test when the agent exited (a simulated reboot exits 0).
func grAlive(t *testing.T, a *Agent, what string) {
	t.Helper()
	if code, exited := a.Wait(0); exited {
		t.Fatalf("%s: the agent exited (code %d): a reboot or a crash", what, code)
	}
}

// Item 1: three restarts after a failed post-reboot check leave one reboot,
// and so does a restart with the journal lost (the rebooting record on the
// Node counts); a new label value is a new change and may reboot once.
func TestGuardOneRebootAcrossRestarts(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Sim: "a100-40gbx1", Extra: []string{"--sim-no-reset", "--reboot-method", "sim"}}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.5gb")
	if code, exited := a.Wait(30 * time.Second); !exited || code != 0 {
		t.Fatalf("no simulated reboot (exited %v, code %d)", exited, code)
	}
	// The machine came back but the GPU did not take the new mode.
	stillPending := func() {
		sim := rbReadSim(t, o.SimState)
		sim.gpu(0)["migCurrent"], sim.gpu(0)["migPending"] = false, true
		sim.write(t, o.SimState)
	}
	stillPending()
	a2 := StartAgent(t, o)
	WaitState(t, c, node, agent.StateFailed, "all-1g.5gb", 30*time.Second)
	grAlive(t, a2, "the failed post-reboot check")
	a2.Stop()

	restart := func(what string) {
		t.Helper()
		before := len(History(t, GetNode(t, c, node)))
		a := StartAgent(t, o)
		WaitFor(t, 30*time.Second, what+": a new record", func() bool {
			_, exited := a.Wait(0)
			return exited || len(History(t, GetNode(t, c, node))) > before
		})
		time.Sleep(time.Second) // a reboot would come right after the record
		grAlive(t, a, what)
		rec := LastChange(t, GetNode(t, c, node))
		if rec.Result != agent.StateFailed || !strings.Contains(rec.Reason, "not rebooting again") {
			t.Errorf("%s: last record %s %q, want failed: not rebooting again", what, rec.Result, rec.Reason)
		}
		if b := rbReadSim(t, o.SimState).bootCount(); b != 1 {
			t.Fatalf("%s: boot count %d, want 1: a second reboot for one change", what, b)
		}
		a.Stop()
	}
	for i := range 3 {
		restart("restart " + string(rune('1'+i)))
	}
	// The journal is lost (a reinstall, a wiped state dir): the rebooting
	// record on the Node still says the reboot was made.
	if err := os.Remove(filepath.Join(o.StateDir, "journal.json")); err != nil {
		t.Fatal(err)
	}
	restart("restart without a journal")

	// A new value of the label is a new change: it may reboot once.
	a5 := StartAgent(t, o)
	SelectConfig(t, c, node, "all-2g.10gb")
	if code, exited := a5.Wait(30 * time.Second); !exited || code != 0 {
		t.Fatalf("a new label value did not get its reboot (exited %v, code %d)\n%s", exited, code, a5.Log())
	}
	if b := rbReadSim(t, o.SimState).bootCount(); b != 2 {
		t.Errorf("boot count %d after the new change's reboot, want 2", b)
	}
}

// Item 2: with the state dir read-only, nothing is touched: state failed
// with the reason, a Warning Event, the failed metric, /readyz not ready.
func TestGuardReadOnlyStateDir(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := (&Opts{Node: node, Sim: "h200x2"}).Fill(t)
	if err := os.MkdirAll(o.StateDir, 0o750); err != nil {
		t.Fatal(err)
	}
	// A read-only bind mount of the state dir in a private mount namespace:
	// read-only for root too, as a read-only file system is.
	o.Wrapper = []string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && shift && exec "$@"`, "sh", o.StateDir}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, agent.StateFailed, "all-1g.18gb", 30*time.Second)
	if !strings.Contains(rec.Reason, "journal") || !strings.Contains(rec.Reason, "cannot be written") {
		t.Errorf("reason %q does not say the journal cannot be written", rec.Reason)
	}
	for _, g := range disProfiles(t, o.Sim, o.SimState) {
		if g.MigMode.Current || g.MigMode.Pending || len(g.Instances) != 0 {
			t.Errorf("GPU %d was touched: MIG %v/%v, %d instances", g.Index, g.MigMode.Current, g.MigMode.Pending, len(g.Instances))
		}
	}
	WaitFor(t, 10*time.Second, "a Warning Event "+agent.ReasonJournal, func() bool {
		return len(nodeEvents(t, c, node, agent.ReasonJournal)) > 0
	})
	if code := grReadyz(a); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz answered %d with an unwritable journal, want 503", code)
	}
	if m := a.Scrape(t); !strings.Contains(m, `migagent_state{state="failed"} 1`) {
		t.Errorf("migagent_state does not say failed:\n%s", grLines(m, "migagent_state{"))
	}
	if _, err := os.Stat(filepath.Join(o.StateDir, "journal.json")); !os.IsNotExist(err) {
		t.Errorf("a journal was written in the read-only state dir: %v", err)
	}
	grAlive(t, a, "read-only state dir")
}

// grLines returns the lines of text that start with prefix.
func grLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Item 3: one agent per node: a second one on the same state dir exits 1
// with a message that says so, and the first keeps running.
func TestGuardOneAgentPerStateDir(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Sim: "h200x1"}
	a := StartAgent(t, o)
	waitReady(t, a)
	b := StartAgent(t, o)
	code, exited := b.Wait(10 * time.Second)
	if !exited || code != 1 {
		t.Fatalf("the second agent: exited %v, code %d, want exit 1", exited, code)
	}
	if !strings.Contains(b.Log(), "another mig-agent is running") || !strings.Contains(b.Log(), o.StateDir) {
		t.Errorf("the second agent's message does not say why:\n%s", b.Log())
	}
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, agent.StateSuccess, "all-1g.18gb", 30*time.Second)
	if n := len(History(t, GetNode(t, c, node))); n != 1 {
		t.Errorf("%d records for one label change, want 1", n)
	}
	grAlive(t, a, "the first agent")
}
