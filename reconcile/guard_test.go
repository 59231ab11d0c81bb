package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// The core under a lost rollout slot or a lost node: it stops before its
// next disruptive step and says so (issue findings 1, 2, 4).

// A slot lost at each disruptive step: the change stops before it (no
// eviction, no GPU step past it), fails with a reason naming the loss and
// the step, posts MigRolloutSlotLost, lifts the taint, and is retried.
func TestCoreStopsWhenSlotLost(t *testing.T) {
	for _, tc := range []struct {
		name      string
		okChecks  int
		wantEvict bool
		step      string
	}{
		{"before draining", 0, false, "draining the node"},
		{"before evicting", 1, false, "evicting pods"},
		{"before the first GPU step", 2, true, "GPU 0: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCore(t, "h200x2", nvmlsim.Options{}, "")
			c.applied(t, "all-balanced")
			pods := c.runPods(t, "1g.18gb", 0, 1)
			slots := &testsupport.FakeSlots{OKChecks: tc.okChecks, Lost: errors.New(`rollout slot mig-agent-slot-0 is held by "other" now`)}
			c.d.Slots = slots
			c.cluster.SetLabel("all-1g.18gb")
			if oc := c.pass(false, false); oc != reconcile.OutRetry {
				t.Fatalf("reconcile.Outcome %v, want a retry; record %+v", oc, c.cluster.Last())
			}
			if c.holds(t, "all-1g.18gb") || !c.holds(t, "all-balanced") {
				t.Fatal("the GPUs changed after the slot was lost")
			}
			if got := len(c.disrupt.Evicted) > 0; got != tc.wantEvict {
				t.Fatalf("evicted %v (of %v), want evictions %v", c.disrupt.Evicted, pods, tc.wantEvict)
			}
			rec := c.cluster.Last()
			if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "rollout slot was lost") ||
				!strings.Contains(rec.Reason, "stopped before "+tc.step) || !strings.Contains(rec.Reason, `held by "other"`) {
				t.Fatalf("record %+v, want a failure naming the lost slot and the step %q", rec, tc.step)
			}
			if c.cluster.Count(record.ReasonSlotLost) != 1 {
				t.Errorf("events %v, want one %s", c.cluster.Events, record.ReasonSlotLost)
			}
			if c.disrupt.Tainted {
				t.Error("the node stays tainted")
			}
			if slots.Released != 1 {
				t.Errorf("released %d times", slots.Released)
			}
			// The retry takes a slot again and finishes.
			slots.OKChecks, slots.Checks = 1<<20, 0
			c.clock.Step(c.d.S.RetryBackoffMax)
			if oc := c.pass(false, true); oc != reconcile.OutSuccess {
				t.Fatalf("retry: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
			}
			wantSuccess(t, c, "all-1g.18gb")
		})
	}
}

// Finding 1: an agent restarted mid-change (journal phase applying, its GPU
// 0 done) resumes only with a slot: while it cannot take one, no GPU is
// touched.
func TestCoreResumeNeedsSlot(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	ch := &journal.Change{Config: "all-1g.18gb", PreviousConfig: "all-balanced", RequestedBy: "test",
		StartedAt: c.clock.Now(), Phase: journal.PhaseApplying, GPUsChanged: []int{0, 1}, GPUsUntouched: []int{},
		NodeUID: "uid-1", TaintAdded: true}
	c.d.Journal.State.Change, c.d.Journal.State.Handled = ch, ""
	if err := c.d.Journal.Save(); err != nil {
		t.Fatal(err)
	}
	c.cluster.SetLabel("all-1g.18gb")
	c.restart(t, nvmlsim.Options{})
	slots := &testsupport.FakeSlots{AcquireErr: errors.New("the API server is away")}
	c.d.Slots = slots
	if oc := c.pass(true, false); oc != reconcile.OutRetry {
		t.Fatalf("reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	if !c.holds(t, "all-balanced") {
		t.Fatal("a resumed change touched the GPUs without a slot")
	}
	slots.AcquireErr, slots.OKChecks = nil, 1<<20
	c.clock.Step(c.d.S.RetryBackoffMax)
	if oc := c.pass(false, true); oc != reconcile.OutSuccess {
		t.Fatalf("with a slot: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	if slots.Acquired != 1 {
		t.Errorf("acquired %d slots", slots.Acquired)
	}
}

// Finding 4: the node lost to another agent (its node Lease) mid-apply:
// the change stops before the next GPU step with that reason.
func TestCoreStopsWhenNodeLost(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	// Confirmed before draining, before evicting (no pods: not asked),
	// then before each GPU step: GPU 0's first step passes, the next not.
	c.d.Owner = &testsupport.FakeOwner{OK: 2, Err: errors.New("another agent holds this node")}
	c.cluster.SetLabel("all-1g.18gb")
	if oc := c.pass(false, false); oc != reconcile.OutRetry {
		t.Fatalf("reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	rec := c.cluster.Last()
	if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "no longer holds its node") || !strings.Contains(rec.Reason, "stopped before GPU 0") {
		t.Fatalf("record %+v", rec)
	}
	if c.cluster.Count(record.ReasonNodeLost) != 1 {
		t.Errorf("events %v", c.cluster.Events)
	}
	if c.holds(t, "all-1g.18gb") {
		t.Fatal("every GPU step ran after the node was lost")
	}
}

// Finding 2: a reboot is not asked for when the slot cannot be kept
// through it (lost): no reboot, a failure naming why.
func TestCoreNoRebootWithoutSlot(t *testing.T) {
	noReset := nvmlsim.Options{NoReset: true}
	c := newCore(t, "a100-40gbx2", noReset, "")
	c.d.File = testsupport.ParseSpec(t, "version: v1\nmig-configs:\n  gpu1:\n    - devices: [1]\n      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 2}\n")
	c.d.S.RebootMethod = settings.RebootSystemctl
	slots := &testsupport.FakeSlots{OKChecks: 1 << 20, ExtendErr: errors.New(`rollout slot mig-agent-slot-0 is held by "other" now`)}
	c.d.Slots = slots
	c.cluster.SetLabel("gpu1")
	oc := c.pass(true, false)
	if c.reboot.Calls != 0 {
		t.Fatalf("rebooted (reconcile.Outcome %v) without keeping the slot", oc)
	}
	rec := c.cluster.Last()
	if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "not rebooting") || !strings.Contains(rec.Reason, `held by "other"`) {
		t.Fatalf("record %+v", rec)
	}
	if c.d.Journal.State.RebootFor != nil {
		t.Errorf("reboot mark kept for a reboot never asked for: %+v", c.d.Journal.State.RebootFor)
	}
}

// recordRefused is a Cluster whose Record fails (the record did not land)
// while refuse is set.
type recordRefused struct {
	*testsupport.FakeCluster
	refuse bool
}

func (r *recordRefused) Record(ctx context.Context, rec record.ChangeRecord, state string) error {
	if r.refuse {
		return errors.New("the change record did not land: Node annotations too large")
	}
	return r.FakeCluster.Record(ctx, rec, state)
}

// Finding 7: a change whose success record cannot land does not report
// success: the pass is a failure naming why (retried), the journal does
// not hold the config as handled, and no MigConfigApplied Event is posted.
func TestCoreSuccessNeedsItsRecord(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	rc := &recordRefused{FakeCluster: c.cluster, refuse: true}
	c.d.Cluster = rc
	c.cluster.SetLabel("all-1g.18gb")
	applied := c.cluster.Count(record.ReasonApplied)
	if oc := c.pass(false, false); oc == reconcile.OutSuccess {
		t.Fatal("a change whose record did not land reported success")
	}
	if c.cluster.Count(record.ReasonApplied) != applied {
		t.Error("a MigConfigApplied Event for a change without its record")
	}
	if c.cluster.Count(record.ReasonRecordFailed) == 0 {
		t.Errorf("events %v, want %s", c.cluster.Events, record.ReasonRecordFailed)
	}
	if j := c.d.Journal.State; j.Handled == "all-1g.18gb" {
		t.Errorf("journal %+v: the change counts as handled", j)
	}
	// Once records land again, the retry records the config applied.
	rc.refuse = false
	c.clock.Step(c.d.S.RetryBackoffMax)
	if oc := c.pass(false, true); oc != reconcile.OutSuccess {
		t.Fatalf("retry: reconcile.Outcome %v, record %+v", oc, c.cluster.Last())
	}
	if rec := c.cluster.Last(); rec.Result != record.StateSuccess || rec.Config != "all-1g.18gb" || rec.RequestedBySource != "" && rec.RequestedBy != "test" {
		t.Fatalf("record %+v", rec)
	}
}

// A change stopped by a shutdown (SIGTERM: the pass's context ends, not
// superseded) mid-eviction keeps its rollout slot: parked, not released,
// for the node stays disrupted until the agent, back, ends the change. A
// superseded change holds it until the next pass has ended it (restored,
// recorded), and hands it on only then.
func TestCoreShutdownKeepsSlot(t *testing.T) {
	for _, tc := range []struct {
		name      string
		supersede bool
	}{{"shutdown", false}, {"superseded", true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCore(t, "h200x2", nvmlsim.Options{}, "")
			c.applied(t, "all-balanced")
			c.runPods(t, "1g.18gb", 1)
			slots := &testsupport.FakeSlots{OKChecks: 1 << 20}
			c.d.Slots = slots
			c.cluster.SetLabel("all-1g.18gb")
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			c.disrupt.DuringEvict = func() {
				if tc.supersede {
					c.cluster.SetLabel("all-3g.71gb")
					c.d.Supersede()
					return
				}
				stop()
			}
			c.d.Pass(ctx, func() (*reconcile.Node, bool) { return c.cluster.Seen(), true }, false, false)
			if ch := c.d.Journal.State.Change; ch == nil || ch.Phase != journal.PhaseDraining || !c.disrupt.Tainted {
				t.Fatalf("journal change %+v, tainted %v: want the change parked mid-drain", ch, c.disrupt.Tainted)
			}
			wantKept := 1
			if tc.supersede {
				wantKept = 0
			}
			if slots.Kept != wantKept || slots.Released != 0 {
				t.Fatalf("slot kept %d, released %d times; want kept %d, released 0", slots.Kept, slots.Released, wantKept)
			}
			if !tc.supersede {
				return
			}
			// The next pass abandons the change: the slot goes on after
			// its taint is lifted and its record written.
			c.disrupt.DuringEvict = nil
			var recorded, tainted, first bool
			slots.OnRelease = func(keep bool) {
				if !keep && !first { // the superseded change's slot; then the new change's
					first = true
					last := c.cluster.Last()
					recorded = last.Config == "all-1g.18gb" && strings.HasPrefix(last.Reason, "abandoned")
					tainted = c.disrupt.Tainted
				}
			}
			c.d.Pass(context.Background(), func() (*reconcile.Node, bool) { return c.cluster.Seen(), true }, false, false)
			if slots.Released < 1 || !recorded || tainted {
				t.Fatalf("the superseded change's slot: released %d times, its abandoned record written before %v, the node tainted then %v; want released after the record, untainted (records %+v)",
					slots.Released, recorded, tainted, c.cluster.Records)
			}
		})
	}
}

// The node taken by another agent mid-drain (the run's context ends with
// journal.ErrAnotherAgent as its cause): the change is recorded failed
// with the loss and a MigNodeLeaseLost Event, and nothing is undone (the
// taint stays for the new holder; the journal keeps the change). When the
// new holder has already written a record since this change started, that
// record stays the newest: only the Event says it.
func TestCoreNodeLostMidDrain(t *testing.T) {
	for _, tc := range []struct {
		name        string
		theirRecord bool
	}{{"records", false}, {"not over the new holder's record", true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCore(t, "h200x2", nvmlsim.Options{}, "")
			c.applied(t, "all-balanced")
			c.runPods(t, "1g.18gb", 1)
			c.cluster.SetLabel("all-1g.18gb")
			ctx, stop := context.WithCancelCause(context.Background())
			defer stop(nil)
			lost := fmt.Errorf("%w on node n: Lease held by %q", journal.ErrAnotherAgent, "other")
			c.disrupt.DuringEvict = func() {
				if tc.theirRecord {
					c.cluster.Update(func(n *reconcile.Node) {
						theirs := record.ChangeRecord{Config: "all-1g.18gb", Result: record.StatePending, StartedAt: c.clock.Now().Add(time.Second),
							FinishedAt: c.clock.Now().Add(2 * time.Second)}
						n.History = append([]record.ChangeRecord{theirs}, n.History...)
					})
				}
				stop(lost)
			}
			before := len(c.cluster.Records)
			c.d.Pass(ctx, func() (*reconcile.Node, bool) { return c.cluster.Seen(), true }, false, false)
			if ch := c.d.Journal.State.Change; ch == nil || ch.Phase != journal.PhaseDraining || !c.disrupt.Tainted {
				t.Fatalf("journal change %+v, tainted %v: want the change kept, the node left tainted", ch, c.disrupt.Tainted)
			}
			if c.cluster.Count(record.ReasonNodeLost) != 1 {
				t.Errorf("events %v, want one %s", c.cluster.Events, record.ReasonNodeLost)
			}
			if tc.theirRecord {
				if len(c.cluster.Records) != before {
					t.Errorf("a record written over the new holder's: %+v", c.cluster.Last())
				}
				return
			}
			rec := c.cluster.Last()
			if len(c.cluster.Records) != before+1 || rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "no longer holds its node") ||
				len(rec.GPUsChanged) != 0 {
				t.Errorf("record %+v, want the failed change naming the lost node, no GPU changed", rec)
			}
		})
	}
}

// A slot lost while the change waits on its evictions (a stolen live
// slot): the holder learns it (Slot.Lost), the wait stops at once, not at
// --drain-timeout, and the change fails before its next eviction, naming
// the loss; the taint is lifted and the slot released.
func TestCoreStopsDrainWhenSlotLost(t *testing.T) {
	c := newCore(t, "h200x2", nvmlsim.Options{}, "")
	c.applied(t, "all-balanced")
	c.runPods(t, "1g.18gb", 0, 1)
	slots := &testsupport.FakeSlots{OKChecks: 1 << 20, Gone: make(chan struct{}),
		Lost: errors.New(`rollout slot mig-agent-slot-0 is held by "thief" now`)}
	c.d.Slots = slots
	c.disrupt.DuringEvict = func() {
		close(slots.Gone) // the slot is taken while the evictions wait
		time.Sleep(100 * time.Millisecond)
	}
	c.cluster.SetLabel("all-1g.18gb")
	if oc := c.pass(false, false); oc != reconcile.OutRetry {
		t.Fatalf("reconcile.Outcome %v, want a retry; record %+v", oc, c.cluster.Last())
	}
	if len(c.disrupt.Evicted) != 0 || !c.holds(t, "all-balanced") {
		t.Fatalf("evicted %v, GPUs changed %v after the slot was lost", c.disrupt.Evicted, !c.holds(t, "all-balanced"))
	}
	rec := c.cluster.Last()
	if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "stopped before its next eviction") || !strings.Contains(rec.Reason, `"thief"`) {
		t.Fatalf("record %+v, want a failure naming the lost slot", rec)
	}
	if c.cluster.Count(record.ReasonSlotLost) != 1 || c.disrupt.Tainted || slots.Released != 1 {
		t.Errorf("events %v, tainted %v, released %d", c.cluster.Events, c.disrupt.Tainted, slots.Released)
	}
}
