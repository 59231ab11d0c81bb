package lease

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/migagent/mig-agent/reconcile"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
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
	c := fake.NewClientset()
	enforceResourceVersion(c)
	clk := clocktesting.NewFakeClock(time.Unix(100000, 0))
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

// A slot hand-off that does not herd (issue #28): eight nodes queue for
// one slot; when it is released, they try in the order all of them compute
// from the Lease data (turn): the first in that order takes it, and the
// Lease sees a bounded number of writes (not one per queued node).
func TestSlotHandOffInAgreedOrder(t *testing.T) {
	ctx, c, clk, slot, h := heldSlot(t)
	const queued = 8
	type won struct{ name string }
	got := make(chan won, queued)
	var qs []*Slots
	for i := range queued {
		s := slot(fmt.Sprintf("node-%d", i))
		qs = append(qs, s)
		go func() {
			if _, err := s.Acquire(ctx); err == nil {
				got <- won{s.Holder}
			}
		}()
	}
	// Every queued node has tried once (the first try's spread) and waits.
	for range 30 {
		time.Sleep(10 * time.Millisecond)
		clk.Step(50 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	before := len(c.Actions())
	h.Release()
	l, _ := c.CoordinationV1().Leases("ns").Get(ctx, SlotLeaseName(0), metav1.GetOptions{})
	if ptr.Deref(l.Spec.HolderIdentity, "") != "" {
		t.Fatal("not released")
	}
	first, best := "", time.Duration(1<<62)
	for _, s := range qs {
		if d := s.turn(candidate{name: l.Name, lease: l}, time.Second); d < best {
			first, best = s.Holder, d
		}
	}
	var winner string
	for range 400 {
		select {
		case w := <-got:
			winner = w.name
		default:
		}
		if winner != "" {
			break
		}
		time.Sleep(5 * time.Millisecond)
		clk.Step(10 * time.Millisecond)
	}
	if winner == "" {
		t.Fatal("no queued node took the released slot")
	}
	if winner != first {
		t.Errorf("%s took the slot; %s is first in the agreed order", winner, first)
	}
	// Let the others' turns pass: they find it taken in their caches.
	for range 150 {
		time.Sleep(2 * time.Millisecond)
		clk.Step(10 * time.Millisecond)
	}
	writes := 0
	for _, a := range c.Actions()[before:] {
		if a.GetResource().Resource == "leases" && (a.GetVerb() == "update" || a.GetVerb() == "create") {
			writes++
		}
	}
	// The release, the winner's take, and at most one loser that tried
	// before the take reached its cache.
	if writes > 3 {
		t.Errorf("%d Lease writes for one hand-off among %d queued nodes", writes, queued)
	}
}

// Fairness over a whole queue (issue #28): six nodes queue for one slot,
// and it is handed on until every one of them had it. At each release the
// slot goes to the node first in that release's agreed order among those
// still queued (its turn), or, when two turns fall too close for the
// first one's write to reach the other's cache, to one of the first three:
// no node waits more than two rounds past its turn. Each hand-off costs
// the release, the take and at most one lost race.
func TestSlotHandOffFairOverAQueue(t *testing.T) {
	ctx, c, clk, slot, cur := heldSlot(t)
	type won struct {
		name string
		slot reconcile.Slot
	}
	got := make(chan won, 8)
	queued := map[string]*Slots{}
	for i := range 6 {
		s := slot(fmt.Sprintf("node-%d", i))
		queued[s.Holder] = s
		go func() {
			if h, err := s.Acquire(ctx); err == nil {
				got <- won{s.Holder, h}
			}
		}()
	}
	for range 30 { // every queued node has tried once and waits
		time.Sleep(10 * time.Millisecond)
		clk.Step(50 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	for len(queued) > 0 {
		before := len(c.Actions())
		cur.Release()
		l, err := c.CoordinationV1().Leases("ns").Get(ctx, SlotLeaseName(0), metav1.GetOptions{})
		if err != nil || ptr.Deref(l.Spec.HolderIdentity, "x") != "" {
			t.Fatalf("not released: %v %v", l, err)
		}
		// The agreed order of this release among the nodes still queued.
		var order []string
		for name := range queued {
			order = append(order, name)
		}
		sort.Slice(order, func(i, j int) bool {
			return queued[order[i]].turn(candidate{name: l.Name, lease: l}, time.Second) < queued[order[j]].turn(candidate{name: l.Name, lease: l}, time.Second)
		})
		var w won
		for deadline := time.Now().Add(10 * time.Second); w.name == ""; {
			select {
			case w = <-got:
			case <-time.After(3 * time.Millisecond):
				clk.Step(5 * time.Millisecond)
			}
			if time.Now().After(deadline) {
				t.Fatalf("no queued node took the released slot; queued: %v", order)
			}
		}
		if pos := slices.Index(order, w.name); pos < 0 || pos > 2 {
			t.Errorf("%s took the slot at position %d of the agreed order %v: more than two rounds past the turn of %s", w.name, pos, order, order[0])
		}
		for range 50 { // the others' turns pass: they find it taken
			time.Sleep(time.Millisecond)
			clk.Step(5 * time.Millisecond)
		}
		writes := 0
		for _, a := range c.Actions()[before:] {
			if a.GetResource().Resource == "leases" && (a.GetVerb() == "update" || a.GetVerb() == "create") {
				writes++
			}
		}
		if writes > 3 {
			t.Errorf("%d Lease writes for the hand-off to %s among %d queued nodes; want the release, the take and at most one lost race", writes, w.name, len(order))
		}
		delete(queued, w.name)
		cur = w.slot
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

	// A take writes it.
	c := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(100000, 0))
	s := newSlots(c, clk, "a")
	s.Spread = time.Second
	if _, err := acquireStepping(t, clk, s); err != nil {
		t.Fatal(err)
	}
	l, err := c.CoordinationV1().Leases("ns").Get(context.Background(), SlotLeaseName(0), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ms, err := strconv.Atoi(l.Annotations[AnnotationTurnWindow]); err != nil || ms <= 0 {
		t.Errorf("the take wrote %s=%q", AnnotationTurnWindow, l.Annotations[AnnotationTurnWindow])
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
