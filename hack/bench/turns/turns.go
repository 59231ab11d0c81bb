// Package turns is the arithmetic of a rollout's order that the fleet
// bench reports: how far nodes were served past their turn, and what a
// perfect first come, first served semaphore would have taken with the
// same nodes. It reads times only; the bench measures them.
package turns

import (
	"cmp"
	"slices"
	"time"
)

// Waited is a node's turn (when it began, or asked) and when it took a
// slot (disruptedAt).
type Waited struct {
	Turn, Took time.Time
	Node       string // "" where not known
}

// passed is how many nodes of w whose turn came after a's took a slot
// before it.
func passed(w []Waited, a Waited) int {
	n := 0
	for _, b := range w {
		if b.Turn.After(a.Turn) && b.Took.Before(a.Took) {
			n++
		}
	}
	return n
}

// MostPassed is the node of w that the most nodes whose turn came after
// its own passed (took a slot before it), and how many did: -1 for none.
func MostPassed(w []Waited) (i, most int) {
	i = -1
	for j, a := range w {
		if n := passed(w, a); n > most || i < 0 {
			i, most = j, n
		}
	}
	return i, most
}

// RoundsPast: each node is late by the nodes whose turn came after its own
// but took a slot before it, over n; the most rounds, and how many nodes
// were more than two late.
func RoundsPast(w []Waited, n int) (most float64, overTwo int) {
	for _, a := range w {
		late := float64(passed(w, a)) / float64(max(n, 1))
		most = max(most, late)
		if late > 2 {
			overTwo++
		}
	}
	return most, overTwo
}

// Hold is a node's hold of a slot: when the node asked and how long it
// held (ms from the label).
type Hold struct{ Asked, Ms float64 }

// ListSchedule is when n slots, free from the label on, would be done
// with holds served first come, first served with nothing lost: each
// hold, in the order its node asked, on the slot free first, from when
// its node asked or that slot's last hold ended, whichever is later
// (0: no hold). It is the rollout of a perfect semaphore with the very
// nodes and holds a run measured.
func ListSchedule(n int, holds []Hold) float64 {
	if n <= 0 || len(holds) == 0 {
		return 0
	}
	free := make([]float64, n)
	holds = slices.Clone(holds)
	slices.SortStableFunc(holds, func(a, b Hold) int { return cmp.Compare(a.Asked, b.Asked) })
	for _, h := range holds {
		i := 0
		for j := range free {
			if free[j] < free[i] {
				i = j
			}
		}
		free[i] = max(free[i], h.Asked) + h.Ms
	}
	return slices.Max(free)
}
