package backoff

import (
	"context"
	"errors"
	"net/url"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestFailure(t *testing.T) {
	tests := []struct {
		n       int
		longest time.Duration
		base    time.Duration
	}{
		{0, 5 * time.Minute, 5 * time.Second},
		{1, 5 * time.Minute, 5 * time.Second},
		{2, 5 * time.Minute, 10 * time.Second},
		{4, 5 * time.Minute, 40 * time.Second},
		{7, 5 * time.Minute, 5 * time.Minute}, // 320 s capped
		{50, 5 * time.Minute, 5 * time.Minute},
		{3, time.Second, 5 * time.Second}, // never below 5 s
	}
	for _, tc := range tests {
		seen := map[time.Duration]bool{}
		for range 50 {
			d := Failure(tc.n, tc.longest)
			if d < tc.base || d >= tc.base+tc.base/5 {
				t.Errorf("Failure(%d, %s) = %s, want in [%s, %s)", tc.n, tc.longest, d, tc.base, tc.base+tc.base/5)
			}
			seen[d] = true
		}
		if len(seen) < 2 {
			t.Errorf("Failure(%d, %s) is not jittered: always %v", tc.n, tc.longest, seen)
		}
	}
}

// Retry waits jittered, growing steps on the injected clock while the error
// is transient, and stops at once on any other.
func TestRetry(t *testing.T) {
	ctx := context.Background()
	refused := &url.Error{Op: "Get", URL: "https://x", Err: syscall.ECONNREFUSED}

	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	calls := 0
	done := make(chan error, 1)
	go func() {
		done <- Retry(ctx, clk, time.Minute, isRefused, nil, func() error {
			calls++
			if calls < 4 {
				return refused
			}
			return nil
		})
	}()
	var waits []time.Duration
	for len(waits) < 3 {
		if !clk.HasWaiters() {
			time.Sleep(time.Millisecond)
			continue
		}
		// Step to the waiter's deadline: the smallest step that fires it.
		step := 10 * time.Millisecond
		start := clk.Now()
		for clk.HasWaiters() {
			clk.Step(step)
		}
		waits = append(waits, clk.Now().Sub(start))
	}
	if err := <-done; err != nil || calls != 4 {
		t.Fatalf("Retry = %v after %d calls", err, calls)
	}
	for i, base := range []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second} {
		if w := waits[i]; w < base || w > base+base/2+10*time.Millisecond {
			t.Errorf("wait %d = %s, want in [%s, %s]", i+1, w, base, base+base/2)
		}
	}

	calls = 0
	forbidden := errors.New("forbidden")
	err := Retry(ctx, clk, time.Minute, isRefused, func(error) { t.Error("retried a forbidden answer") }, func() error {
		calls++
		return forbidden
	})
	if !errors.Is(err, forbidden) || calls != 1 {
		t.Errorf("forbidden: %v after %d calls", err, calls)
	}

	// The budget: the last try after it passed returns its error.
	calls = 0
	err = Retry(ctx, clk, 0, isRefused, nil, func() error { calls++; return refused })
	if !errors.Is(err, refused) || calls != 1 {
		t.Errorf("no budget: %v after %d calls", err, calls)
	}
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
