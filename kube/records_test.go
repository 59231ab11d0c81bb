package kube

import (
	"testing"
	"time"

	"github.com/migagent/mig-agent/record"
)

// The slot bound as the records show it: overlapping disruption intervals
// count together, one ending when another starts does not, a record that
// took no slot does not count.
func TestMaxDisrupted(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(int64(s), 0) }
	rec := func(from, to int) record.ChangeRecord {
		d := at(from)
		return record.ChangeRecord{DisruptedAt: &d, FinishedAt: at(to)}
	}
	for _, tt := range []struct {
		name string
		recs []record.ChangeRecord
		want int
	}{
		{"none", nil, 0},
		{"apart", []record.ChangeRecord{rec(0, 1), rec(2, 3)}, 1},
		{"touching", []record.ChangeRecord{rec(0, 2), rec(2, 4)}, 1},
		{"nested", []record.ChangeRecord{rec(0, 10), rec(1, 2), rec(3, 9), rec(4, 5)}, 3},
		{"no slot taken", []record.ChangeRecord{rec(0, 10), {FinishedAt: at(5)}}, 1},
	} {
		if got := record.MaxDisrupted(tt.recs); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}
