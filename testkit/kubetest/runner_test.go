package kubetest

import (
	"bytes"
	"errors"
	"slices"
	"testing"
)

// A Runner's Fatalf comes back from Recover as the error of the function
// that deferred it; its cleanups run at Close, newest first; Logf goes to
// Log.
func TestRunner(t *testing.T) {
	var log bytes.Buffer
	r := &Runner{Name: "stand-in", Log: &log}
	var order []int
	r.Cleanup(func() { order = append(order, 1) })
	r.Cleanup(func() { order = append(order, 2) })
	run := func() (err error) {
		defer Recover(&err)
		r.Logf("step %d", 1)
		r.Fatalf("broke at %d", 7)
		return errors.New("not reached")
	}
	if err := run(); err == nil || err.Error() != "broke at 7" {
		t.Errorf("run: %v", err)
	}
	r.Close()
	if !slices.Equal(order, []int{2, 1}) || log.String() != "step 1\n" {
		t.Errorf("cleanups %v, log %q", order, log.String())
	}
	defer func() {
		if recover() != "other" {
			t.Error("a panic that is no Fatalf was swallowed")
		}
	}()
	func() {
		var err error
		defer Recover(&err)
		panic("other")
	}()
}
