package reconcile

import (
	"testing"
	"time"
)

// The wait before reopening NVML doubles from 1s to 2 minutes, each drawn
// within ±20% so that a fleet whose driver came back together spreads out.
func TestNVMLBackoff(t *testing.T) {
	d := &Daemon{}
	seen := map[time.Duration]bool{}
	for n := 1; n <= 12; n++ {
		d.nvmlFail = n
		base := min(time.Second<<(n-1), 2*time.Minute)
		for range 50 {
			w := d.nvmlBackoff()
			if w < base-base/5 || w > base+base/5 {
				t.Fatalf("attempt %d: wait %v outside %v ±20%%", n, w, base)
			}
			seen[w] = true
		}
	}
	if len(seen) < 100 {
		t.Errorf("only %d distinct waits: no jitter", len(seen))
	}
}
