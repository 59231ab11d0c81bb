package boundcmd

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A command that hangs, with a child holding its output, is killed at the
// limit, child included, and says so.
func TestRunKillsAtTheLimit(t *testing.T) {
	start := time.Now()
	out, err := CombinedOutput(context.Background(), 300*time.Millisecond, exec.Command("sh", "-c", "echo started; sleep 60 & wait"))
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "after 300ms") {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("returned after %s", d)
	}
	if string(out) != "started\n" {
		t.Errorf("output = %q", out)
	}
}

func TestRunWithinTheLimit(t *testing.T) {
	out, err := CombinedOutput(context.Background(), 10*time.Second, exec.Command("sh", "-c", "echo ok; exit 3"))
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || string(out) != "ok\n" {
		t.Fatalf("out %q, err %v", out, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	if err := Run(ctx, time.Minute, exec.Command("sleep", "60")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
