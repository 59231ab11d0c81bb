package kube

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/record"
)

func TestRequestSeen(t *testing.T) {
	var s requestSeen
	t0 := time.Unix(1000, 0)
	at, fresh := s.firstSeen("a", t0)
	if !fresh || !at.Equal(t0) {
		t.Fatalf("first: %v %v", at, fresh)
	}
	if at, fresh = s.firstSeen("a", t0.Add(time.Minute)); fresh || !at.Equal(t0) {
		t.Fatalf("again: %v %v, want the first time", at, fresh)
	}
	if at, fresh = s.firstSeen("b", t0.Add(2*time.Minute)); !fresh || !at.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("another request: %v %v", at, fresh)
	}
}

// Cluster.Desired names the stamped user and field manager; without a time
// from the API server, requestedAt is when the request was first seen,
// also on later passes.
func TestKubeDesiredRequester(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	k := &Cluster{Clock: clk}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Labels:      map[string]string{record.LabelConfig: "all-balanced"},
		Annotations: map[string]string{record.AnnotationRequestedBy: `{"user":"alice","via":"kubectl-label","config":"all-balanced"}`},
	}}
	r := k.desired(node)
	if r.Config != "all-balanced" || r.By != "alice" || r.Via != "kubectl-label" || r.At == nil || r.At.Unix() != 1000 || !r.Asked {
		t.Fatalf("Desired = %+v", r)
	}
	clk.Step(time.Minute)
	if r = k.desired(node); r.At == nil || r.At.Unix() != 1000 {
		t.Fatalf("a later pass: at %v, want the first sight", r.At)
	}
	node.Labels[record.LabelConfig] = "all-disabled" // a new request; the stamp is an earlier one's
	if r = k.desired(node); r.By != record.RequesterUnknown || r.Via != "" || r.At == nil || r.At.Unix() != 1060 {
		t.Fatalf("a new value with a stale stamp: %+v", r)
	}
	if r = (&Cluster{DefaultConfig: "all-1g.18gb"}).desired(&corev1.Node{}); r.By != record.RequesterDefaultConfig || r.Config != "all-1g.18gb" {
		t.Fatalf("default config: %+v", r)
	}
}

// Finding 7: a 90 KB user name no longer leaves a change without a record,
// nor pushes earlier records out: the record is bounded, lands, and the
// history keeps the records before it; the name keeps its start, marked.
func TestRecordHugeRequesterLands(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Clock: clocktesting.NewFakeClock(time.Unix(0, 0)), Component: "mig-agent", Log: testsupport.Discard()}
	for i := range record.NodeHistoryMaxRecords - 1 {
		if err := k.Record(ctx, record.ChangeRecord{Config: fmt.Sprintf("c%d", i), Result: record.StateSuccess, RequestedBy: "alice"}, record.StateSuccess); err != nil {
			t.Fatal(err)
		}
	}
	huge := strings.Repeat("m", 90<<10)
	if err := k.Record(ctx, record.ChangeRecord{Config: "huge", Result: record.StateSuccess, RequestedBy: huge,
		RequestedBySource: record.RequesterSourceStamp}, record.StateSuccess); err != nil {
		t.Fatalf("the record of a 90 KB user name did not land: %v", err)
	}
	n, _ := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	recs := record.Trail(n.Annotations)
	if n := record.NodeHistoryMaxRecords; len(recs) != n || recs[0].Config != "huge" || recs[n-1].Config != "c0" {
		t.Fatalf("history of %d records (%v), want all %d", len(recs), recs, n)
	}
	if by := recs[0].RequestedBy; len(by) > record.MaxRequester || !strings.Contains(by, record.TruncatedMark) ||
		recs[0].RequestedBySource != record.RequesterSourceStamp {
		t.Errorf("requestedBy %d bytes %q (source %q), want a marked start within %d", len(by), record.Truncate(by, 40), recs[0].RequestedBySource, record.MaxRequester)
	}
}
