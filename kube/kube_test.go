package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/kubefake"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestRecordHistoryBounded(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	for i := range 40 {
		rec := record.ChangeRecord{Config: fmt.Sprintf("c%d", i), Result: record.StateSuccess, Reason: strings.Repeat("x", 1500)}
		if err := k.Record(ctx, rec, record.StateSuccess); err != nil {
			t.Fatal(err)
		}
	}
	n, _ := k.getNode(ctx)
	var hist []record.ChangeRecord
	raw := n.Annotations[record.AnnotationHistory]
	if err := json.Unmarshal([]byte(raw), &hist); err != nil {
		t.Fatal(err)
	}
	if len(raw) > record.HistoryMaxBytes || len(hist) > record.NodeHistoryMaxRecords || len(hist) < 2 {
		t.Fatalf("history: %d records, %d bytes", len(hist), len(raw))
	}
	if hist[0].Config != "c39" || hist[1].Config != "c38" {
		t.Fatalf("history not newest first: %s, %s", hist[0].Config, hist[1].Config)
	}
	var last record.ChangeRecord
	_ = json.Unmarshal([]byte(n.Annotations[record.AnnotationLastChange]), &last)
	if last.Config != "c39" || n.Labels[record.LabelState] != record.StateSuccess {
		t.Fatalf("last change %q state %q", last.Config, n.Labels[record.LabelState])
	}
	// Small records: exactly record.NodeHistoryMaxRecords kept on the Node.
	for i := range 20 {
		_ = k.Record(ctx, record.ChangeRecord{Config: fmt.Sprint(i)}, record.StateSuccess)
	}
	n, _ = k.getNode(ctx)
	_ = json.Unmarshal([]byte(n.Annotations[record.AnnotationHistory]), &hist)
	if len(hist) != record.NodeHistoryMaxRecords {
		t.Fatalf("%d records, want %d", len(hist), record.NodeHistoryMaxRecords)
	}
}

// Every record written is in the history or was returned as dropped, once
// and in order; Record leaves a log line and an Event for each dropped.
func TestRecordRetiring(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	kubefake.NameEvents(c)
	var logs strings.Builder
	k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Clock: clocktesting.NewFakeClock(time.Unix(0, 0)), Component: "mig-agent",
		Log: slog.New(slog.NewJSONHandler(&logs, nil))}
	var dropped []string
	for i := range 40 {
		n, _ := k.getNode(ctx)
		// Some large records: the byte bound drops some before the count does.
		reason := ""
		if i%7 == 0 {
			reason = strings.Repeat("x", 1000)
		}
		rec := record.ChangeRecord{Config: fmt.Sprintf("c%d", i), Result: record.StateSuccess, Reason: reason, RequestedBy: "alice", RequestedVia: "kubectl-label"}
		got, err := k.RecordRetiring(ctx, n, rec, record.StateSuccess)
		if err != nil {
			t.Fatal(err)
		}
		for j := len(got) - 1; j >= 0; j-- { // oldest last: append oldest first
			var r record.ChangeRecord
			if err := json.Unmarshal(got[j], &r); err != nil {
				t.Fatal(err)
			}
			dropped = append(dropped, r.Config)
		}
	}
	n, _ := k.getNode(ctx)
	var hist []record.ChangeRecord
	if err := json.Unmarshal([]byte(n.Annotations[record.AnnotationHistory]), &hist); err != nil {
		t.Fatal(err)
	}
	all := slices.Clone(dropped)
	for i := len(hist) - 1; i >= 0; i-- {
		all = append(all, hist[i].Config)
	}
	var want []string
	for i := range 40 {
		want = append(want, fmt.Sprintf("c%d", i))
	}
	if !slices.Equal(all, want) {
		t.Fatalf("dropped %v + history %d records: %v, want every record once, in order", dropped, len(hist), all)
	}

	// Record's trace of the records it drops.
	n, _ = k.getNode(ctx)
	var hist0 []json.RawMessage
	_ = json.Unmarshal([]byte(n.Annotations[record.AnnotationHistory]), &hist0)
	logs.Reset()
	if err := k.Record(ctx, record.ChangeRecord{Config: "c40", Result: record.StateSuccess, Reason: strings.Repeat("y", 1000)}, record.StateSuccess); err != nil {
		t.Fatal(err)
	}
	n, _ = k.getNode(ctx)
	var hist1 []json.RawMessage
	_ = json.Unmarshal([]byte(n.Annotations[record.AnnotationHistory]), &hist1)
	last := hist0[len(hist1)-1:] // what no longer fits, oldest last
	if len(last) == 0 {
		t.Fatal("a full history dropped nothing")
	}
	evs, _ := c.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	var retired []corev1.Event
	for _, ev := range evs.Items {
		if ev.Reason == record.ReasonRecordRetired {
			retired = append(retired, ev)
		}
	}
	var r record.ChangeRecord
	_ = json.Unmarshal(last[len(last)-1], &r)
	if len(retired) != len(last) || !strings.Contains(retired[len(retired)-1].Message, fmt.Sprintf("%q", r.Config)) ||
		!strings.Contains(retired[len(retired)-1].Message, `requested by "alice" via "kubectl-label"`) {
		t.Errorf("Events %+v, want one %s per dropped record naming it", retired, record.ReasonRecordRetired)
	}
	if got := strings.Count(logs.String(), "dropped from the history"); got != len(last) {
		t.Errorf("%d log lines for %d dropped records:\n%s", got, len(last), logs.String())
	}
	if !strings.Contains(logs.String(), `"msg":"change record","config":"c40"`) {
		t.Errorf("the written record is not logged:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), `\"config\":\"`+r.Config+`\"`) {
		t.Errorf("the log does not hold the whole record %s:\n%s", r.Config, logs.String())
	}
}

// The preflight proves the taint's update from the watch's copy of the
// Node without reading it, and reads it once only when the API server finds
// that copy stale (a conflict, as an update with an old resourceVersion
// gets); neither write is persisted (dryRun=All).
func TestPreflightTaintFromCachedNode(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "5"}})
	current := "5" // the API server's resourceVersion of the Node
	var gets, updates int
	c.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets++
		return true, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: current}}, nil
	})
	c.PrependReactor("update", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		u := a.(k8stesting.UpdateActionImpl)
		n := u.GetObject().(*corev1.Node)
		if !slices.Equal(u.UpdateOptions.DryRun, []string{metav1.DryRunAll}) {
			t.Errorf("the preflight's update is no dry run: %v", u.UpdateOptions.DryRun)
		}
		if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "migagent.io/reconfiguring" {
			t.Errorf("the preflight's update carries taints %v", n.Spec.Taints)
		}
		updates++
		if n.ResourceVersion != current {
			return true, nil, apierrors.NewConflict(corev1.Resource("nodes"), n.Name, fmt.Errorf("the object has been modified"))
		}
		return true, n, nil
	})
	k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	cached := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "5"}}
	if err := k.preflightTaint(ctx, cached); err != nil || gets != 0 || updates != 1 {
		t.Fatalf("fresh copy: err %v, %d GETs, %d updates; want nil, 0, 1", err, gets, updates)
	}
	if len(cached.Spec.Taints) != 0 {
		t.Errorf("the watch's copy was changed: %v", cached.Spec.Taints)
	}
	current, gets, updates = "6", 0, 0
	if err := k.preflightTaint(ctx, cached); err != nil || gets != 1 || updates != 2 {
		t.Fatalf("stale copy: err %v, %d GETs, %d updates; want nil, 1, 2", err, gets, updates)
	}
}

// SetState("") removes the state label (a merge patch's null), where any
// other value sets it: the label removed mid-change leaves no state.
func TestSetStateEmptyRemovesLabel(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"other": "x"}}})
	k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	if err := k.SetState(ctx, record.StatePending); err != nil {
		t.Fatal(err)
	}
	if n, _ := k.getNode(ctx); n.Labels[record.LabelState] != record.StatePending {
		t.Fatalf("labels %v, want the state pending", n.Labels)
	}
	if err := k.SetState(ctx, ""); err != nil {
		t.Fatal(err)
	}
	n, _ := k.getNode(ctx)
	if v, has := n.Labels[record.LabelState]; has || n.Labels["other"] != "x" {
		t.Fatalf("labels %v (state %q): want the state label removed, the others kept", n.Labels, v)
	}
}
