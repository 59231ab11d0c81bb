package reconcile

// TestHooksTag is the build tag that compiles the crash test hook into the
// binary (testhook.go); the e2e harness builds its binary with it.
const TestHooksTag = "migagent_testhooks"

// EnvTestCrashAt names the crash test hook's setting; see testhook.go. A
// binary built without TestHooksTag ignores it.
const EnvTestCrashAt = "MIG_AGENT_TEST_CRASH_AT"
