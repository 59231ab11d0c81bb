package lease

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
)

// The queue's failure paths: a node handed a slot it never saw, a node
// that stops waiting, a node handed two slots, a holder whose queue is
// empty, an RBAC without patch, and joins that must not keep a dead
// holder's slot alive.

// queuedSlot is slot 0 held by "holder" (a Lease written by hand), with
// the nodes of queue in its queue, in that order.
func queuedSlot(t *testing.T, c *fake.Clientset, name string, holderName string, queue ...string) {
	t.Helper()
	now := metav1.NewMicroTime(time.Unix(100000, 0))
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns",
		Labels:      map[string]string{LabelRolloutSlot: "true"},
		Annotations: map[string]string{}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holderName), LeaseDurationSeconds: ptr.To[int32](30), AcquireTime: &now, RenewTime: &now}}
	for i, n := range queue {
		l.Annotations[queueKey(n)] = fmt.Sprintf("%d %s", i+1, n)
	}
	if _, err := c.CoordinationV1().Leases("ns").Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func getSlot(t *testing.T, c *fake.Clientset, name string) *coordinationv1.Lease {
	t.Helper()
	l, err := c.CoordinationV1().Leases("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A slot handed to a node whose agent dies before its first renewal is
// judged, once it expires, by every mark of a change the Node shows, not
// by the taint alone: with --taint=false a node that began (pending,
// pods evicted) has no taint, and its state label or a paused GPU Operator
// operand keeps the slot. Only a Node that shows none frees it.
func TestHandedSlotJudgedByEveryMark(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		labels map[string]string
		taint  bool
		kept   bool
	}{
		{"pending, no taint (--taint=false)", map[string]string{record.LabelState: record.StatePending}, false, true},
		{"rebooting, no taint", map[string]string{record.LabelState: record.StateRebooting}, false, true},
		{"an operand paused, no taint", map[string]string{record.OperandDeployPrefix + "dcgm": record.OperandPaused}, false, true},
		{"tainted", map[string]string{record.LabelState: record.StatePending}, true, true},
		{"whole", map[string]string{record.LabelState: record.StateSuccess, record.OperandDeployPrefix + "dcgm": "true"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "y", Labels: tc.labels}}
			if tc.taint {
				node.Spec.Taints = []corev1.Taint{{Key: record.TaintReconfiguring, Effect: corev1.TaintEffectNoSchedule}}
			}
			c, clk := versionedFake(node)
			queuedSlot(t, c, SlotLeaseName(0), "x", "y")
			x := newSlots(c, clk, "x")
			if to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), nil); err != nil || to != "" {
				t.Fatalf("without a watch, a release: %q %v", to, err)
			}
			// Again, with the queue in view: handed to y.
			queuedSlot(t, c, SlotLeaseName(1), "x", "y")
			x.N = 2
			store := storeOf(c)
			if to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(1)), store); err != nil || to != "y" {
				t.Fatalf("hand-off: %q %v", to, err)
			}
			l := getSlot(t, c, SlotLeaseName(1))
			if holder(l) != "y" || l.Annotations[AnnotationHandedTo] != "y" || l.Annotations[queueKey("y")] != "" {
				t.Fatalf("handed slot: %v", l)
			}
			z := newSlots(c, clk, "z")
			if got, _ := z.try(ctx, SlotLeaseName(1)); got != nil {
				t.Fatal("took a slot just handed on")
			}
			clk.Step(31 * time.Second) // y never renewed it
			got, _ := z.try(ctx, SlotLeaseName(1))
			if tc.kept && got != nil {
				t.Fatalf("took the slot of a node that shows a change under way (%v, taint %v)", tc.labels, tc.taint)
			}
			if !tc.kept && got == nil {
				t.Fatal("the slot of a whole node is kept")
			}
		})
	}
}

// storeOf is a store of the slot Leases as they are now.
func storeOf(c *fake.Clientset) cache.Store {
	l, _ := c.CoordinationV1().Leases("ns").List(context.Background(), metav1.ListOptions{})
	s := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for i := range l.Items {
		_ = s.Add(&l.Items[i])
	}
	return s
}

// Queue joins are not the holder's writes: a holder that stopped renewing
// loses its slot one lease duration after its last renewal, however many
// nodes join its queue meanwhile.
func TestJoinsDoNotRenewADeadHolder(t *testing.T) {
	ctx := context.Background()
	c, clk := versionedFake()
	a, b := newSlots(c, clk, "a"), newSlots(c, clk, "b")
	if got, err := a.try(ctx, SlotLeaseName(0)); got == nil || err != nil {
		t.Fatal(got, err)
	}
	_, _ = b.try(ctx, SlotLeaseName(0)) // b sees a's record
	for i := range 4 {
		clk.Step(7 * time.Second)
		j := newSlots(c, clk, fmt.Sprintf("j%d", i))
		if _, err := j.patchQueue(ctx, SlotLeaseName(0), fmt.Sprintf("%d j%d", i+1, i)); err != nil {
			t.Fatal(err)
		}
		if got, _ := b.try(ctx, SlotLeaseName(0)); got != nil {
			t.Fatalf("took the slot %d s after its holder's last write", 7*(i+1))
		}
	}
	clk.Step(3 * time.Second) // 31 s since a's last renewal
	if got, err := b.try(ctx, SlotLeaseName(0)); got == nil || err != nil {
		t.Fatalf("the joins kept a dead holder's slot: %v %v", got, err)
	}
	if q := queueOf(getSlot(t, c, SlotLeaseName(0))); len(q) != 4 {
		t.Errorf("the take lost the queue: %v", q)
	}
}

// A node that stops waiting (its change cancelled) leaves the queue, so
// that it is never handed a slot it would not use.
func TestCancelledWaitLeavesTheQueue(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c, clk := versionedFake()
	queuedSlot(t, c, SlotLeaseName(0), "x")
	s := newSlots(c, clk, "w")
	done := make(chan error, 1)
	go func() { _, err := s.Acquire(ctx); done <- err }()
	waitUntil(t, "w joins the queue", func() bool {
		clk.Step(10 * time.Millisecond)
		return getSlot(t, c, SlotLeaseName(0)).Annotations[queueKey("w")] != ""
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire: %v", err)
	}
	if l := getSlot(t, c, SlotLeaseName(0)); len(queueOf(l)) != 0 {
		t.Errorf("the cancelled node is still queued: %v", l.Annotations)
	}
}

// A node handed two slots at once (two holders saw it waiting) keeps one
// and hands the other on, to the next of that slot's queue.
func TestTwoSlotsHandedAtOnce(t *testing.T) {
	ctx := context.Background()
	c, clk := versionedFake()
	queuedSlot(t, c, SlotLeaseName(0), "x", "y", "z")
	queuedSlot(t, c, SlotLeaseName(1), "v", "y")
	x, v := newSlots(c, clk, "x"), newSlots(c, clk, "v")
	x.N, v.N = 2, 2
	y := newSlots(c, clk, "y")
	y.N = 2
	got := make(chan string, 1)
	go func() {
		h, err := y.Acquire(ctx)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- h.(*slotHold).name
	}()
	waitUntil(t, "y watches", func() bool { return clk.HasWaiters() })
	stale := storeOf(c) // v's cache has not seen x's hand-off yet
	if to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), stale); err != nil || to != "y" {
		t.Fatalf("x: %q %v", to, err)
	}
	if to, err := v.handOver(ctx, getSlot(t, c, SlotLeaseName(1)), stale); err != nil || to != "y" {
		t.Fatalf("v, before x's hand-off reached its cache: %q %v", to, err)
	}
	var kept string
	select {
	case kept = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("y took no slot")
	}
	other := SlotLeaseName(1)
	if kept == other {
		other = SlotLeaseName(0)
	}
	waitUntil(t, "y hands on the other slot", func() bool { return holder(getSlot(t, c, other)) != "y" })
	if l := getSlot(t, c, other); other == SlotLeaseName(0) && holder(l) != "z" || other == SlotLeaseName(1) && holder(l) != "" {
		t.Errorf("the slot y did not keep went to %q, want the next of its queue (or released)", holder(l))
	}
}

// handedAcross makes slot 0 held by x with an empty queue and slot 1 held
// by v with p, q and r queued; q waits for a slot, and x, done, hands it
// slot 0 (the second of the longer queue). It returns q and its slot.
func handedAcross(ctx context.Context, t *testing.T, c *fake.Clientset, clk *clocktesting.FakeClock) (*Slots, reconcile.Slot) {
	t.Helper()
	queuedSlot(t, c, SlotLeaseName(0), "x")
	queuedSlot(t, c, SlotLeaseName(1), "v", "p", "q", "r")
	q := newSlots(c, clk, "q")
	q.N = 2
	got := make(chan reconcile.Slot, 1)
	go func() {
		slot, err := q.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- slot
	}()
	waitUntil(t, "q watches", func() bool { return clk.HasWaiters() })
	x := newSlots(c, clk, "x")
	x.N = 2
	if to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), storeOf(c)); err != nil || to != "q" {
		t.Fatalf("x: %q %v (%v), want q, the second of the longer queue", to, err, apierrors.ReasonForError(err))
	}
	return q, <-got
}

// A holder whose own queue is empty hands its slot to the second node of a
// longer queue (the one that has waited longest after the first, which its
// own holder serves next). That node stays in its first queue while it
// holds, at no request: that queue's holder removes the entry in its own
// hand-off, and the node sends no leave of its own when it releases.
func TestEmptyQueueTakesFromALongerOne(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, clk := versionedFake()
	var leaves atomic.Int32
	c.PrependReactor("patch", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.PatchAction).GetPatchType() == types.MergePatchType {
			leaves.Add(1)
		}
		return false, nil, nil
	})
	q, slot := handedAcross(ctx, t, c, clk)
	if qs := queueOf(getSlot(t, c, SlotLeaseName(1))); len(qs) != 3 || leaves.Load() != 0 {
		t.Fatalf("q left its first queue at once (%d leaves; queue %v): a request the hand-off of v removes for free", leaves.Load(), qs)
	}
	v := newSlots(c, clk, "v")
	v.N = 2
	if to, err := v.handOver(ctx, getSlot(t, c, SlotLeaseName(1)), storeOf(c)); err != nil || to != "p" {
		t.Fatalf("v: %q %v, want p", to, err)
	}
	if qs := queueOf(getSlot(t, c, SlotLeaseName(1))); len(qs) != 1 || qs[0].node != "r" {
		t.Fatalf("after v's hand-off the queue is %v, want r alone (q's entry removed in the same write)", qs)
	}
	waitUntil(t, "q's cache shows its entry gone", func() bool { return q.queuedOn(slot.(*slotHold).store) == "" })
	slot.Release(false)
	if n := leaves.Load(); n != 0 {
		t.Errorf("q sent %d leaves at its release, its entry gone already", n)
	}
	if holder(getSlot(t, c, SlotLeaseName(0))) != "" {
		t.Errorf("slot 0 after q's release: held by %q", holder(getSlot(t, c, SlotLeaseName(0))))
	}
}

// A node served by another slot that releases it while still in its first
// queue leaves that queue first: with no slot, that queue's holder would
// otherwise hand it a slot it no longer waits for.
func TestReleaseLeavesTheFirstQueue(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, clk := versionedFake()
	_, slot := handedAcross(ctx, t, c, clk)
	slot.Release(false)
	if qs := queueOf(getSlot(t, c, SlotLeaseName(1))); len(qs) != 2 || qs[0].node != "p" || qs[1].node != "r" {
		t.Fatalf("after q's release the queue of slot 1 is %v, want p, r", qs)
	}
	v := newSlots(c, clk, "v")
	v.N = 2
	if to, err := v.handOver(ctx, getSlot(t, c, SlotLeaseName(1)), storeOf(c)); err != nil || to != "p" {
		t.Fatalf("v: %q %v, want p", to, err)
	}
}

// A slot handed to a node while it holds another, that its watch shows
// only once it has begun its release (two holders saw it waiting at once,
// and strays ended with the hold), is handed on by the release: nobody
// else would, and its queue would wait until it expired.
func TestReleaseHandsOnAStraySlot(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, clk := versionedFake()
	_, slot := handedAcross(ctx, t, c, clk)
	// v hands slot 1 to q as q's release is sent: written through the
	// tracker (a reactor may not call the clientset it runs in).
	var once atomic.Bool
	c.PrependReactor("patch", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		if pa.GetPatchType() != types.JSONPatchType || pa.GetName() != SlotLeaseName(0) || !once.CompareAndSwap(false, true) {
			return false, nil, nil
		}
		o, err := c.Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), "ns", SlotLeaseName(1))
		if err != nil {
			t.Error(err)
			return false, nil, nil
		}
		l := o.(*coordinationv1.Lease).DeepCopy()
		l.Spec.HolderIdentity = ptr.To("q")
		l.Annotations[AnnotationHandedTo] = "q"
		if err := c.Tracker().Update(coordinationv1.SchemeGroupVersion.WithResource("leases"), l, "ns"); err != nil {
			t.Error(err)
		}
		return false, nil, nil
	})
	slot.Release(false)
	if !once.Load() {
		t.Fatal("q's release sent no hand-off of slot 0")
	}
	if h := holder(getSlot(t, c, SlotLeaseName(1))); h != "p" {
		t.Errorf("slot 1, handed to q during its release, is held by %q, want p (the next of its queue)", h)
	}
}

// An RBAC from before the queue (no patch): the node waits for a freed
// slot as before, without a queue, and is not stuck.
func TestNoPatchWaitsWithoutAQueue(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, clk := versionedFake()
	var joins atomic.Int32
	c.PrependReactor("patch", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.PatchAction).GetPatchType() == types.MergePatchType {
			joins.Add(1)
			return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), "x", errors.New("RBAC: patch not allowed"))
		}
		return false, nil, nil
	})
	queuedSlot(t, c, SlotLeaseName(0), "x")
	w := newSlots(c, clk, "w")
	got := make(chan error, 1)
	go func() { _, err := w.Acquire(ctx); got <- err }()
	waitUntil(t, "w tries to join", func() bool {
		clk.Step(50 * time.Millisecond)
		return joins.Load() > 0
	})
	x := newSlots(c, clk, "x")
	for range 5 { // x renews: each renewal wakes w, which does not ask again
		clk.Step(time.Second)
		if got, err := x.try(ctx, SlotLeaseName(0)); got == nil || err != nil {
			t.Fatalf("x renews: %v %v", got, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Refused once, it stops asking.
	if n := joins.Load(); n != 1 {
		t.Errorf("%d joins tried with patch forbidden, want 1", n)
	}
	if to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), storeOf(c)); err != nil || to != "" {
		t.Fatalf("x: %q %v", to, err)
	}
	for range 200 {
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
			if h := holder(getSlot(t, c, SlotLeaseName(0))); h != "w" {
				t.Fatalf("holder %q", h)
			}
			return
		default:
		}
		time.Sleep(2 * time.Millisecond)
		clk.Step(100 * time.Millisecond)
	}
	t.Fatal("w never took the freed slot")
}

// A slot handed on is not handed on again while a cache behind still shows
// it handed to this node (that would cost a failed patch and a read, and
// the wait would keep a slot that is no longer its own).
func TestHandedOnOnce(t *testing.T) {
	ctx := context.Background()
	c, clk := versionedFake()
	queuedSlot(t, c, SlotLeaseName(0), "x", "y", "z")
	x := newSlots(c, clk, "x")
	if to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), storeOf(c)); err != nil || to != "y" {
		t.Fatalf("x: %q %v", to, err)
	}
	stale := getSlot(t, c, SlotLeaseName(0)) // handed to y
	y := newSlots(c, clk, "y")
	if !y.handedHere(stale) {
		t.Fatal("a slot handed to y is not y's")
	}
	y.handOn(ctx, stale, storeOf(c))
	if h := holder(getSlot(t, c, SlotLeaseName(0))); h != "z" {
		t.Fatalf("handed on to %q, want z", h)
	}
	before := len(c.Actions())
	if y.handedHere(stale) {
		t.Error("y's cache, behind its hand-on, makes the slot y's again")
	}
	if s := y.handed(ctx, storeFrom(stale)); s != nil || len(c.Actions()) != before {
		t.Errorf("the wait kept or handed on again a slot already handed on: %v, %d requests", s, len(c.Actions())-before)
	}
}

// A place in a queue: a node of the queue that holds a slot already (served
// by another) leaves its place to the nodes still waiting.
func TestRoomCountsOnlyWaitingNodes(t *testing.T) {
	c := newFake()
	clk := clocktesting.NewFakeClock(time.Unix(100000, 0))
	queuedSlot(t, c, SlotLeaseName(0), "x", "a", "b")
	queuedSlot(t, c, SlotLeaseName(1), "a", "p", "q") // held by a, queue full
	w := newSlots(c, clk, "w")
	w.ticket.Store(ticketOf(0)) // asked after a and b
	w.N = 1
	if on, _ := w.room(storeOf(c), time.Second, map[string]roomSeen{}, clk.Now()); on != "" {
		t.Fatalf("a full queue (a and b waiting) offered a place: %q", on)
	}
	w.N = 2 // slot 1 in view: a holds it
	if on, _ := w.room(storeOf(c), time.Second, map[string]roomSeen{}, clk.Now()); on != SlotLeaseName(0) {
		t.Fatalf("no place offered where a, served by another slot, left one: %q", on)
	}
}

// storeFrom is a store holding ls.
func storeFrom(ls ...*coordinationv1.Lease) cache.Store {
	s := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for _, l := range ls {
		_ = s.Add(l)
	}
	return s
}

// A queued node does not make a slot that does not exist yet while slots
// are still being made: at the start of a pool-wide change that slot is
// another node's home slot, made a moment ago or about to be, and a create
// would likely lose (measured, K = 200, N = 50: 80 to 188 lost creates a
// rollout, most of them by nodes already queued; 38 to 45 without). Once
// no slot has been made for two windows, a slot still absent is nobody's
// home: a queued node with another ahead of it makes it, lest the pool run
// on fewer than N slots.
func TestQueuedNodeMakesASlotOnceMakingSettles(t *testing.T) {
	ctx := context.Background()
	c, clk := versionedFake()
	const n = 12
	// A node whose home is slot 0, held by x, queued there behind v (the
	// next of a queue goes next anyway: it makes no slot).
	w := ""
	for i := 0; w == ""; i++ {
		if name := fmt.Sprint("w", i); int(unitHash(name)*n) == 0 {
			w = name
		}
	}
	queuedSlot(t, c, SlotLeaseName(0), "x", "v", w)
	s := newSlots(c, clk, w)
	s.N = n
	got := make(chan reconcile.Slot, 1)
	go func() {
		slot, err := s.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- slot
	}()
	step := func(d time.Duration) {
		for range d / (50 * time.Millisecond) {
			time.Sleep(2 * time.Millisecond)
			clk.Step(50 * time.Millisecond)
		}
	}
	absent := func(i int) bool {
		_, err := c.CoordinationV1().Leases("ns").Get(ctx, SlotLeaseName(i), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}
	// Other nodes make slots 2..11, one a second: ten seconds, five
	// windows of 2 s.
	for i := 2; i < n; i++ {
		step(time.Second)
		queuedSlot(t, c, SlotLeaseName(i), fmt.Sprint("h", i))
		if !absent(1) {
			t.Fatalf("the queued node made slot 1 while slots were still being made (%d s in)", i-1)
		}
	}
	// Nobody makes slots any more: two windows on, slot 1 is made (by w,
	// the only node looking), within a third.
	step(3 * time.Second)
	if !absent(1) {
		t.Fatal("slot 1 made less than two windows after the last slot was made")
	}
	step(4 * time.Second)
	if absent(1) {
		t.Fatal("slot 1 never made: the pool runs on fewer slots than N")
	}
	select {
	case slot := <-got:
		if l := getSlot(t, c, SlotLeaseName(1)); holder(l) != w {
			t.Errorf("slot 1 held by %q, want %s", holder(l), w)
		}
		slot.Release(false)
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not return the slot it made")
	}
}

// A hand-off writes the window for the joins to come: twice as wide when
// the queue was overrun (more than QueueLength left behind the successor:
// joins came closer than the caches' delay), half when it is about to run
// dry (nobody left behind the successor), as is otherwise.
func TestHandOffWritesTheJoinWindow(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		queue []string
		want  string
	}{
		{[]string{"a", "b", "c", "d"}, "2000"}, // three left behind a: overrun
		{[]string{"a", "b", "c"}, "1000"},      // two left: as is
		{[]string{"a", "b"}, "1000"},
		{[]string{"a"}, "500"}, // none left: about to run dry
	} {
		c, clk := versionedFake()
		queuedSlot(t, c, SlotLeaseName(0), "x", tc.queue...)
		l := getSlot(t, c, SlotLeaseName(0))
		l.Annotations[AnnotationTurnWindow] = "1000"
		if _, err := c.CoordinationV1().Leases("ns").Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		x := newSlots(c, clk, "x")
		if to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), storeOf(c)); err != nil || to != "a" {
			t.Fatalf("handed to %q (%v), want a", to, err)
		}
		if got := getSlot(t, c, SlotLeaseName(0)).Annotations[AnnotationTurnWindow]; got != tc.want {
			t.Errorf("queue %v: the hand-off wrote a window of %s ms, want %s", tc.queue, got, tc.want)
		}
	}
}

// The next of a queue makes no slot, even one nobody made: it goes next
// anyway, and a create would only race the nodes behind it.
func TestNextInQueueMakesNoSlot(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, clk := versionedFake()
	queuedSlot(t, c, SlotLeaseName(0), "x", "w")
	s := newSlots(c, clk, "w")
	s.N = 2
	done := make(chan struct{})
	go func() { defer close(done); _, _ = s.Acquire(ctx) }()
	for range 200 { // 10 s of the fake clock: five windows
		time.Sleep(2 * time.Millisecond)
		clk.Step(50 * time.Millisecond)
	}
	if _, err := c.CoordinationV1().Leases("ns").Get(ctx, SlotLeaseName(1), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the next of a queue made slot 1: %v", err)
	}
	cancel()
	<-done
}
