package dbustest

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// recordTB captures Fatalf and Skipf of code under test instead of ending
// the real test.
type recordTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordTB) Helper() {}

func (r *recordTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recordTB) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func runStart(t *testing.T) *recordTB {
	rec := &recordTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(rec)
	}()
	<-done
	return rec
}

func TestStartWithoutDaemon(t *testing.T) {
	tests := []struct {
		name      string
		skip      string
		wantFatal string
		wantSkip  string
	}{
		{name: "missing fails", wantFatal: "hack/ensure-dbus.sh"},
		{name: "missing with MIG_AGENT_SKIP_DBUS=1 skips", skip: "1", wantSkip: "MIG_AGENT_SKIP_DBUS=1"},
		{name: "other values do not skip", skip: "true", wantFatal: "hack/ensure-dbus.sh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(DaemonEnv, "/nonexistent/dbus-daemon")
			t.Setenv(SkipEnv, tt.skip)
			rec := runStart(t)
			if tt.wantFatal != "" && !strings.Contains(rec.fatal, tt.wantFatal) {
				t.Errorf("fatal = %q, want it to mention %q", rec.fatal, tt.wantFatal)
			}
			if tt.wantSkip != "" && !strings.Contains(rec.skip, tt.wantSkip) {
				t.Errorf("skip = %q, want %q", rec.skip, tt.wantSkip)
			}
			if (rec.fatal != "") == (rec.skip != "") {
				t.Errorf("want exactly one of fatal/skip: fatal=%q skip=%q", rec.fatal, rec.skip)
			}
		})
	}
}

func TestBusAndStandIns(t *testing.T) {
	bus := Start(t)
	if !strings.HasPrefix(bus.Address, "unix:") || !strings.Contains(bus.Address, "guid=") {
		t.Fatalf("address = %q", bus.Address)
	}
	login := bus.StartLogin1(t)
	sd := bus.StartSystemd1(t)
	sd.AddUnit(t, "dcgm.service", "active")
	conn := bus.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var names []string
	if err := conn.BusObject().CallWithContext(ctx, "org.freedesktop.DBus.ListNames", 0).Store(&names); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{Login1Name, Systemd1Name} {
		if !contains(names, want) {
			t.Errorf("%s not on the bus: %v", want, names)
		}
	}

	// A second stand-in cannot take a name that is owned.
	if _, err := claimName(ctx, bus.Address, Login1Name); err == nil {
		t.Error("a second login1 took the name")
	}

	// Properties of a unit, at the path systemd would give it.
	var state dbus.Variant
	err := conn.Object(Systemd1Name, UnitPath("dcgm.service")).CallWithContext(ctx,
		"org.freedesktop.DBus.Properties.Get", 0, Systemd1UnitInterface, "ActiveState").Store(&state)
	if err != nil || state.Value() != "active" {
		t.Errorf("ActiveState = %v, %v", state, err)
	}

	// Only Manager methods are on the bus, not the fakes' Go API.
	err = conn.Object(Login1Name, Login1Path).CallWithContext(ctx, Login1Interface+".SetCanReboot", 0, "no").Err
	if err == nil {
		t.Error("SetCanReboot is callable over D-Bus")
	}
	if len(login.Calls()) != 0 {
		t.Errorf("calls = %v", login.Calls())
	}
}

func TestUnitPathMatchesSystemd(t *testing.T) {
	for _, name := range []string{"dcgm.service", "nvidia-persistenced.service", "gpu-monitor@3.service", "0day.service", "a_b.service"} {
		want := dbus.ObjectPath("/org/freedesktop/systemd1/unit/" + sddbus.PathBusEscape(name))
		if got := UnitPath(name); got != want {
			t.Errorf("UnitPath(%q) = %s, want %s", name, got, want)
		}
	}
}

func TestEscapeAddressValue(t *testing.T) {
	in := "/tmp/TestX,a:b=c d/001/bus"
	want := "/tmp/TestX%2ca%3ab%3dc%20d/001/bus"
	if got := escapeAddressValue(in); got != want {
		t.Errorf("escapeAddressValue(%q) = %q, want %q", in, got, want)
	}
}

func TestDaemonPathOverride(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(DaemonEnv, self)
	if got, err := DaemonPath(); err != nil || got != self {
		t.Errorf("DaemonPath = %q, %v; want %q", got, err, self)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
