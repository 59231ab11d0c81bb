package lease

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/migagent/mig-agent/reconcile"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// heldSlot is one slot held by "holder", on a fake API server that checks
// resourceVersions, and slot, which makes a queued node's Slots (window 1 s).
func heldSlot(t *testing.T) (context.Context, *fake.Clientset, *clocktesting.FakeClock, func(holder string) *Slots, reconcile.Slot) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c, clk := versionedFake()
	slot := func(holder string) *Slots {
		s := newSlots(c, clk, holder)
		s.Spread = time.Second
		return s
	}
	held, err := acquireStepping(t, clk, slot("holder"))
	if err != nil {
		t.Fatal(err)
	}
	return ctx, c, clk, slot, held
}

// A slot hand-off that does not herd (issue #28): nodes that find the slot
// held join its queue, one patch each, and wait without a request; when
// the holder is done, its one write hands the slot to the first of the
// queue, who goes on without a request. The queue takes QueueLength nodes;
// the others wait, sending nothing, and join as places open. Each node
// costs two slot Lease writes (its join and its own hand-off), whatever
// the number waiting.
func TestSlotHandedOnInQueueOrder(t *testing.T) {
	ctx, c, clk, slot, cur := heldSlot(t)
	type won struct {
		name string
		slot reconcile.Slot
	}
	got := make(chan won, 8)
	slotLease := func() *coordinationv1.Lease {
		l, err := c.CoordinationV1().Leases("ns").Get(ctx, SlotLeaseName(0), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	const nodes = QueueLength + 2
	for i := range nodes {
		s := slot(fmt.Sprintf("node-%d", i))
		go func() {
			if h, err := s.Acquire(ctx); err == nil {
				got <- won{s.Holder, h}
			}
		}()
		// In line 10 ms apart: their turns to join, 50 ms.
		waitUntil(t, s.Holder+" looks", func() bool { return s.ticket.Load() != 0 })
		clk.Step(10 * time.Millisecond)
	}
	// The first ones join the queue, each at its turn.
	waitUntil(t, "the queue fills", func() bool {
		clk.Step(5 * time.Millisecond)
		return len(queueOf(slotLease())) >= QueueLength
	})
	// The queue is full: the others wait; waiting costs nothing (short
	// of the holder's renewal, every 10 s).
	time.Sleep(20 * time.Millisecond)
	before := len(c.Actions())
	for range 20 {
		time.Sleep(2 * time.Millisecond)
		clk.Step(200 * time.Millisecond)
	}
	if n := len(c.Actions()) - before; n != 0 {
		t.Errorf("the waiting nodes sent %d requests while the slot stayed held: %v", n, c.Actions()[before:])
	}
	if q := queueOf(slotLease()); len(q) != QueueLength {
		t.Errorf("queue %v, want %d nodes", q, QueueLength)
	}
	served := 0
	for range nodes {
		l := slotLease()
		want := queueOf(l)[0].node
		cur.Release(false)
		var w won
		select {
		case w = <-got:
		case <-time.After(5 * time.Second):
			t.Fatalf("nobody was handed the slot; %s is first in the queue", want)
		}
		if w.name != want {
			t.Errorf("%s was handed the slot; %s is first in the queue", w.name, want)
		}
		l = slotLease()
		if holder(l) != want || l.Annotations[AnnotationHandedTo] != want {
			t.Fatalf("after the hand-off to %s: %v", want, l)
		}
		if _, ok := l.Annotations[queueKey(want)]; ok {
			t.Errorf("%s is still in the queue it was served from", want)
		}
		// A place opened: a waiting node joins at its turn.
		served++
		queued := min(QueueLength, nodes-served)
		waitUntil(t, "a waiting node joins the place that opened", func() bool {
			clk.Step(5 * time.Millisecond)
			return len(queueOf(slotLease())) == queued
		})
		cur = w.slot
	}
	cur.Release(false)
	l := slotLease()
	if holder(l) != "" || len(queueOf(l)) != 0 || l.Annotations[AnnotationHandedTo] != "" {
		t.Errorf("the queue served, the slot should be free and empty: %v", l)
	}
	// Every node joined once and handed on once; nothing else was written.
	joins, handOvers, other := 0, 0, 0
	for _, a := range c.Actions() {
		switch p, ok := a.(k8stesting.PatchAction); {
		case ok && p.GetPatchType() == types.MergePatchType:
			joins++
		case ok && p.GetPatchType() == types.JSONPatchType:
			handOvers++
		case a.GetVerb() == "update":
			other++
		}
	}
	// nodes+1 hand-offs (the last a release); no holder renewal: each
	// hold is under 10 s.
	if joins != nodes || handOvers != nodes+1 || other != 0 {
		t.Errorf("%d joins, %d hand-offs and %d updates for %d nodes; want one join a node and one write a hand-off (%d)", joins, handOvers, other, nodes, nodes+1)
	}
}

// The window every queued node sizes from the hand-offs it sees: a gap
// shorter than its target widens it, a longer one narrows it, by at most
// a factor of two a hand-off; when writes reach the caches slowly (a long
// delay), the target grows with it, so that turns stay about two delays
// apart instead of racing.
func TestHandOffWindow(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		window, gap, delay, want time.Duration
	}{
		{time.Second, 60 * ms, 10 * ms, time.Second},       // on target
		{time.Second, 30 * ms, 10 * ms, 2 * time.Second},   // a long queue: wider
		{time.Second, 5 * ms, 5 * ms, 2 * time.Second},     // at most twice
		{time.Second, 120 * ms, 10 * ms, 500 * ms},         // drained: narrower
		{time.Second, 5 * time.Second, 10 * ms, 500 * ms},  // at most half
		{200 * ms, 5 * time.Second, 10 * ms, minWindow},    // never below the floor
		{50 * time.Second, ms, ms, maxWindow},              // nor above the ceiling
		{time.Second, 150 * ms, 100 * ms, 2 * time.Second}, // slow caches: the target is 300 ms
		{time.Second, 300 * ms, 100 * ms, time.Second},     // … and is met
	} {
		if got := nextWindow(c.window, c.gap, c.delay); got != c.want {
			t.Errorf("nextWindow(%v, gap %v, delay %v) = %v, want %v", c.window, c.gap, c.delay, got, c.want)
		}
	}
}

// The window of a slot's next hand-off travels in the slot Lease
// (AnnotationTurnWindow), written by its taker with its take: every queued
// node, one that has just joined the queue included, spreads its turn over
// the same window. A taker early in the order (a long queue) widens it; one
// late in it (a short queue) narrows it.
func TestTurnWindowCarriedByLease(t *testing.T) {
	h := handOffs{window: 2 * time.Second, freed: map[string]time.Time{}}
	lease := func(v string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationTurnWindow: v}}}
	}
	for _, c := range []struct {
		l    *coordinationv1.Lease
		want time.Duration
	}{
		{nil, 2 * time.Second},
		{lease("5000"), 5 * time.Second},
		{lease("junk"), 2 * time.Second},
		{lease("-3"), 2 * time.Second},
		{lease("99999999"), maxWindow},
		{lease("1"), minWindow},
	} {
		if got := h.windowFor(c.l); got != c.want {
			t.Errorf("windowFor(%v) = %v, want %v", c.l, got, c.want)
		}
	}
	two := 2 * time.Second
	if got := h.next(two, 0.01); got <= 2*time.Second || got > 4*time.Second {
		t.Errorf("a taker at 1%% of the order (a long queue) wrote %v; want wider than 2s, at most twice", got)
	}
	if got := h.next(two, 0.5); got != time.Second {
		t.Errorf("a taker at half the order (a short queue) wrote %v; want 1s (halved)", got)
	}

	// The take of a freed slot writes it; the first take of a slot (its
	// create: no hand-off, nobody queued for it) does not.
	c := newFake()
	clk := clocktesting.NewFakeClock(time.Unix(100000, 0))
	s := newSlots(c, clk, "a")
	s.Spread = time.Second
	window := func() string {
		l, err := c.CoordinationV1().Leases("ns").Get(context.Background(), SlotLeaseName(0), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Annotations[AnnotationTurnWindow]
	}
	slot, err := acquireStepping(t, clk, s)
	if err != nil {
		t.Fatal(err)
	}
	if w := window(); w != "" {
		t.Errorf("the create wrote %s=%q; want none", AnnotationTurnWindow, w)
	}
	slot.Release(false)
	if _, err := acquireStepping(t, clk, newSlots(c, clk, "b")); err != nil {
		t.Fatal(err)
	}
	if ms, err := strconv.Atoi(window()); err != nil || ms <= 0 {
		t.Errorf("the take of the freed slot wrote %s=%q", AnnotationTurnWindow, window())
	}
}

// At the start of a pool-wide change every slot is absent and the slots are
// made one after another, seconds apart as agents get to them: those first
// takes are no hand-offs, and do not move the window (counted as gaps of
// seconds, they pushed it far from what the hand-offs that follow need).
func TestSlotsMadeDoNotMoveTheWindow(t *testing.T) {
	h := handOffs{window: 2 * time.Second, freed: map[string]time.Time{}}
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	now := time.Unix(1000, 0)
	h.observe(store, "ns", 3, "self", now) // all absent
	for i := range 3 {
		now = now.Add(3 * time.Second)
		_ = store.Add(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: SlotLeaseName(i)},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(fmt.Sprint("node-", i))}})
		h.observe(store, "ns", 3, "self", now)
	}
	if h.window != 2*time.Second || len(h.gaps) != 0 {
		t.Errorf("slots made moved the window to %v (gaps %v); want 2s, no gap", h.window, h.gaps)
	}
	// A freed slot taken 3 s later is a hand-off: it moves the window
	// (nextWindow: the least recent gap, 3 s, stands for slow caches).
	l0, _, _ := store.GetByKey("ns/" + SlotLeaseName(0))
	freed := l0.(*coordinationv1.Lease).DeepCopy()
	freed.Spec.HolderIdentity = ptr.To("")
	_ = store.Update(freed)
	h.observe(store, "ns", 3, "self", now)
	taken := freed.DeepCopy()
	taken.Spec.HolderIdentity = ptr.To("node-9")
	_ = store.Update(taken)
	h.observe(store, "ns", 3, "self", now.Add(3*time.Second))
	if want := nextWindow(2*time.Second, 3*time.Second, 3*time.Second); h.window != want || len(h.gaps) != 1 {
		t.Errorf("a hand-off of 3 s moved the window to %v (gaps %v); want %v, one gap", h.window, h.gaps, want)
	}
}

// With many slots the window follows every hand-off: every queued node uses
// the window written with the latest take of any slot (by acquireTime),
// the same for every reader of the same Leases.
func TestTurnWindowSharedAcrossSlots(t *testing.T) {
	h := handOffs{window: 2 * time.Second, freed: map[string]time.Time{}}
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	if got := h.shared(store, "ns", 3); got != 2*time.Second {
		t.Errorf("no slot carries a window: %v, want the node's own 2s", got)
	}
	at := func(sec int64) *metav1.MicroTime { m := metav1.NewMicroTime(time.Unix(sec, 0)); return &m }
	for i, c := range []struct {
		window string
		taken  *metav1.MicroTime
	}{{"5000", at(100)}, {"9000", at(300)}, {"7000", at(200)}} {
		_ = store.Add(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: SlotLeaseName(i),
			Annotations: map[string]string{AnnotationTurnWindow: c.window}}, Spec: coordinationv1.LeaseSpec{AcquireTime: c.taken}})
	}
	if got := h.shared(store, "ns", 3); got != 9*time.Second {
		t.Errorf("shared window %v, want 9s (the latest take's)", got)
	}
}
