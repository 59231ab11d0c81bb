//go:build migagent_testhooks

package reconcile

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// The crash test hook is compiled only with the build tag
// migagent_testhooks (TestHooksTag), which the e2e harness passes when it
// builds the binary under test; a production build has none
// (testhook_off.go).
//
// With
// MIG_AGENT_TEST_CRASH_AT=N the daemon SIGKILLs itself right after the Nth
// journal save of a change in progress (from 1, within the process); with
// a non-numeric value, right after the first such save whose "phase step"
// contains it (e.g. "draining", "applying GPU 2: creating"). The kill
// comes after the journal is on disk and before the step it announces,
// which is where a real crash hurts most. The e2e crash matrix uses it to
// kill the real binary at every journaled step, deterministically.
// (EnvTestCrashAt, testhook_env.go.)

// crashSaves counts the journal saves of changes in progress, for the hook.
var crashSaves int

// crashHook runs the test hook after a journal save.
func (d *Daemon) crashHook() {
	at := os.Getenv(EnvTestCrashAt)
	ch := d.Journal.State.Change
	if at == "" || ch == nil {
		return
	}
	crashSaves++
	where := string(ch.Phase) + " " + ch.Step
	if n, err := strconv.Atoi(at); err == nil && n != crashSaves || err != nil && !strings.Contains(where, at) {
		return
	}
	d.Log.Warn("test hook: killing the process after a journal save", "env", EnvTestCrashAt, "save", crashSaves,
		"phase", ch.Phase, "step", ch.Step)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
