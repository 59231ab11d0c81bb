package lease

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// First come, first served: a node's place in line is its ticket, when it
// first saw the slots.

// t0 is the start of the tests' changes (the fake clock's time).
var t0 = time.Unix(100000, 0)

// ticketOf is the ticket of a change begun ms milliseconds after t0.
func ticketOf(ms int) int64 { return t0.Add(time.Duration(ms) * time.Millisecond).UnixMilli() }

// ticketedSlot is slot name held by holderName (ticket at 0 ms) with the
// nodes of queue in its queue, each with the ticket of its change: queue
// alternates node names and the milliseconds after t0 their changes began.
func ticketedSlot(t *testing.T, c *fake.Clientset, name, holderName string, queue ...any) {
	t.Helper()
	queuedSlot(t, c, name, holderName)
	l := getSlot(t, c, name)
	l.Annotations[AnnotationTicket] = strconv.FormatInt(ticketOf(0), 10)
	for i := 0; i < len(queue); i += 2 {
		n := queue[i].(string)
		l.Annotations[queueKey(n)] = fmt.Sprintf("%d %s", ticketOf(queue[i+1].(int)), n)
	}
	if _, err := c.CoordinationV1().Leases("ns").Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// joinTurn: the next in line joins first, TicketPace times its distance
// from the node just ahead of it in line, or from the node just behind it
// when that one is in line already (it is passed over: a lull before its
// wave does not hold it back); one that nobody in line is ahead of at once; one farther than the window after it, one window more each
// time its distance doubles, in ticket order; any
// while no slot shows a ticket over the window, in hash order.
func TestJoinTurnByTicket(t *testing.T) {
	s := &Slots{}
	line := []int64{ticketOf(100), ticketOf(120), ticketOf(200)}
	for _, tc := range []struct {
		name   string
		ticket int64
		line   []int64
		want   time.Duration
	}{
		{"no ticket seen: hash order over the window", ticketOf(150), nil, 250 * time.Millisecond},
		{"ahead of everyone in line", ticketOf(90), line, 0},
		{"passed over: 5 ms behind the node ahead", ticketOf(125), line, 5 * TicketPace * time.Millisecond},
		{"level with the last in line: passed over, at once", ticketOf(200), line, 0},
		{"after a lull, 10 ms before a node in line", ticketOf(190), line, 10 * TicketPace * time.Millisecond},
		{"5 ms behind the last", ticketOf(205), line, 5 * TicketPace * time.Millisecond},
		{"at the window", ticketOf(400), line, time.Second},
		{"twice the window behind: one window later", ticketOf(600), line, 2 * time.Second},
		{"four times: two windows later", ticketOf(1000), line, 3 * time.Second},
	} {
		s.ticket.Store(tc.ticket)
		if got := s.joinTurn(tc.line, time.Second, 0.25); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A queue is served in ticket order, whoever joined first: a join writes
// the node's ticket, the hand-off goes to the earliest, and carries its
// ticket onto the slot; a take writes the taker's own.
func TestQueueServesByTicket(t *testing.T) {
	ctx := context.Background()
	c, clk := versionedFake()
	ticketedSlot(t, c, SlotLeaseName(0), "x")
	late, early := newSlots(c, clk, "late"), newSlots(c, clk, "early")
	late.ticket.Store(ticketOf(50))
	early.ticket.Store(ticketOf(20))
	for _, s := range []*Slots{late, early} { // late joins first
		if _, err := s.join(ctx, SlotLeaseName(0)); err != nil {
			t.Fatal(err)
		}
	}
	if q := queueOf(getSlot(t, c, SlotLeaseName(0))); len(q) != 2 || q[0].node != "early" {
		t.Fatalf("queue %v, want early first", q)
	}
	x := newSlots(c, clk, "x")
	if to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), storeOf(c)); err != nil || to != "early" {
		t.Fatalf("handed to %q (%v), want early, whose change began first", to, err)
	}
	l := getSlot(t, c, SlotLeaseName(0))
	if got := l.Annotations[AnnotationTicket]; got != strconv.FormatInt(ticketOf(20), 10) {
		t.Errorf("the hand-off wrote ticket %s, want early's", got)
	}
	if line := inLine(nil, l, queueOf(l)); fmt.Sprint(line) != fmt.Sprint([]int64{ticketOf(20), ticketOf(50)}) {
		t.Errorf("in line on the slot: %v, want early's and late's tickets", line)
	}
	// A take (here a create) writes the taker's ticket.
	w := newSlots(c, clk, "w")
	w.ticket.Store(ticketOf(70))
	got, err := w.try(ctx, SlotLeaseName(1))
	if err != nil || got == nil || got.Annotations[AnnotationTicket] != strconv.FormatInt(ticketOf(70), 10) {
		t.Fatalf("take: %v %v", got, err)
	}
}

// Nodes waiting beyond a full queue join it in the order they asked (first
// saw the slots), one a place, whatever their names hash to (before
// tickets, a hash of the place chose: any of the 24 orders of four nodes;
// w1 w2 w3 w4 here).
func TestWaitingNodesJoinInTicketOrder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, clk := versionedFake()
	ticketedSlot(t, c, SlotLeaseName(0), "x", "a", 1, "b", 2)
	// They ask 10 ms apart: w2, w4, w3, then w1.
	began := map[string]int{}
	for i, n := range []string{"w2", "w4", "w3", "w1"} {
		clk.Step(10 * time.Millisecond)
		s := newSlots(c, clk, n)
		go func() { _, _ = s.Acquire(ctx) }()
		waitUntil(t, n+" looks", func() bool { return s.ticket.Load() != 0 })
		began[n] = 10 * (i + 1)
	}
	time.Sleep(50 * time.Millisecond)
	var order []string
	holderName := "x"
	for len(order) < 4 {
		// The holder hands the slot on, once the last join reached the
		// waiting nodes' caches (they see the queue full): a place opens.
		time.Sleep(30 * time.Millisecond)
		h := newSlots(c, clk, holderName)
		to, err := h.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), storeOf(c))
		if err != nil {
			t.Fatal(err)
		}
		holderName = to
		// Joins come TicketPace × 10 ms apart: 10 ms steps tell them apart.
		var joined []string
		for range 200 {
			time.Sleep(10 * time.Millisecond) // a join reaches the others' caches
			clk.Step(10 * time.Millisecond)
			joined = joined[:0]
			for _, e := range queueOf(getSlot(t, c, SlotLeaseName(0))) {
				if _, ok := began[e.node]; ok && !slices.Contains(order, e.node) {
					joined = append(joined, e.node)
				}
			}
			if len(joined) > 0 {
				break
			}
		}
		if len(joined) != 1 {
			t.Fatalf("after %v, joined at once: %v", order, joined)
		}
		order = append(order, joined[0])
	}
	if fmt.Sprint(order) != "[w2 w4 w3 w1]" {
		t.Errorf("joined in the order %v, want [w2 w4 w3 w1] (by when they asked)", order)
	}
}

// A node that looks long after its join turn (its process or watch held
// up) counts its turn again from then, once while the queue has a place:
// its cache likely misses the joins of the nodes before it. A node nobody
// in line is ahead of joins at once however late.
func TestLateJoinTurnCountsAgainOnce(t *testing.T) {
	c, clk := versionedFake()
	ticketedSlot(t, c, SlotLeaseName(0), "x", "a", 1) // a place open
	w := newSlots(c, clk, "w")
	w.ticket.Store(ticketOf(11)) // 10 ms behind a
	turn := 10 * TicketPace * time.Millisecond
	seen := map[string]roomSeen{}
	store := storeOf(c)
	if on, wait := w.room(store, time.Second, seen, clk.Now()); on != SlotLeaseName(0) || wait != turn {
		t.Fatalf("first look: %q %v, want its turn %v", on, wait, turn)
	}
	if _, wait := w.room(store, time.Second, seen, clk.Now().Add(500*time.Millisecond)); wait != turn {
		t.Errorf("late look: wait %v, want its turn counted again (%v)", wait, turn)
	}
	if _, wait := w.room(store, time.Second, seen, clk.Now().Add(time.Second)); wait != turn-500*time.Millisecond {
		t.Errorf("late again: wait %v, want %v (counted again only once)", wait, turn-500*time.Millisecond)
	}
	first := newSlots(c, clk, "first")
	first.ticket.Store(ticketOf(-5)) // before everyone in line
	seen = map[string]roomSeen{}
	first.room(store, time.Second, seen, clk.Now())
	if _, wait := first.room(store, time.Second, seen, clk.Now().Add(500*time.Millisecond)); wait >= 0 {
		t.Errorf("a node nobody is ahead of waits %v when late", wait)
	}
}

// Joins that came at once overrun queues by different lengths: a holder
// hands its slot to the second node of another queue when that node asked
// before its own queue's first and at least N/2 nodes in line (that one
// included) asked between them; not otherwise.
func TestHandOffServesANodePassedOverInAnotherQueue(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		other []any // slot 1's queue
		want  string
	}{
		{"its second passed over by two", []any{"p", 1, "q", 2, "r", 5}, "q"},
		{"passed over by one only", []any{"p", 1, "q", 2, "r", 30, "s", 40}, "a"},
		{"its second asked later", []any{"p", 1, "q", 20, "r", 30, "s", 40}, "a"},
	} {
		c, clk := versionedFake()
		ticketedSlot(t, c, SlotLeaseName(0), "x", "a", 10, "b", 11)
		ticketedSlot(t, c, SlotLeaseName(1), "v", tc.other...)
		x := newSlots(c, clk, "x")
		x.N = 4 // slots 2 and 3 not made yet
		if to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), storeOf(c)); err != nil || to != tc.want {
			t.Errorf("%s: handed to %q (%v), want %s", tc.name, to, err, tc.want)
		}
	}
}

// A queue that joins overran holds passed-over nodes beyond its second: a
// holder picks among the earliest of them (its third too), so that
// holders done at once do not all take its second; not one that fewer
// than N/2 waiting nodes asked after.
func TestHandOffServesBeyondTheSecondOfAnOverrunQueue(t *testing.T) {
	ctx := context.Background()
	got := map[string]int{}
	for range 40 {
		c, clk := versionedFake()
		ticketedSlot(t, c, SlotLeaseName(0), "x", "a", 10, "b", 11)
		ticketedSlot(t, c, SlotLeaseName(1), "v", "p", 1, "q", 2, "r", 3, "s", 4)
		x := newSlots(c, clk, "x")
		x.N = 4 // slots 2 and 3 not made yet
		to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), storeOf(c))
		if err != nil {
			t.Fatal(err)
		}
		got[to]++
	}
	// q is passed over by r, s and a; r by s and a; s by a alone.
	if got["q"] == 0 || got["r"] == 0 || got["q"]+got["r"] != 40 {
		t.Errorf("handed to %v in 40 hand-offs, want q and r only, both", got)
	}
}

// The first of another queue waits on its own holder, which would hand it
// the slot next: a holder hands it its own slot instead only once a round
// of nodes (N) that asked after it would go first, as they do behind a
// holder that holds long.
func TestHandOffServesTheFirstOfASlowQueue(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		third []any // slot 3's queue
		want  string
	}{
		{"passed over by a round (N = 4: c, f, g, a)", []any{"f", 3, "g", 4}, "p"},
		{"passed over by three only", []any{"f", 3}, "a"},
	} {
		c, clk := versionedFake()
		ticketedSlot(t, c, SlotLeaseName(0), "x", "a", 10, "b", 11)
		ticketedSlot(t, c, SlotLeaseName(1), "v", "p", 1)
		ticketedSlot(t, c, SlotLeaseName(2), "w", "c", 2)
		ticketedSlot(t, c, SlotLeaseName(3), "y", tc.third...)
		x := newSlots(c, clk, "x")
		x.N = 4
		if to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), storeOf(c)); err != nil || to != tc.want {
			t.Errorf("%s: handed to %q (%v), want %s", tc.name, to, err, tc.want)
		}
	}
}

// A queue overrun by nodes that asked later still has a place for a node
// that asked before them: it joins ahead of them, not after they drain.
func TestFullQueueHasAPlaceForAnEarlierNode(t *testing.T) {
	c, clk := versionedFake()
	ticketedSlot(t, c, SlotLeaseName(0), "x", "a", 10, "b", 30, "c", 40)
	store := storeOf(c)
	for _, tc := range []struct {
		ticket int
		place  bool
	}{{5, true}, {20, true}, {35, false}, {50, false}} {
		w := newSlots(c, clk, "w")
		w.ticket.Store(ticketOf(tc.ticket))
		on, _ := w.room(store, time.Second, map[string]roomSeen{}, clk.Now())
		if (on != "") != tc.place {
			t.Errorf("asked %d ms after t0 (queue a 10, b 30, c 40): place %q, want one: %v", tc.ticket, on, tc.place)
		}
	}
}
