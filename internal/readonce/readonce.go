// Package readonce shares one read of the cluster among the steps of one
// look at it. Within a context made by With, the first Do of a key reads;
// every later or concurrent Do of that key gets the same result. A failed
// read is not kept: the next Do reads again (a retry is a real retry).
// Outside such a context Do reads every time.
//
// The agent looks at its node before a change (another MIG manager, the
// allocation path, the device plugin pods): several checks want the same
// ResourceSlices and the same pods of the node within milliseconds, and
// each read is a request to the API server of every node of a pool-wide
// change at once.
package readonce

import (
	"context"
	"errors"
	"sync"
)

type ctxKey struct{}

type memo struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	done chan struct{}
	val  any
	err  error
}

// With returns ctx with a memo of its own: the reads Do makes through it
// (or through a context derived from it) are shared.
func With(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxKey{}, &memo{m: map[string]*entry{}})
}

// Do returns what read returns for key, read at most once while it
// succeeds within ctx's memo (every time without one). The result is
// shared: callers must not modify it.
func Do[T any](ctx context.Context, key string, read func(context.Context) (T, error)) (T, error) {
	m, _ := ctx.Value(ctxKey{}).(*memo)
	if m == nil {
		return read(ctx)
	}
	for {
		m.mu.Lock()
		e, ok := m.m[key]
		if !ok {
			e = &entry{done: make(chan struct{})}
			m.m[key] = e
			m.mu.Unlock()
			return fill(ctx, m, key, e, read)
		}
		m.mu.Unlock()
		select {
		case <-e.done:
		case <-ctx.Done():
			var zero T
			return zero, ctx.Err()
		}
		if e.err == nil {
			return e.val.(T), nil
		}
		// The read failed and was dropped: read again (the first waiter
		// to get here does, the others wait for it).
	}
}

// fill makes the read of e; a failed one leaves the memo. e is done
// however read ends (a panic included), so that no waiter waits forever.
func fill[T any](ctx context.Context, m *memo, key string, e *entry, read func(context.Context) (T, error)) (v T, err error) {
	e.err = errPanicked
	defer func() {
		if e.err != nil {
			m.mu.Lock()
			delete(m.m, key)
			m.mu.Unlock()
		}
		close(e.done)
	}()
	v, err = read(ctx)
	e.val, e.err = v, err
	return v, err
}

// errPanicked marks a read that did not return.
var errPanicked = errors.New("readonce: the read did not return")
