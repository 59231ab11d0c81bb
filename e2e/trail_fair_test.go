package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// A trail one tenant cannot flush, with the real binary: the node's trail
// is full (assign.MaxEntries), another team's 100 entries the oldest, a
// tenant's 1,900 newer. The tenant churns pods on the node's MIG devices:
// each new entry drops the tenant's own oldest, and the other team's
// history survives whole. (On b20dfeb each new entry dropped the oldest of
// the trail: the other team's.)
func TestAssignmentTrailFairBound(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	node, kl, tenant := kubeletNode(t)
	o := (&Opts{Node: node, Sim: "h200x1"}).Fill(t)
	o.Extra = append(o.Extra, "--pod-resources-socket", kl.Socket(), "--assignment-interval", "300ms")
	const team, teamEntries = "team-x", 100
	t0 := time.Now().Add(-48 * time.Hour).UTC().Truncate(time.Second)
	var seed []assign.Entry
	for i := range assign.MaxEntries {
		ns, at := team, t0.Add(time.Duration(i)*time.Minute)
		if i >= teamEntries {
			ns, at = tenant, t0.Add(24*time.Hour+time.Duration(i)*time.Second)
		}
		end := at.Add(30 * time.Second)
		seed = append(seed, assign.Entry{Namespace: ns, Pod: fmt.Sprintf("old-%d", i), Container: "main", Resource: "nvidia.com/mig-1g.18gb",
			Device: assign.Device{UUID: fmt.Sprintf("MIG-old-%d", i%7), Profile: "1g.18gb", GPU: 0, Placement: fmt.Sprintf("%d+1", i%7)},
			Start:  at, End: &end, EndedBy: "gone"})
	}
	writeTrail(t, c, o.Namespace, node, seed...)
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 30*time.Second)
	uuids := disMIGUUIDs(disProfiles(t, o.Sim, o.SimState)[0])
	res := "nvidia.com/mig-1g.18gb"
	for i := range 3 { // the tenant's churn
		name := fmt.Sprintf("churn-%d", i)
		p := kl.RunPod(t, tenant, name, map[string]string{res: "1"}, map[string][]string{res: {uuids[fmt.Sprintf("1g.18gb@%d", i)]}}, disOwner("rs"))
		WaitFor(t, 15*time.Second, "a MigDeviceAssigned Event on "+name, func() bool { return len(trailEvents(t, c, tenant, name)) == 1 })
		trailStop(t, c, p)
	}
	var h assign.History
	WaitFor(t, 15*time.Second, "the churn in the trail", func() bool {
		cm, err := c.CoreV1().ConfigMaps(o.Namespace).Get(ctx, assign.ConfigMapName(node), metav1.GetOptions{})
		if err != nil || json.Unmarshal([]byte(cm.Data[assign.HistoryKey]), &h) != nil {
			return false
		}
		n := 0
		for _, e := range h.Entries {
			if e.Namespace == tenant && len(e.Pod) > 6 && e.Pod[:6] == "churn-" {
				n++
			}
		}
		return n == 3
	})
	kept := 0
	for _, e := range h.Entries {
		if e.Namespace == team {
			kept++
		}
	}
	t.Logf("trail: %d entries, %d dropped (%s); the other team's: %d of %d", len(h.Entries), h.Dropped, h.DroppedNote, kept, teamEntries)
	if len(h.Entries) > assign.MaxEntries || h.Dropped < 3 {
		t.Errorf("trail of %d entries, %d dropped: not bounded", len(h.Entries), h.Dropped)
	}
	if kept != teamEntries {
		t.Errorf("the tenant's churn dropped %d of the other team's %d entries", teamEntries-kept, teamEntries)
	}
}
