package systemd

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/migagent/mig-agent/testkit/dbustest"
)

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// busClient connects the code under test the way the agent does.
func busClient(t *testing.T, bus *dbustest.Bus) *dbus.Conn {
	conn, err := ConnectSystemBus(bus.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func TestLogindReboot(t *testing.T) {
	rebootDenied := dbus.NewError("org.freedesktop.DBus.Error.AccessDenied", []any{"Permission denied"})
	inProgress := dbus.NewError("org.freedesktop.login1.OperationInProgress", []any{"There's already a shutdown or sleep operation in progress"})
	tests := []struct {
		name        string
		canReboot   string
		canErr      *dbus.Error
		rebootErr   *dbus.Error
		wantErr     string // substring; "" means success
		wantIs      error
		wantReboots []bool
		wantCalls   []string
	}{
		{
			name:        "yes: rebooted exactly once, not interactive",
			canReboot:   "yes",
			wantReboots: []bool{false},
			wantCalls:   []string{"CanReboot()", "Reboot(false)"},
		},
		{
			name:        "challenge is accepted",
			canReboot:   "challenge",
			wantReboots: []bool{false},
			wantCalls:   []string{"CanReboot()", "Reboot(false)"},
		},
		{
			name:      "no: error with the answer, no Reboot call",
			canReboot: "no",
			wantErr:   `CanReboot answered "no"`,
			wantIs:    ErrRebootNotPermitted,
			wantCalls: []string{"CanReboot()"},
		},
		{
			name:      "na: error with the answer, no Reboot call",
			canReboot: "na",
			wantErr:   `CanReboot answered "na"`,
			wantIs:    ErrRebootNotPermitted,
			wantCalls: []string{"CanReboot()"},
		},
		{
			name:      "CanReboot fails",
			canErr:    rebootDenied,
			wantErr:   "logind CanReboot: Permission denied",
			wantCalls: []string{"CanReboot() = org.freedesktop.DBus.Error.AccessDenied"},
		},
		{
			name:      "Reboot access denied is surfaced",
			canReboot: "yes",
			rebootErr: rebootDenied,
			wantErr:   "logind Reboot: Permission denied",
			wantCalls: []string{"CanReboot()", "Reboot(false) = org.freedesktop.DBus.Error.AccessDenied"},
		},
		{
			name:      "Reboot operation in progress is surfaced",
			canReboot: "yes",
			rebootErr: inProgress,
			wantErr:   "already a shutdown",
			wantCalls: []string{"CanReboot()", "Reboot(false) = org.freedesktop.login1.OperationInProgress"},
		},
	}
	bus := dbustest.Start(t)
	conn := busClient(t, bus)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			login := bus.StartLogin1(t)
			login.SetCanReboot(tt.canReboot)
			login.SetCanRebootError(tt.canErr)
			login.SetRebootError(tt.rebootErr)

			err := NewLogindRebooter(conn, testLogger(t)).Reboot(testContext(t), "MIG mode change pending on GPU 0")
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Reboot: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Reboot error = %v, want one containing %q", err, tt.wantErr)
			case tt.wantIs != nil && !errors.Is(err, tt.wantIs):
				t.Fatalf("Reboot error = %v, want errors.Is %v", err, tt.wantIs)
			}
			if tt.rebootErr != nil && dbusErrorName(err) != tt.rebootErr.Name {
				t.Errorf("error name = %q, want %q kept in the chain", dbusErrorName(err), tt.rebootErr.Name)
			}
			if got := login.RebootCalls(); !reflect.DeepEqual(got, tt.wantReboots) {
				t.Errorf("reboots = %v, want %v", got, tt.wantReboots)
			}
			if got := callStrings(login.Calls()); !reflect.DeepEqual(got, tt.wantCalls) {
				t.Errorf("calls = %q, want %q", got, tt.wantCalls)
			}
		})
	}
}

func TestLogindRebootWithoutLogind(t *testing.T) {
	bus := dbustest.Start(t)
	err := NewLogindRebooter(busClient(t, bus), testLogger(t)).Reboot(testContext(t), "test")
	if dbusErrorName(err) != "org.freedesktop.DBus.Error.ServiceUnknown" {
		t.Fatalf("Reboot with no logind on the bus = %v, want ServiceUnknown", err)
	}
}

func TestLogindInhibit(t *testing.T) {
	bus := dbustest.Start(t)
	login := bus.StartLogin1(t)
	r := NewLogindRebooter(busClient(t, bus), testLogger(t))
	ctx := testContext(t)

	release, err := r.Inhibit(ctx, "changing MIG geometry on GPU 0, 3")
	if err != nil {
		t.Fatalf("Inhibit: %v", err)
	}
	locks := login.Inhibitors()
	if len(locks) != 1 {
		t.Fatalf("inhibitors = %d, want 1", len(locks))
	}
	got := locks[0]
	want := dbustest.Inhibitor{What: "shutdown", Who: "mig-agent", Why: "changing MIG geometry on GPU 0, 3", Mode: "delay"}
	if got.What != want.What || got.Who != want.Who || got.Why != want.Why || got.Mode != want.Mode {
		t.Errorf("inhibitor = %+v, want %+v", got, want)
	}
	// The lock is held until released: logind sees no EOF yet. (The fake's
	// own copy of the fd is closed right after the reply, so only ours is
	// left; a leak there would keep the lock forever.)
	select {
	case <-got.Released:
		t.Fatal("inhibitor released before release() was called")
	case <-time.After(50 * time.Millisecond):
	}
	if err := release(); err != nil {
		t.Fatalf("release: %v", err)
	}
	select {
	case <-got.Released:
	case <-ctx.Done():
		t.Fatal("logind never saw the inhibitor fd closed")
	}
	if err := release(); err != nil {
		t.Errorf("second release: %v, want nil (idempotent)", err)
	}

	// A second lock is independent of the first.
	release2, err := r.Inhibit(ctx, "second")
	if err != nil {
		t.Fatalf("Inhibit: %v", err)
	}
	if l := login.Inhibitors(); len(l) != 2 || l[1].IsReleased() || !l[0].IsReleased() {
		t.Fatalf("inhibitors after second Inhibit = %+v", l)
	}
	if err := release2(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-login.Inhibitors()[1].Released:
	case <-ctx.Done():
		t.Fatal("second inhibitor never released")
	}
}

func TestLogindInhibitError(t *testing.T) {
	bus := dbustest.Start(t)
	login := bus.StartLogin1(t)
	login.SetInhibitError(dbus.NewError("org.freedesktop.DBus.Error.AccessDenied", []any{"Permission denied"}))
	release, err := NewLogindRebooter(busClient(t, bus), testLogger(t)).Inhibit(testContext(t), "x")
	if err == nil || release != nil || !strings.Contains(err.Error(), "logind Inhibit: Permission denied") {
		t.Fatalf("Inhibit = (%v, %v), want the logind error", release != nil, err)
	}
	if len(login.Inhibitors()) != 0 {
		t.Errorf("inhibitors = %v, want none", login.Inhibitors())
	}
}

func TestSystemctlRebooter(t *testing.T) {
	tests := []struct {
		name     string
		reason   string
		runErr   error
		wantArgs []string
		wantErr  string
	}{
		{name: "with reason", reason: "MIG mode change", wantArgs: []string{"systemctl", "reboot", "--message=MIG mode change"}},
		{name: "no reason", wantArgs: []string{"systemctl", "reboot"}},
		{name: "failure surfaced", reason: "r", runErr: errors.New("exit status 1: Access denied"),
			wantArgs: []string{"systemctl", "reboot", "--message=r"}, wantErr: "systemctl reboot: exit status 1: Access denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got [][]string
			s := NewSystemctlRebooter(func(_ context.Context, name string, args ...string) error {
				got = append(got, append([]string{name}, args...))
				return tt.runErr
			})
			err := s.Reboot(context.Background(), tt.reason)
			if (err == nil) != (tt.wantErr == "") || err != nil && err.Error() != tt.wantErr {
				t.Fatalf("Reboot error = %v, want %q", err, tt.wantErr)
			}
			if tt.runErr != nil && !errors.Is(err, tt.runErr) {
				t.Errorf("error does not wrap the run error")
			}
			if !reflect.DeepEqual(got, [][]string{tt.wantArgs}) {
				t.Errorf("ran %q, want exactly once %q", got, tt.wantArgs)
			}
		})
	}
}

func TestExecRun(t *testing.T) {
	if err := ExecRun(context.Background(), "true"); err != nil {
		t.Fatalf("true: %v", err)
	}
	err := ExecRun(context.Background(), "sh", "-c", "echo nope >&2; exit 3")
	if err == nil || !strings.Contains(err.Error(), "exit status 3: nope") {
		t.Fatalf("failing command: %v, want exit status and output", err)
	}
}

func TestConnectSystemBus(t *testing.T) {
	bus := dbustest.Start(t)
	conn := busClient(t, bus)
	if len(conn.Names()) == 0 || !strings.HasPrefix(conn.Names()[0], ":") {
		t.Errorf("no unique name after Hello: %v", conn.Names())
	}
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", bus.Address)
	sys, err := ConnectSystemBus("")
	if err != nil {
		t.Fatalf("system bus via DBUS_SYSTEM_BUS_ADDRESS: %v", err)
	}
	_ = sys.Close()
	if _, err := ConnectSystemBus("unix:path=" + t.TempDir() + "/none"); err == nil {
		t.Fatal("connect to a missing socket succeeded")
	}
}

func callStrings(calls []dbustest.Call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.String())
	}
	return out
}
