package backoff

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestTransient(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	refused := &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/api/v1/nodes/n",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connection refused", refused, true},
		{"connection refused, wrapped twice", fmt.Errorf("evict: %w", fmt.Errorf("pod a: %w", refused)), true},
		{"joined with a drain error", errors.Join(errors.New("drain"), refused), true},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"io.ErrUnexpectedEOF", fmt.Errorf("decode: %w", errorsUnexpectedEOF()), true},
		{"503", apierrors.NewServiceUnavailable("etcd"), true},
		{"500", apierrors.NewInternalError(errors.New("etcd")), true},
		{"504 server timeout", apierrors.NewServerTimeout(pods, "get", 1), true},
		{"429", apierrors.NewTooManyRequests("slow down", 1), true},
		{"conflict", apierrors.NewConflict(pods, "a", errors.New("modified")), true},
		{"already exists", apierrors.NewAlreadyExists(pods, "a"), false},
		{"forbidden", apierrors.NewForbidden(pods, "a", errors.New("rbac")), false},
		{"unauthorized", apierrors.NewUnauthorized("token"), false},
		{"not found", fmt.Errorf("get: %w", apierrors.NewNotFound(pods, "a")), false},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "a", nil), false},
		{"bad request", apierrors.NewBadRequest("no"), false},
		{"forbidden beats refused", errors.Join(refused, apierrors.NewForbidden(pods, "a", errors.New("rbac"))), false},
		{"canceled", fmt.Errorf("get: %w", context.Canceled), false},
		{"deadline", context.DeadlineExceeded, false},
		{"not an API error", errors.New("pods still on the node after the drain timeout"), false},
	}
	for _, tc := range tests {
		if got := Transient(tc.err); got != tc.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestPermanent(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("list: %w", apierrors.NewForbidden(pods, "", errors.New("rbac"))), true},
		{apierrors.NewNotFound(pods, "a"), true},
		{apierrors.NewServiceUnavailable("etcd"), false},
		{errors.New("client rate limiter Wait returned an error: would exceed context deadline"), false},
		{&url.Error{Op: "Get", URL: "https://x", Err: syscall.ECONNREFUSED}, false},
	} {
		if got := Permanent(tc.err); got != tc.want {
			t.Errorf("Permanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func errorsUnexpectedEOF() error { return io.ErrUnexpectedEOF }

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
		done <- Retry(ctx, clk, time.Minute, nil, func() error {
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
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "n", errors.New("rbac"))
	err := Retry(ctx, clk, time.Minute, func(error) { t.Error("retried a forbidden answer") }, func() error {
		calls++
		return forbidden
	})
	if !errors.Is(err, forbidden) || calls != 1 {
		t.Errorf("forbidden: %v after %d calls", err, calls)
	}

	// The budget: the last try after it passed returns its error.
	calls = 0
	err = Retry(ctx, clk, 0, nil, func() error { calls++; return refused })
	if !errors.Is(err, refused) || calls != 1 {
		t.Errorf("no budget: %v after %d calls", err, calls)
	}
}
