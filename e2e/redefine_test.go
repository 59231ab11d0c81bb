package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// The config file is edited: the same config name, a new definition. The
// agent applies it as a new request (no --reapply-on-drift), with a record
// of its own naming the hash before and after, and raises no drift.
func TestEditedDefinitionIsANewRequest(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	file := filepath.Join(t.TempDir(), "config.yaml")
	write := func(devices string) {
		t.Helper()
		y := "version: v1\nmig-configs:\n  mine:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {" + devices + "}\n"
		if err := os.WriteFile(file, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`"1g.18gb": 7`)
	o := (&Opts{Node: node, Sim: "h200x1"}).Fill(t)
	o.Extra = append(o.Extra, "--config-file", file)
	StartAgent(t, o)
	SelectConfig(t, c, node, "mine")
	first := WaitState(t, c, node, record.StateSuccess, "mine", 60*time.Second)

	write(`"3g.71gb": 2`)
	var rec record.ChangeRecord
	WaitFor(t, 60*time.Second, "a record of the new definition", func() bool {
		n := GetNode(t, c, node)
		rec = LastChange(t, n)
		return n.Labels[record.LabelState] == record.StateSuccess && rec.ConfigHash != first.ConfigHash
	})
	if rec.Config != "mine" || rec.PreviousConfig != "mine" || rec.PreviousConfigHash != first.ConfigHash || len(rec.GPUsChanged) != 1 {
		t.Errorf("record %+v; first hash %s", rec, first.ConfigHash)
	}
	if g := rec.Geometry["0"]; len(g) != 2 {
		t.Errorf("geometry after the edit %v, want two 3g.71gb", rec.Geometry)
	}
	if n := len(nodeEvents(t, c, node, record.ReasonDrift)); n != 0 {
		t.Errorf("%d drift events for an edited definition", n)
	}
}
