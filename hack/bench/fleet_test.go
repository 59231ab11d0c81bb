package main

import (
	"testing"
	"time"

	"github.com/migagent/mig-agent/record"
)

// A node is late by the nodes that began after it but took a slot before
// it, over N.
func TestRoundsLate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	rec := func(started, disrupted int) record.ChangeRecord {
		d := t0.Add(time.Duration(disrupted) * time.Second)
		return record.ChangeRecord{StartedAt: t0.Add(time.Duration(started) * time.Second), DisruptedAt: &d}
	}
	// In order: nobody late.
	if most, over := roundsLate([]record.ChangeRecord{rec(0, 1), rec(1, 2), rec(2, 3)}, 1); most != 0 || over != 0 {
		t.Errorf("in order: %v rounds, %d over two", most, over)
	}
	// The first to begin is served last, after three later ones: three
	// rounds of one slot, one and a half of two.
	recs := []record.ChangeRecord{rec(0, 9), rec(1, 2), rec(2, 3), rec(3, 4)}
	if most, over := roundsLate(recs, 1); most != 3 || over != 1 {
		t.Errorf("N = 1: %v rounds, %d over two; want 3, 1", most, over)
	}
	if most, over := roundsLate(recs, 2); most != 1.5 || over != 0 {
		t.Errorf("N = 2: %v rounds, %d over two; want 1.5, 0", most, over)
	}
}

// Once queued, a node's turn: the nodes that began later (by ticket) and
// took its slot after it joined and before it took one.
func TestServedAhead(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tl := &slotTimeline{
		changes: map[string][]slotChange{
			"s0": {{at(0), "a"}, {at(100), "b"}, {at(200), "c"}, {at(300), ""}},
			"s1": {{at(0), "x"}, {at(250), "d"}},
		},
		joins: map[string]slotJoin{
			"b": {"s0", at(10)},  // next: none ahead
			"c": {"s0", at(20)},  // behind b: one ahead
			"d": {"s0", at(30)},  // behind b and c, then taken by s1 at 250: b and c ahead
			"z": {"s1", at(400)}, // never took a slot: left out
		},
	}
	if most, queued := tl.servedAhead(); most != 2 || queued != 3 {
		t.Errorf("servedAhead = %d, %d queued; want 2, 3", most, queued)
	}
	// With tickets (b began after c and d, c before d): b counts against
	// c and d, c not against d.
	tl.tickets = map[string]int64{"a": 0, "b": 5, "c": 2, "d": 3}
	if most, _ := tl.servedAhead(); most != 1 {
		t.Errorf("servedAhead with tickets = %d; want 1 (b, begun after d)", most)
	}
}
