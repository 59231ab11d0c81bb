package journal

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrAnotherAgent: another mig-agent holds the state dir (one agent per
// node: two would apply every change twice and race on NVML).
var ErrAnotherAgent = errors.New("another mig-agent is running")

// Lock takes an exclusive lock (flock) on the state dir itself, so
// that a second agent on the same node and state dir refuses to start.
// The lock is on the directory, not a file in it: it holds on a read-only
// state dir too, which the agent must still report on. The kernel drops it
// when the process ends, however it ends. Release unlocks.
func Lock(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w with state dir %s (it holds the lock on it): one agent per node; stop the other one first", ErrAnotherAgent, dir)
		}
		return nil, fmt.Errorf("locking the state dir %s: %w", dir, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
