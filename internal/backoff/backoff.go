// Package backoff is the agent's one retry policy: which errors are worth a
// retry (Transient) and how long to wait between tries (jittered exponential
// backoff, k8s.io/apimachinery's wait.Backoff), on an injected clock.
//
// Jitter matters for a fleet: after an API server outage hundreds of agents
// would otherwise retry in the same instant, again and again.
package backoff

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// Jitter is the jitter factor of every backoff of the agent: each wait is
// drawn from [d, d·(1+Jitter)).
const Jitter = 0.5

// API is the backoff between tries of one API call while the API server is
// away: 250 ms, doubling, capped at 5 s (each jittered).
func API() wait.Backoff {
	return wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: Jitter, Steps: 1 << 30, Cap: 5 * time.Second}
}

// Failure is the wait before retry number n (1-based) of a failed change:
// 5 s, doubling, capped at max(longest, 5 s), jittered by up to a fifth (a
// failed change is retried minutes apart; a fleet needs less spread there
// than at API calls, and users read the figure in the status).
func Failure(n int, longest time.Duration) time.Duration {
	b := wait.Backoff{Duration: 5 * time.Second, Factor: 2, Steps: max(n, 1), Cap: max(longest, 5*time.Second)}
	d := b.Duration
	for range max(n, 1) {
		d = b.Step()
	}
	return wait.Jitter(d, 0.2)
}

// Transient reports whether err is worth a retry of the same request: the
// API server did not answer (connection refused or reset, a connection cut
// mid-answer, a network timeout, any transport error) or answered that it
// cannot serve now (429, 500, 503, 504, a server timeout) or that another
// writer won a race (409 Conflict). Any other answer (403, 401, 404, 400,
// 422, 405, 409 AlreadyExists) and any error that is no API call's (a drain
// timeout, bad input) is not; a cancelled context never is.
//
// It is the one rule of the agent and of the drain package for which errors
// are retried.
func Transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsInvalid(err) ||
		apierrors.IsBadRequest(err) || apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) ||
		apierrors.IsAlreadyExists(err) || apierrors.IsGone(err) {
		return false
	}
	if apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsConflict(err) ||
		apierrors.IsUnexpectedServerError(err) {
		return true
	}
	if code, ok := statusCode(err); ok {
		return code == 502 || code == 503 || code == 504
	}
	var uerr *url.Error
	var nerr net.Error
	return errors.As(err, &uerr) || errors.As(err, &nerr) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}

// Permanent reports whether err is an answer of the API server that no
// retry changes (an API status that is not Transient). A poll stops at
// once on such an answer and goes on through any other error until its own
// deadline (a client-side error such as the rate limiter's near a deadline
// is no answer).
func Permanent(err error) bool {
	_, isStatus := statusCode(err)
	return isStatus && !Transient(err)
}

func statusCode(err error) (int, bool) {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		return int(s.Status().Code), true
	}
	return 0, false
}

// Retry calls fn until it succeeds, returns an error that is not Transient,
// ctx ends or budget has passed on clk, waiting API() between tries. It
// returns fn's last error. onRetry (may be nil) sees each error retried.
func Retry(ctx context.Context, clk clock.Clock, budget time.Duration, onRetry func(error), fn func() error) error {
	deadline := clk.Now().Add(budget)
	b := API()
	for {
		err := fn()
		if err == nil || !Transient(err) || !clk.Now().Before(deadline) {
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
