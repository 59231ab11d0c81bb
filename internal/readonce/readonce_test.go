package readonce

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

func TestDoSharesASuccessfulRead(t *testing.T) {
	var reads atomic.Int32
	read := func(context.Context) ([]string, error) { reads.Add(1); return []string{"a"}, nil }
	ctx := With(context.Background())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if v, err := Do(ctx, "k", read); err != nil || len(v) != 1 || v[0] != "a" {
				t.Errorf("Do = %v, %v", v, err)
			}
		})
	}
	wg.Wait()
	if n := reads.Load(); n != 1 {
		t.Errorf("%d reads within one memo, want 1", n)
	}
	if _, _ = Do(ctx, "other", read); reads.Load() != 2 {
		t.Errorf("another key was not read")
	}
	// A new memo, or none, reads again.
	_, _ = Do(With(context.Background()), "k", read)
	_, _ = Do(context.Background(), "k", read)
	if n := reads.Load(); n != 4 {
		t.Errorf("%d reads, want 4", n)
	}
}

func TestDoDoesNotKeepAFailure(t *testing.T) {
	ctx := With(context.Background())
	boom := errors.New("boom")
	var reads int
	read := func(context.Context) (int, error) {
		reads++
		if reads == 1 {
			return 0, boom
		}
		return 7, nil
	}
	if _, err := Do(ctx, "k", read); !errors.Is(err, boom) {
		t.Fatalf("first Do: %v, want boom", err)
	}
	if v, err := Do(ctx, "k", read); err != nil || v != 7 {
		t.Fatalf("the retry got %v, %v; want a new read, 7", v, err)
	}
	if v, _ := Do(ctx, "k", read); v != 7 || reads != 2 {
		t.Errorf("got %v after %d reads; want the kept 7 after 2", v, reads)
	}
}

func TestDoSurvivesAPanickingRead(t *testing.T) {
	ctx := With(context.Background())
	func() {
		defer func() { _ = recover() }()
		_, _ = Do(ctx, "k", func(context.Context) (int, error) { panic("read") })
	}()
	if v, err := Do(ctx, "k", func(context.Context) (int, error) { return 3, nil }); err != nil || v != 3 {
		t.Errorf("after a panicking read: %v, %v; want a new read", v, err)
	}
}
