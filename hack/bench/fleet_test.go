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
