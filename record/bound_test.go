package record

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Finding 7: whatever a user name, a pod list or an error holds, a record
// stays within MaxRecordBytes (it lands, and the history keeps at least
// HistoryMaxBytes/MaxRecordBytes records besides it); cut names are marked
// with their whole length; the pods beyond MaxRecordPodBytes are counted.
func TestBoundedWorstCase(t *testing.T) {
	huge := strings.Repeat("m", 90<<10)
	pods := make([]string, 1000)
	for i := range pods {
		pods[i] = fmt.Sprintf("%s/%s-%d", strings.Repeat("n", 63), strings.Repeat("p", 240), i)
	}
	geo := map[string][]string{}
	for g := range 16 { // the most GPUs of one machine, all split in 7
		for s := range 7 {
			geo[fmt.Sprint(g)] = append(geo[fmt.Sprint(g)], fmt.Sprintf("1g.18gb@%d", s))
		}
	}
	var unusable []UnusableGPU
	for g := range 16 {
		unusable = append(unusable, UnusableGPU{Index: g, Return: "ERROR_UNKNOWN", Reason: huge})
	}
	now := time.Now()
	r := ChangeRecord{Config: strings.Repeat("c", 63), PreviousConfig: strings.Repeat("c", 63), Result: StateFailed, Reason: huge,
		StartedAt: now, FinishedAt: now, DisruptedAt: &now, RequestedAt: &now,
		GPUsChanged: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, GPUsUntouched: []int{},
		EvictedPods: pods, AgentVersion: huge, DriverVersion: huge, ConfigHash: huge, ConfigSource: huge,
		RequestedBy: huge, RequestedVia: huge, RequestedBySource: RequesterSourceStamp, AffectedBy: huge,
		Geometry: geo, GPUsUnusable: unusable}
	b := r.Bounded()
	raw, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > MaxRecordBytes {
		t.Fatalf("a bounded record of %d bytes, bound %d", len(raw), MaxRecordBytes)
	}
	if HistoryMaxBytes/MaxRecordBytes < 2 {
		t.Fatalf("the history (%d bytes) does not hold two records of the bound (%d)", HistoryMaxBytes, MaxRecordBytes)
	}
	if len(b.EvictedPods) == 0 || len(b.EvictedPods)+b.EvictedPodsOmitted != 1000 || b.EvictedPods[0] != pods[0] {
		t.Errorf("evicted %d named (first %q), %d omitted", len(b.EvictedPods), b.EvictedPods[0], b.EvictedPodsOmitted)
	}
	podsJSON, _ := json.Marshal(b.EvictedPods)
	if len(podsJSON) > MaxRecordPodBytes {
		t.Errorf("the evicted pods take %d bytes, bound %d", len(podsJSON), MaxRecordPodBytes)
	}
	// A full node's pods of a usual length are all named: 8 GPUs in 7.
	var full []string
	for i := range 56 {
		full = append(full, fmt.Sprintf("ml-training-team/llama-finetune-worker-7d9f8b6c5-%05d", i))
	}
	if got := (ChangeRecord{EvictedPods: full}).Bounded(); len(got.EvictedPods) != 56 || got.EvictedPodsOmitted != 0 {
		t.Errorf("a full node: %d named, %d omitted", len(got.EvictedPods), got.EvictedPodsOmitted)
	}
	want := fmt.Sprintf("%s%d bytes in all]", TruncatedMark, len(huge))
	if len(b.RequestedBy) > MaxRequester || !strings.HasPrefix(b.RequestedBy, "mmm") || !strings.HasSuffix(b.RequestedBy, want) {
		t.Errorf("requestedBy %q: want the start of the name, marked %q, within %d bytes", b.RequestedBy, want, MaxRequester)
	}
	if len(r.EvictedPods) != 1000 || r.RequestedBy != huge {
		t.Error("Bounded changed its receiver's fields")
	}
	// A record within its bounds is left as it is.
	small := ChangeRecord{Config: "a", Result: StateSuccess, RequestedBy: "alice", EvictedPods: []string{"ns/p"}}
	if got := small.Bounded(); got.RequestedBy != "alice" || len(got.EvictedPods) != 1 || got.EvictedPodsOmitted != 0 {
		t.Errorf("a small record bounded to %+v", got)
	}
	// Cut at a rune boundary.
	if got := BoundText(strings.Repeat("é", 200), 100); !strings.HasSuffix(got, "400 bytes in all]") || strings.ContainsRune(got, '\uFFFD') {
		t.Errorf("BoundText cut a rune: %q", got)
	}
}

// The requester in an Event: quoted, within MaxRequester, the way in only
// when it differs, and where the name came from ("unknown" when nothing
// said).
func TestRequestedByText(t *testing.T) {
	long := strings.Repeat("a", MaxRequester+10)
	for _, tc := range []struct{ by, via, source, want string }{
		{"alice", "kubectl-label", RequesterSourceStamp, `requested by "alice" via "kubectl-label" (stamp)`},
		{"gitops", "gitops", "", `requested by "gitops" (unknown)`},
		{long, "", "", `requested by "` + BoundText(long, MaxRequester) + `" (unknown)`},
	} {
		if got := RequestedByText(tc.by, tc.via, tc.source); got != tc.want {
			t.Errorf("RequestedByText(%q, %q, %q) = %s, want %s", tc.by, tc.via, tc.source, got, tc.want)
		}
	}
}
