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

	"github.com/migagent/mig-agent/internal/kclient/clientset"
	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
	corev1 "k8s.io/api/core/v1"
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
	if len(raw) > record.HistoryMaxBytes || len(hist) > record.HistoryMaxRecords || len(hist) < 2 {
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
	// Small records: exactly record.HistoryMaxRecords kept.
	for i := range 20 {
		_ = k.Record(ctx, record.ChangeRecord{Config: fmt.Sprint(i)}, record.StateSuccess)
	}
	n, _ = k.getNode(ctx)
	_ = json.Unmarshal([]byte(n.Annotations[record.AnnotationHistory]), &hist)
	if len(hist) != record.HistoryMaxRecords {
		t.Fatalf("%d records, want %d", len(hist), record.HistoryMaxRecords)
	}
}

func TestRequestedBy(t *testing.T) {
	at := func(s int) *metav1.Time { x := metav1.NewTime(time.Unix(int64(s), 0)); return &x }
	fields := metav1.NewFieldsV1
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{
		{Manager: "kubelet", Time: at(300), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:kubernetes.io/hostname":{}}}}`)},
		{Manager: "mig-agent", Time: at(400), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config.state":{}}}}`)},
		{Manager: "alice", Time: at(100), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config":{}}}}`)},
		{Manager: "bob", Time: at(200), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config":{}}}}`)},
	}}}
	by, when := RequestedBy(node)
	if by != "bob" || when == nil || when.Unix() != 200 {
		t.Fatalf("RequestedBy = %s %v, want bob at 200", by, when)
	}
	if by, _ := RequestedBy(&corev1.Node{}); by != "unknown" {
		t.Fatalf("no managed fields: %s", by)
	}
}

// Two slots, three holders: the third waits, sends no request while the
// slots stay held (clock moving, Leases renewed), and takes the slot the
// first releases.
func TestSlots(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	slot := func(holder string) *Slots {
		return &Slots{Client: clientset.Wrap(c), Namespace: "ns", Holder: holder, N: 2, Duration: 30 * time.Second, Clock: clk, Log: discard(), Spread: 200 * time.Millisecond}
	}
	relA, err := acquireStepping(t, clk, slot("a"))
	if err != nil {
		t.Fatal(err)
	}
	b := slot("b")
	if _, err := acquireStepping(t, clk, b); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := slot("c").Acquire(ctx); got <- err }()
	waitLog := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("timed out: " + what)
			}
		}
	}
	// c is queued once it has listed and watched the Leases.
	watching := func() bool {
		for _, a := range c.Actions() {
			if a.GetVerb() == "watch" && a.GetResource().Resource == "leases" {
				return true
			}
		}
		return false
	}
	waitLog("the third holder's watch", func() bool { return watching() && clk.HasWaiters() })
	time.Sleep(20 * time.Millisecond)
	clk.Step(200 * time.Millisecond) // its first try's spread: it finds every slot taken
	time.Sleep(50 * time.Millisecond)
	before := len(c.Actions())
	// A renewal by b is a Lease change that frees nothing: c looks at its
	// cache, not at the API server.
	if ok, err := b.try(ctx, SlotLeaseName(1)); ok == nil || err != nil {
		if ok, err = b.try(ctx, SlotLeaseName(0)); ok == nil || err != nil {
			t.Fatalf("renewing b: %v %v", ok, err)
		}
	}
	renewal := len(c.Actions()) - before
	for range 6 { // short of the holders' renewals (every 10 s)
		clk.Step(time.Second) // spreads and retries due, slots still held
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-got:
		t.Fatalf("third holder got a slot while two are held (err %v)", err)
	default:
	}
	if extra := c.Actions()[before+renewal:]; len(extra) != 0 {
		t.Fatalf("a queued holder sent %d requests while the slots stayed held: %v", len(extra), extra)
	}
	relA.Release()
	for range 50 {
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
			return
		case <-time.After(20 * time.Millisecond):
			clk.Step(50 * time.Millisecond) // the spread after the release
		}
	}
	t.Fatal("third holder did not get the released slot")
}

func TestSlotExpires(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	crashed := &Slots{Client: clientset.Wrap(c), Namespace: "ns", Holder: "dead", N: 1, Duration: 30 * time.Second, Clock: clk, Log: discard()}
	if ok, err := crashed.try(ctx, SlotLeaseName(0)); ok == nil || err != nil {
		t.Fatal(ok, err)
	}
	other := &Slots{Client: clientset.Wrap(c), Namespace: "ns", Holder: "alive", N: 1, Duration: 30 * time.Second, Clock: clk, Log: discard()}
	if ok, _ := other.try(ctx, SlotLeaseName(0)); ok != nil {
		t.Fatal("took a live slot")
	}
	clk.Step(31 * time.Second)
	if ok, err := other.try(ctx, SlotLeaseName(0)); ok == nil || err != nil {
		t.Fatalf("expired slot not taken: %v %v", ok, err)
	}
}

// Every record written is in the history or was returned as dropped, once
// and in order; Record leaves a log line and an Event for each dropped.
func TestRecordRetiring(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	// The API server names generateName objects; the fake does not.
	seq := 0
	c.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ev := a.(k8stesting.CreateAction).GetObject().(*corev1.Event)
		seq++
		ev.Name = fmt.Sprintf("%s%d", ev.GenerateName, seq)
		return false, nil, nil
	})
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
		!strings.Contains(retired[len(retired)-1].Message, "requested by alice via kubectl-label") {
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

// A queued holder takes a slot whose holder crashed when its Lease expires,
// though nothing changes on the API server: a timer stands for the expiry.
func TestSlotExpiresWhileQueued(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	crashed := &Slots{Client: clientset.Wrap(c), Namespace: "ns", Holder: "dead", N: 1, Duration: 30 * time.Second, Clock: clk, Log: discard()}
	if ok, err := crashed.try(ctx, SlotLeaseName(0)); ok == nil || err != nil {
		t.Fatal(ok, err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := (&Slots{Client: clientset.Wrap(c), Namespace: "ns", Holder: "alive", N: 1, Duration: 30 * time.Second, Clock: clk, Log: discard()}).Acquire(ctx)
		got <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); !clk.HasWaiters(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the queued holder never waited")
		}
	}
	clk.Step(29 * time.Second) // past the first try's spread; the Lease lives on
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
			if !clk.Now().After(time.Unix(1030, 0)) {
				t.Fatalf("took a live slot at %v; it expires at %v", clk.Now(), time.Unix(1030, 0))
			}
			return
		case <-time.After(20 * time.Millisecond):
			clk.Step(100 * time.Millisecond)
		}
	}
	t.Fatal("expired slot not taken by the queued holder")
}

// acquireStepping takes a slot, moving the fake clock past the spread of
// the first try.
func acquireStepping(t *testing.T, clk *clocktesting.FakeClock, s *Slots) (reconcile.Slot, error) {
	t.Helper()
	type res struct {
		release reconcile.Slot
		err     error
	}
	got := make(chan res, 1)
	go func() { r, err := s.Acquire(context.Background()); got <- res{r, err} }()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		select {
		case r := <-got:
			return r.release, r.err
		case <-time.After(10 * time.Millisecond):
			clk.Step(50 * time.Millisecond)
		}
	}
	t.Fatal("no slot taken")
	return nil, nil
}
