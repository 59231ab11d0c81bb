package turns

import (
	"testing"
	"time"
)

// Rounds past a turn: the nodes whose turn came after a node's but took a
// slot before it, over N; and the node most passed.
func TestRoundsPast(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	late := []Waited{{Turn: at(0), Took: at(9), Node: "p"}, {Turn: at(1), Took: at(2)}, {Turn: at(2), Took: at(3)}, {Turn: at(3), Took: at(4)}}
	if most, over := RoundsPast(late, 1); most != 3 || over != 1 {
		t.Errorf("the first to ask served after three that asked later: %v rounds (%d over two), want 3 (1)", most, over)
	}
	if most, over := RoundsPast(late, 2); most != 1.5 || over != 0 {
		t.Errorf("two slots: %v rounds (%d over two), want 1.5 (0)", most, over)
	}
	if i, passed := MostPassed(late); i != 0 || passed != 3 {
		t.Errorf("most passed: %d (%d), want p, passed by three", i, passed)
	}
	if i, passed := MostPassed(nil); i != -1 || passed != 0 {
		t.Errorf("none: %d (%d), want -1", i, passed)
	}
	inOrder := []Waited{{Turn: at(0), Took: at(1)}, {Turn: at(1), Took: at(2)}}
	if most, _ := RoundsPast(inOrder, 1); most != 0 {
		t.Errorf("served in order: %v rounds, want 0", most)
	}
}

// A perfect first come, first served semaphore: each node in the order it
// asked, on the slot free first, from when it asked or that slot was
// free, whichever is later.
func TestListSchedule(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		holds []Hold
		want  float64
	}{
		{"none", 2, nil, 0},
		{"no slot", 0, []Hold{{0, 10}}, 0},
		// Back to back on one slot, whatever order they are given in.
		{"one slot", 1, []Hold{{20, 10}, {0, 10}, {5, 10}}, 30},
		// Two slots: 0+10 and 0+10 at once, then the third at 10.
		{"two slots", 2, []Hold{{0, 10}, {0, 10}, {1, 10}}, 20},
		// A node that asked late starts when it asked, not when a slot
		// was free: no schedule serves a node before it asks.
		{"asked late", 2, []Hold{{0, 10}, {100, 10}}, 110},
		// The longest hold decides when it comes last: the spread of the
		// holds, not the hand-off.
		{"one long hold", 2, []Hold{{0, 10}, {0, 10}, {0, 10}, {0, 50}}, 60},
		// First come, first served, not the best order: the long hold
		// asked last, so it goes last (longest first would give 50).
		{"served in order", 2, []Hold{{0, 10}, {1, 10}, {2, 10}, {3, 10}, {4, 40}}, 60},
	} {
		if got := ListSchedule(tc.n, tc.holds); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
