package record

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The Node's light forms: whatever a record holds, a history entry on the
// Node stays within MaxNodeRecordBytes (the history drops records only by
// count), the pods are counted and the whole record is named; the last
// change names the pods within NodeLastChangePodBytes; without a ConfigMap
// to hold it (ref "") the record stays whole.
func TestNodeForms(t *testing.T) {
	huge := strings.Repeat("m", 90<<10)
	pods := make([]string, 1000)
	for i := range pods {
		pods[i] = fmt.Sprintf("%s/%s-%d", strings.Repeat("n", 63), strings.Repeat("p", 240), i)
	}
	now := time.Now()
	worst := ChangeRecord{Config: huge, PreviousConfig: huge, Result: StateFailed, Reason: huge,
		StartedAt: now, FinishedAt: now, DisruptedAt: &now, RequestedAt: &now,
		GPUsChanged: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, GPUsUntouched: []int{},
		EvictedPods: pods, AgentVersion: huge, DriverVersion: huge, ConfigHash: huge, ConfigSource: huge,
		RequestedBy: huge, RequestedVia: huge, RequestedBySource: huge, AffectedBy: huge}
	ref := FullRecordRef(strings.Repeat("s", 63), strings.Repeat("n", 253))
	h := worst.InNodeHistory(ref)
	raw, _ := h.NodeEntryJSON()
	if len(raw) > MaxNodeRecordBytes {
		t.Errorf("a history entry on the Node of %d bytes, bound %d", len(raw), MaxNodeRecordBytes)
	}
	if h.EvictedPodCount != 1000 || len(h.EvictedPods)+h.EvictedPodsOmitted != 1000 || h.FullRecord != ref {
		t.Errorf("history entry: %d named, %d omitted, count %d, fullRecord %q", len(h.EvictedPods), h.EvictedPodsOmitted, h.EvictedPodCount, h.FullRecord)
	}
	if NodeHistoryMaxRecords*(MaxNodeRecordBytes+1)+2 > NodeHistoryMaxBytes {
		t.Errorf("%d entries of %d bytes do not fit the Node's history's %d", NodeHistoryMaxRecords, MaxNodeRecordBytes, NodeHistoryMaxBytes)
	}
	for _, gone := range []string{"agentVersion", "driverVersion", "configSource", "disruptedAt", "geometry"} {
		if strings.Contains(string(raw), `"`+gone+`"`) {
			t.Errorf("a light history entry holds %s: %s", gone, raw)
		}
	}
	l := worst.OnNode(ref)
	podsJSON, _ := json.Marshal(l.EvictedPods)
	if len(podsJSON) > NodeLastChangePodBytes || len(l.EvictedPods) == 0 || len(l.EvictedPods)+l.EvictedPodsOmitted != 1000 ||
		l.EvictedPodCount != 1000 || l.FullRecord != ref {
		t.Errorf("last change: %d named in %d bytes, %d omitted, count %d, fullRecord %q", len(l.EvictedPods), len(podsJSON), l.EvictedPodsOmitted, l.EvictedPodCount, l.FullRecord)
	}
	small := ChangeRecord{Config: "a", Result: StateSuccess, EvictedPods: []string{"ns/p"}, Geometry: map[string][]string{"0": {"7g.141gb@0"}}}
	if got := small.OnNode(ref); got.FullRecord != "" || len(got.EvictedPods) != 1 || got.EvictedPodCount != 1 || got.Geometry == nil {
		t.Errorf("a last change that fits is left whole: %+v", got)
	}
	if got := worst.InNodeHistory(""); len(got.EvictedPods)+got.EvictedPodsOmitted != 1000 || got.FullRecord != "" || len(got.Reason) > MaxRecordReason {
		t.Errorf("without a ConfigMap the entry is not the Bounded record: %d named", len(got.EvictedPods))
	}
}
