package reconcile_test

import (
	"context"
	"slices"
	"testing"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// fakeStartup counts the lifts of the startup taints, with the state the
// Node showed at each.
type fakeStartup struct {
	cluster *testsupport.FakeCluster
	at      []string
}

var _ reconcile.StartupTaints = (*fakeStartup)(nil)

func (f *fakeStartup) Lift(context.Context) (bool, error) {
	f.at = append(f.at, f.cluster.Seen().State)
	return true, nil
}

// The startup taints go only once the node holds what it asks: not after a
// config that fails for good (also on the passes after, which find it
// handled), not while a retryable failure waits, and once after the
// success; a node asked nothing has nothing to wait for.
func TestCoreStartupTaintsLiftedOnlyAfterSuccess(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	lift := &fakeStartup{cluster: c.cluster}
	c.d.Startup = lift
	c.cluster.SetLabel("no-such-config")
	if oc := c.pass(true, false); oc != reconcile.OutFailed {
		t.Fatalf("unknown config: outcome %v", oc)
	}
	if oc := c.pass(false, false); oc != reconcile.OutSuccess || len(lift.at) != 0 {
		t.Fatalf("a failed config lifted the startup taints (outcome %v, lifts %v)", oc, lift.at)
	}

	// A process no pod accounts for blocks the change: retried, never lifted.
	// (A new process: the first success lifted them in this one.)
	c.applied(t, "all-balanced")
	c.restart(t, nvmlsim.Options{})
	lift.at, c.d.Startup = nil, lift
	n, err := gpus.Discover(c.sim)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(n.Instances[0], func(gi nvmlx.GPUInstance) bool { return gi.Profile != "1g.18gb" })
	gi := n.Instances[0][i]
	stray := nvmlx.Process{PID: 4242, GIID: gi.ID, CIID: gi.ComputeInstances[0].ID, Name: "python"}
	if err := c.sim.AddProcess(0, stray); err != nil {
		t.Fatal(err)
	}
	c.cluster.SetLabel("all-1g.18gb")
	if oc := c.pass(false, false); oc != reconcile.OutRetry || len(lift.at) != 0 {
		t.Fatalf("a change waiting for its retry lifted the startup taints (outcome %v, lifts %v)", oc, lift.at)
	}
	if err := c.sim.RemoveProcess(0, stray.PID); err != nil {
		t.Fatal(err)
	}
	if oc := c.pass(false, true); oc != reconcile.OutSuccess {
		t.Fatalf("retry: outcome %v, record %+v", oc, c.cluster.Last())
	}
	wantSuccess(t, c, "all-1g.18gb")
	if !slices.Equal(lift.at, []string{record.StateSuccess}) {
		t.Fatalf("lifts %v, want one, after the success", lift.at)
	}
	c.pass(false, false)
	if len(lift.at) != 1 {
		t.Fatalf("lifted again: %v", lift.at)
	}

	// Nothing asked: nothing to wait for.
	bare := newCore(t, "h200x1", nvmlsim.Options{}, "")
	lift2 := &fakeStartup{cluster: bare.cluster}
	bare.d.Startup = lift2
	if oc := bare.pass(true, false); oc != reconcile.OutSuccess || len(lift2.at) != 1 {
		t.Fatalf("a node asked nothing: outcome %v, lifts %v", oc, lift2.at)
	}
}
