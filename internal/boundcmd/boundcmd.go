// Package boundcmd runs external commands with a time limit (nvidia-smi,
// nvidia-ctk, the hooks of a hooks file, systemctl): a wedged driver makes
// nvidia-smi hang, and a step that never ends would hold the node tainted
// and its rollout slot forever. At the limit the command and every process
// it started (its process group) are killed, and the error wraps
// ErrTimeout.
package boundcmd

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"time"
)

// DefaultTimeout bounds one external command where no setting says
// otherwise (--command-timeout).
const DefaultTimeout = 2 * time.Minute

// ErrTimeout: the command ran past its limit and was killed.
var ErrTimeout = errors.New("command timed out")

// waitDelay: after the command's process ended (or was killed), how long
// its output pipes may stay open (a process it left running, outside its
// group, still holding them) before Wait closes them.
const waitDelay = 2 * time.Second

// Run runs c (made with exec.Command, not started) for at most limit
// (<= 0: DefaultTimeout), in a process group of its own, which is killed
// at the limit or when ctx ends.
func Run(ctx context.Context, limit time.Duration, c *exec.Cmd) error {
	if limit <= 0 {
		limit = DefaultTimeout
	}
	if c.SysProcAttr == nil {
		c.SysProcAttr = &syscall.SysProcAttr{}
	}
	c.SysProcAttr.Setpgid = true
	c.WaitDelay = waitDelay
	if err := c.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		kill(c)
		<-done
		return fmt.Errorf("%w after %s", ErrTimeout, limit)
	case <-ctx.Done():
		kill(c)
		<-done
		return ctx.Err()
	}
}

// kill ends c's process group.
func kill(c *exec.Cmd) {
	_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
}

// CombinedOutput is Run collecting stdout and stderr together.
func CombinedOutput(ctx context.Context, limit time.Duration, c *exec.Cmd) ([]byte, error) {
	var b limitedBuffer
	c.Stdout, c.Stderr = &b, &b
	err := Run(ctx, limit, c)
	return b.buf, err
}

// limitedBuffer keeps what a command writes (the last maxOutput bytes).
type limitedBuffer struct{ buf []byte }

const maxOutput = 1 << 20

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	if len(b.buf) > maxOutput {
		b.buf = append([]byte(nil), b.buf[len(b.buf)-maxOutput:]...)
	}
	return len(p), nil
}
