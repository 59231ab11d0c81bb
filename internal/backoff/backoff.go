// Package backoff is the agent's one timing policy: how long to wait
// between tries (jittered exponential backoff) of an API call, a failed
// change, opening NVML, on an injected clock. Which errors are worth a
// retry is internal/apierr's (for the API server) or the caller's: this
// package links nothing of Kubernetes but its clock, so nvmlx and the
// reconcile core can use it.
//
// Jitter matters for a fleet: after an API server outage hundreds of agents
// would otherwise retry in the same instant, again and again.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"

	"k8s.io/utils/clock"
)

// Jitter is the jitter factor of every backoff of the agent: each wait is
// drawn from [d, d·(1+Jitter)).
const Jitter = 0.5

// Backoff is a jittered exponential backoff: each Step returns the next
// wait, Duration multiplied by Factor after each step up to Cap (0: no cap),
// drawn from [d, d·(1+Jitter)). Steps, when above 0, counts the steps left
// (the last one repeats without growing).
type Backoff struct {
	Duration time.Duration
	Factor   float64
	Jitter   float64
	Cap      time.Duration
	Steps    int
}

// Step returns the next wait and advances the backoff.
func (b *Backoff) Step() time.Duration {
	d := b.Duration
	if b.Steps != 1 {
		if b.Steps > 1 {
			b.Steps--
		}
		next := time.Duration(float64(b.Duration) * b.Factor)
		if b.Factor > 0 && (b.Cap <= 0 || next < b.Cap) {
			b.Duration = next
		} else if b.Cap > 0 {
			b.Duration = b.Cap
		}
	}
	return Jittered(d, b.Jitter)
}

// Jittered draws a wait from [d, d·(1+f)).
func Jittered(d time.Duration, f float64) time.Duration {
	if f <= 0 || d <= 0 {
		return d
	}
	return d + time.Duration(rand.Float64()*f*float64(d))
}

// API is the backoff between tries of one API call while the API server is
// away: 250 ms, doubling, capped at 5 s (each jittered).
func API() *Backoff {
	return &Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: Jitter, Cap: 5 * time.Second}
}

// APIProbe is the wait before the next probe of the API server's health:
// 10 s while it answers, 1 s while it does not, each within ±25% so that a
// fleet does not probe in step.
func APIProbe(down bool) time.Duration {
	wait := 10 * time.Second
	if down {
		wait = time.Second
	}
	return wait - wait/4 + time.Duration(rand.Int64N(int64(wait/2)))
}

// NVMLOpen is the wait before attempt n+1 (n ≥ 1 failures so far) to open
// NVML: 1 s doubling to 2 min, drawn within ±20% so that the agents of a
// cluster whose driver came back together do not retry in step.
func NVMLOpen(n int) time.Duration {
	b := time.Second
	for i := 1; i < n && b < 2*time.Minute; i++ {
		b *= 2
	}
	b = min(b, 2*time.Minute)
	return b - b/5 + time.Duration(rand.Int64N(int64(2*b/5)+1))
}

// NVMLReinit is how patiently NVML is initialized again after a GPU reset
// (the driver may take a moment to bring the GPU back): 5 tries, 250 ms
// doubling between them, each jittered.
func NVMLReinit() *Backoff {
	return &Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: Jitter, Steps: 5}
}

// Failure is the wait before retry number n (1-based) of a failed change:
// 5 s, doubling, capped at max(longest, 5 s), jittered by up to a fifth (a
// failed change is retried minutes apart; a fleet needs less spread there
// than at API calls, and users read the figure in the status).
func Failure(n int, longest time.Duration) time.Duration {
	d, longest := 5*time.Second, max(longest, 5*time.Second)
	for i := 1; i < n && d < longest; i++ {
		d *= 2
	}
	return Jittered(min(d, longest), 0.2)
}

// Retry calls fn until it succeeds, returns an error that retryable says
// is not worth a retry, ctx ends or budget has passed on clk, waiting API()
// between tries. It returns fn's last error. onRetry (may be nil) sees each
// error retried.
func Retry(ctx context.Context, clk clock.Clock, budget time.Duration, retryable func(error) bool, onRetry func(error), fn func() error) error {
	deadline := clk.Now().Add(budget)
	b := API()
	for {
		err := fn()
		if err == nil || !retryable(err) || !clk.Now().Before(deadline) {
			return err
		}
		if onRetry != nil {
			onRetry(err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-clk.After(b.Step()):
		}
	}
}
