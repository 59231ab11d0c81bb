package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/migagent/mig-agent/hack/bench/turns"
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
	if most, queued, rounds, over := tl.servedAhead(1); most != 2 || queued != 3 || rounds != 2 || over != 0 {
		t.Errorf("servedAhead = %d, %d queued, %v rounds, %d over two; want 2, 3, 2, 0", most, queued, rounds, over)
	}
	// With tickets (b began after c and d, c before d): b counts against
	// c and d, c not against d.
	tl.tickets = map[string]int64{"a": 0, "b": 5, "c": 2, "d": 3}
	if most, _, rounds, _ := tl.servedAhead(1); most != 1 || rounds != 1 {
		t.Errorf("servedAhead with tickets = %d, %v rounds; want 1, 1 (b, begun after c and d)", most, rounds)
	}
	// Across slots: z joined s1 at 400 and has not taken one; y joins s1
	// at 5, behind x, and takes s1 at 500: a, b, c (s0) and d (s1) took
	// slots meanwhile, three of them begun after y.
	tl.changes["s1"] = append(tl.changes["s1"], slotChange{at(500), "y"})
	tl.joins["y"] = slotJoin{"s1", at(5)}
	tl.tickets["y"] = 1
	if _, queued, rounds, over := tl.servedAhead(1); queued != 4 || rounds != 3 || over != 1 {
		t.Errorf("across slots: %d queued, %v rounds, %d over two; want 4, 3, 1", queued, rounds, over)
	}
}

// By when a node asked: its ticket is its turn, and a ticket outside its
// change (before startedAt or after disruptedAt) is counted, not used.
func TestAskedByTicket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rec := func(started, disrupted int) record.ChangeRecord {
		d := at(disrupted)
		return record.ChangeRecord{StartedAt: at(started), DisruptedAt: &d}
	}
	tl := &slotTimeline{tickets: map[string]int64{"a": at(500).UnixMilli(), "b": at(100).UnixMilli(), "c": at(5000).UnixMilli()}}
	recs := []record.ChangeRecord{rec(0, 1000), rec(50, 2000), rec(0, 3000), rec(0, 4000)}
	w, lags, odd := tl.asked(recs, []string{"a", "b", "c", "d"})
	if odd != 1 || len(w) != 2 || fmt.Sprint(lags) != "[500 50]" {
		t.Fatalf("asked: %v, lags %v, %d odd; want a and b, 1 odd (c asked after it took a slot), d unseen", w, lags, odd)
	}
	// b asked before a and took a slot after it: one round late.
	if most, over := turns.RoundsPast(w, 1); most != 1 || over != 0 {
		t.Errorf("rounds past: %v, %d over two", most, over)
	}
	if i, passed := turns.MostPassed(w); i < 0 || w[i].Node != "b" || passed != 1 {
		t.Errorf("most passed: %d (%d), want b, passed by a", i, passed)
	}
}
