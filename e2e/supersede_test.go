package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// A change stuck draining (a budget forbids the eviction, long drain
// timeout) is dropped as soon as the label names another config: the agent
// never keeps acting on a stale value. The abandoned request leaves a
// record saying so, the pause and the taint are undone, the new config is
// applied at once, and the guarded pod keeps running.
func TestNewerLabelSupersedesADrainingChange(t *testing.T) {
	c := kubetest.Client(t)
	o, ns := disGuardedNode(t, "--drain-timeout", "2m")
	a := StartAgent(t, o)
	SelectConfig(t, c, o.Node, "all-disabled")
	WaitState(t, c, o.Node, record.StateSuccess, "all-disabled", 30*time.Second)

	SelectConfig(t, c, o.Node, "gpu1-mig")
	WaitFor(t, 20*time.Second, "the change draining (node tainted)", func() bool { return disTainted(GetNode(t, c, o.Node)) })
	start := time.Now()
	SelectConfig(t, c, o.Node, "all-1g.18gb")  // changes GPU 0 and 1; the guarded pod is on GPU 1…
	SelectConfig(t, c, o.Node, "all-disabled") // …and then the user changes their mind again
	WaitState(t, c, o.Node, record.StateSuccess, "all-disabled", 30*time.Second)
	if took := time.Since(start); took > 60*time.Second {
		t.Fatalf("the stale change held the agent for %s", took)
	}
	n := GetNode(t, c, o.Node)
	if disTainted(n) {
		t.Error("taint left after the change was abandoned")
	}
	if got := disOperands(n); !disSameLabels(got, disOperandLabels) {
		t.Errorf("operand labels = %v, want %v", got, disOperandLabels)
	}
	if live := disLivePods(t, c, ns); !slices.Equal(live, []string{"guarded", "other"}) {
		t.Errorf("pods: %v", live)
	}
	var abandoned bool
	for _, r := range History(t, n) {
		if r.Config == "gpu1-mig" && r.Result == record.StateFailed && strings.Contains(r.Reason, "abandoned") {
			abandoned = true
			// It stopped while draining: no NVML step ran, so no GPU
			// was changed (the plan would have changed GPU 1).
			if len(r.GPUsChanged) != 0 || !slices.Contains(r.GPUsUntouched, 1) {
				t.Errorf("abandoned record: changed %v untouched %v, want no GPU changed", r.GPUsChanged, r.GPUsUntouched)
			}
		}
	}
	if strings.Contains(a.Log(), "shutting down") {
		t.Errorf("the agent logged a shutdown when a newer label stopped the change:\n%s", a.Log())
	}
	if !abandoned {
		t.Errorf("no record of the abandoned request in %+v", History(t, n))
	}
	for _, g := range disProfiles(t, o.Sim, o.SimState) {
		if g.MigMode.Current || len(g.Instances) > 0 {
			t.Errorf("GPU %d changed by an abandoned request: %+v", g.Index, g)
		}
	}
}
