package systemd

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// notifySocket listens on a real unixgram socket, as systemd does, and points
// NOTIFY_SOCKET at it for the test (t.Setenv restores it afterwards).
func notifySocket(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return conn
}

// clearWatchdogEnv unsets the watchdog variables for the test.
func clearWatchdogEnv(t *testing.T) {
	for _, k := range []string{"WATCHDOG_USEC", "WATCHDOG_PID"} {
		t.Setenv(k, "")
		_ = os.Unsetenv(k)
	}
}

// recv reads one datagram, failing after a while.
func recv(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no notification: %v", err)
	}
	return string(buf[:n])
}

// drain reads every datagram already queued.
func drain(t *testing.T, conn *net.UnixConn) []string {
	t.Helper()
	var out []string
	buf := make([]byte, 4096)
	for {
		_ = conn.SetReadDeadline(time.Now())
		n, err := conn.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(buf[:n]))
	}
}

func TestNotifierMessages(t *testing.T) {
	sock := notifySocket(t)
	clearWatchdogEnv(t)
	n := NewNotifier(testLogger(t))
	tests := []struct {
		name string
		send func() error
		want string
	}{
		{"ready", n.Ready, "READY=1"},
		{"status", func() error { return n.Status("evicting %d pods on GPU %d", 2, 3) }, "STATUS=evicting 2 pods on GPU 3"},
		{"status plain", func() error { return n.Status("waiting for reboot") }, "STATUS=waiting for reboot"},
		{"status newlines flattened", func() error { return n.Status("a\nb\r\nc") }, "STATUS=a b c"},
		{"stopping", n.Stopping, "STOPPING=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.send(); err != nil {
				t.Fatal(err)
			}
			if got := recv(t, sock); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
	if extra := drain(t, sock); len(extra) != 0 {
		t.Errorf("unexpected notifications %q", extra)
	}
}

func TestNotifierWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	_ = os.Unsetenv("NOTIFY_SOCKET")
	clearWatchdogEnv(t)
	n := NewNotifier(testLogger(t))
	for _, f := range []func() error{n.Ready, n.Stopping, func() error { return n.Status("x") }} {
		if err := f(); err != nil {
			t.Errorf("not under systemd: %v, want nil (no-op)", err)
		}
	}
	if n.WatchdogInterval() != 0 {
		t.Errorf("watchdog = %v, want off", n.WatchdogInterval())
	}
	done := make(chan struct{})
	go func() {
		n.RunWatchdog(context.Background(), func() bool { return true })
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("RunWatchdog without WATCHDOG_USEC did not return")
	}
}

func TestNotifierSendError(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "absent"))
	clearWatchdogEnv(t)
	if err := NewNotifier(testLogger(t)).Ready(); err == nil {
		t.Fatal("Ready to a missing socket succeeded")
	}
}

func TestWatchdogSettings(t *testing.T) {
	tests := []struct {
		name       string
		usec, pid  string
		wantPeriod time.Duration
	}{
		{name: "set for us", usec: "4000000", pid: "self", wantPeriod: 4 * time.Second},
		{name: "no pid given", usec: "500000", wantPeriod: 500 * time.Millisecond},
		{name: "for another process", usec: "4000000", pid: "1"},
		{name: "garbage is off", usec: "soon"},
		{name: "unset is off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearWatchdogEnv(t)
			if tt.usec != "" {
				t.Setenv("WATCHDOG_USEC", tt.usec)
			}
			switch tt.pid {
			case "":
			case "self":
				t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
			default:
				t.Setenv("WATCHDOG_PID", tt.pid)
			}
			if got := NewNotifier(testLogger(t)).WatchdogInterval(); got != tt.wantPeriod {
				t.Errorf("watchdog = %v, want %v", got, tt.wantPeriod)
			}
		})
	}
}

func TestRunWatchdog(t *testing.T) {
	sock := notifySocket(t)
	clearWatchdogEnv(t)
	t.Setenv("WATCHDOG_USEC", "200000") // 200ms: ping every 100ms
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	n := NewNotifier(testLogger(t), WithNotifierClock(clk))
	if n.WatchdogInterval() != 200*time.Millisecond {
		t.Fatalf("watchdog = %v", n.WatchdogInterval())
	}

	// healthy answers from this list, one per check, and tells the test
	// each time it was asked.
	answers := []bool{true, true, false, false, true}
	asked := make(chan bool)
	i := 0
	healthy := func() bool {
		a := answers[i]
		i++
		asked <- a
		return a
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		n.RunWatchdog(ctx, healthy)
		close(done)
	}()
	var pings int
	for k, want := range answers {
		if k > 0 {
			clk.Step(100 * time.Millisecond)
		}
		select {
		case got := <-asked:
			if got != want {
				t.Fatalf("check %d answered %v", k, got)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("watchdog did not check health at tick %d", k)
		}
		if want {
			// The ping of a healthy check arrives. A ping sent for an
			// unhealthy check would leave one datagram too many, found by
			// the drain at the end.
			if got := recv(t, sock); got != "WATCHDOG=1" {
				t.Fatalf("tick %d: got %q, want WATCHDOG=1", k, got)
			}
			pings++
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("RunWatchdog did not return after cancel")
	}
	if extra := drain(t, sock); len(extra) != 0 {
		t.Errorf("pings while unhealthy or after cancel: %q", extra)
	}
	if pings != 3 {
		t.Errorf("pings = %d, want 3 (one per healthy check)", pings)
	}
}
