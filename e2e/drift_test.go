package e2e

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// Someone changes the GPUs behind the agent's back (here: `mig-agent apply`
// on the same simulated hardware): the drift check reports it (metric and
// a Warning Event) and, with --reapply-on-drift, puts the geometry back
// with a new record.
func TestDriftDetectedAndReapplied(t *testing.T) {
	for _, reapply := range []bool{false, true} {
		name := "report-only"
		if reapply {
			name = "reapply"
		}
		t.Run(name, func(t *testing.T) {
			c := kubetest.Client(t)
			node := kubetest.NewName(t, "drift")
			kubetest.CreateNode(t, node, nil)
			o := &Opts{Node: node, Sim: "h200x2"}
			if reapply {
				o.Extra = []string{"--reapply-on-drift"}
			}
			a := StartAgent(t, o)
			SelectConfig(t, c, node, "all-balanced")
			WaitState(t, c, node, record.StateSuccess, "all-balanced", changeTimeout)
			if v := metricValue(t, a.Scrape(t), "migagent_geometry_drift", nil); v != 0 {
				t.Fatalf("drift %v before any drift", v)
			}
			if _, errOut, code := RunCLI(t, "apply", "-c", "all-7g.141gb", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState); code != 0 {
				t.Fatalf("apply behind the agent's back: exit %d: %s", code, errOut)
			}
			WaitFor(t, 15*time.Second, "a MigGeometryDrift Warning Event", func() bool {
				return len(nodeEvents(t, c, node, record.ReasonDrift)) >= 1
			})
			if !reapply {
				WaitFor(t, 5*time.Second, "migagent_geometry_drift 1", func() bool {
					return metricValue(t, a.Scrape(t), "migagent_geometry_drift", nil) == 1
				})
				if h := History(t, GetNode(t, c, node)); len(h) != 1 {
					t.Fatalf("report-only drift wrote records: %d", len(h))
				}
				return
			}
			WaitFor(t, 15*time.Second, "a second record putting all-balanced back", func() bool {
				h := History(t, GetNode(t, c, node))
				return len(h) == 2 && h[0].Result == record.StateSuccess && len(h[0].GPUsChanged) == 2
			})
			out, _, _ := RunCLI(t, "plan", "-c", "all-balanced", "-o", "json", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState)
			var untouched int
			for _, gp := range decodePlan(t, out).GPUs {
				if gp.Action == "untouched" {
					untouched++
				}
			}
			if untouched != 2 {
				t.Fatalf("after re-apply the plan still changes GPUs:\n%s", out)
			}
			WaitFor(t, 5*time.Second, "migagent_geometry_drift 0", func() bool {
				return metricValue(t, a.Scrape(t), "migagent_geometry_drift", nil) == 0
			})
		})
	}
}

func decodePlan(t testing.TB, out string) geometry.Plan {
	t.Helper()
	var p geometry.Plan
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("plan -o json: %v\n%s", err, out)
	}
	return p
}
