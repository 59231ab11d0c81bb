package kubetest

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// Runner is the TB of a program that runs the stand-ins (the demo, the
// benches): Errorf to stderr under Name, Logf to Log (nil: dropped), Fatalf
// a panic that Recover returns, Cleanup's functions at Close, newest first.
type Runner struct {
	Name     string
	Log      io.Writer
	cleanups []func()
}

var _ TB = (*Runner)(nil)

// runnerFatal is a Runner's Fatalf, on its way to Recover.
type runnerFatal string

func (r *Runner) Helper()          {}
func (r *Runner) Failed() bool     { return false }
func (r *Runner) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *Runner) Errorf(f string, a ...any) {
	fmt.Fprintf(os.Stderr, r.Name+": "+f+"\n", a...)
}
func (r *Runner) Fatalf(f string, a ...any) { panic(runnerFatal(fmt.Sprintf(f, a...))) }
func (r *Runner) Logf(f string, a ...any) {
	if r.Log != nil {
		fmt.Fprintf(r.Log, f+"\n", a...)
	}
}

// Close runs the Cleanup functions, newest first.
func (r *Runner) Close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// Recover, deferred, turns a Runner's Fatalf into *err; any other panic goes on.
func Recover(err *error) {
	if r := recover(); r != nil {
		f, ok := r.(runnerFatal)
		if !ok {
			panic(r)
		}
		*err = errors.New(string(f))
	}
}
