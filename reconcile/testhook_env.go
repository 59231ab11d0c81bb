package reconcile

import "github.com/migagent/mig-agent/internal/crashhook"

// TestHooksTag is the build tag that compiles the crash test hook
// (package crashhook) into the binary; the e2e harness builds with it.
const TestHooksTag = crashhook.Tag

// EnvTestCrashAt names the crash test hook's setting (crashhook.Env).
const EnvTestCrashAt = crashhook.Env

// crashHook runs the crash test hook after a journal save.
func (d *Daemon) crashHook() {
	if ch := d.Journal.State.Change; ch != nil {
		crashhook.Saved(d.Log, string(ch.Phase)+" "+ch.Step)
	}
}
