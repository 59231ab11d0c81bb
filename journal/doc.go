// Package journal is the agent's state on disk: the journal of the change
// in progress (Change, its Phase and what each step did), the progress
// with the desired config (Progress), the one memory of a reboot asked for
// (RebootMark), written atomically before every step so that a crash or a
// reboot at any point resumes; and the lock that keeps one agent per state
// directory (Lock).
//
// It may import the standard library only.
package journal
