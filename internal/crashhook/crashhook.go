// Package crashhook is the crash test hook of the daemon: compiled in only
// with the build tag migagent_testhooks (Tag), which the e2e harness passes
// when it builds the binary under test; a production build has none
// (off.go).
//
// With MIG_AGENT_TEST_CRASH_AT=N the daemon SIGKILLs itself right after the
// Nth journal save of a change in progress (from 1, within the process);
// with a non-numeric value, right after the first such save whose "phase
// step" contains it (e.g. "draining", "applying GPU 2: creating"). The kill
// comes after the journal is on disk and before the step it announces,
// which is where a real crash hurts most. The e2e crash matrix uses it to
// kill the real binary at every journaled step, deterministically.
package crashhook

// Tag is the build tag that compiles the hook into the binary (on.go).
const Tag = "migagent_testhooks"

// Env names the hook's setting. A binary built without Tag ignores it.
const Env = "MIG_AGENT_TEST_CRASH_AT"
