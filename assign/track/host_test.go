package track

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// Standalone: a process on a MIG device, as NVML reports it, is an entry
// of the host's trail in the file beside the journal; it ends when the
// process goes, and a restarted agent keeps it closed and adds nothing.
func TestHostTrailFromNVMLProcesses(t *testing.T) {
	// Opened as the daemon opens it: idle, NVML initialized per session.
	g, err := nvmlx.Open(nvmlx.Options{Backend: "sim:h200x1", Idle: true})
	if err != nil {
		t.Fatal(err)
	}
	s := g.(*nvmlx.Sim)
	f := testsupport.ParseSpec(t, "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 7}\n")
	if _, err := testsupport.ApplyConfig(t, s, f, "c", gpus.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	insts, err := s.Instances(0)
	inits0, _ := s.Sessions()
	if err != nil {
		t.Fatal(err)
	}
	gi := insts[1]
	if err := s.AddProcess(0, nvmlx.Process{PID: 4242, GIID: gi.ID, CIID: gi.ComputeInstances[0].ID, Name: "train.py"}); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC))
	path := filepath.Join(t.TempDir(), assign.FileName)
	met := &fakeMetrics{}
	agent := func() *Tracker {
		return &Tracker{Source: &Processes{GPU: s}, Resolve: &Inventory{GPU: s, Log: testsupport.Discard()},
			Store: &assign.FileStore{Path: path, Node: "host-1"}, Metrics: met, Clock: clk, Log: testsupport.Discard(), Interval: time.Second}
	}
	tr := agent()
	if err := tr.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(met.held) != 1 || met.held[0].UUID != gi.ComputeInstances[0].UUID || met.held[0].Pod != "train.py" ||
		met.held[0].Container != "pid:4242" || met.held[0].Namespace != HostNamespace {
		t.Fatalf("metric shows %+v", met.held)
	}
	clk.Step(time.Minute)
	if err := s.RemoveProcess(0, 4242); err != nil {
		t.Fatal(err)
	}
	if err := tr.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Minute)
	if err := agent().Poll(context.Background()); err != nil { // a restart
		t.Fatal(err)
	}
	h, err := assign.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if h.Node != "host-1" || len(h.Entries) != 1 {
		t.Fatalf("history %+v", h)
	}
	e := h.Entries[0]
	if e.End == nil || e.End.Sub(e.Start) != time.Minute || e.EndedBy != "gone" || e.Device.Profile != "1g.18gb" || e.Device.Placement != "1+1" {
		t.Errorf("entry %+v", e)
	}
	if len(met.held) != 0 {
		t.Errorf("metric still shows %+v", met.held)
	}
	// NVML is not held between polls.
	if inits, shutdowns := s.Sessions(); inits != shutdowns || inits-inits0 > 5 {
		t.Errorf("NVML sessions: %d inits, %d shutdowns (%d since the polls began); want every one closed, one per poll and one read of the inventory", inits, shutdowns, inits-inits0)
	}
}
