package systemd

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/testkit/dbustest"
)

func TestNormalizeUnitName(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "dcgm", want: "dcgm.service"},
		{in: "nvidia-dcgm.service", want: "nvidia-dcgm.service"},
		{in: "nvidia-persistenced", want: "nvidia-persistenced.service"},
		{in: "gpu-monitor@3.service", want: "gpu-monitor@3.service"},
		{in: "gpu-metrics.timer", want: "gpu-metrics.timer"},
		{in: "dcgm-exporter.socket", want: "dcgm-exporter.socket"},
		{in: "foo.bar", want: "foo.bar.service"},
		{in: "", wantErr: true},
		{in: "a b", wantErr: true},
		{in: "dcgm;reboot", wantErr: true},
		{in: "../x", wantErr: true},
		{in: ".service", wantErr: true},
		{in: strings.Repeat("a", 250), wantErr: true},
	}
	for _, tt := range tests {
		got, err := NormalizeUnitName(tt.in)
		if tt.wantErr {
			if err == nil || !errors.Is(err, ErrInvalidUnitName) {
				t.Errorf("NormalizeUnitName(%q) = %q, %v; want ErrInvalidUnitName", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("NormalizeUnitName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestUnitsStopActiveAndStart(t *testing.T) {
	for _, before := range []bool{false, true} {
		name := "JobRemoved after reply"
		if before {
			name = "JobRemoved before reply"
		}
		t.Run(name, func(t *testing.T) {
			bus := dbustest.Start(t)
			sd := bus.StartSystemd1(t)
			sd.SetJobRemovedBeforeReply(before)
			sd.AddUnit(t, "dcgm.service", "active")
			sd.AddUnit(t, "nvidia-persistenced.service", "inactive")
			sd.AddUnit(t, "gpu-exporter.service", "active")
			sd.AddUnit(t, "old-monitor.service", "failed")
			units := NewUnits(busClient(t, bus), testLogger(t))
			ctx := testContext(t)

			names := []string{"dcgm", "nvidia-persistenced.service", "not-installed", "gpu-exporter.service", "old-monitor"}
			stopped, err := units.StopActive(ctx, names)
			if err != nil {
				t.Fatalf("StopActive: %v", err)
			}
			if want := []string{"dcgm.service", "gpu-exporter.service"}; !reflect.DeepEqual(stopped, want) {
				t.Fatalf("stopped = %q, want %q", stopped, want)
			}
			for unit, want := range map[string]string{
				"dcgm.service": "inactive", "gpu-exporter.service": "inactive",
				"nvidia-persistenced.service": "inactive", "old-monitor.service": "failed",
			} {
				if got := sd.ActiveState(unit); got != want {
					t.Errorf("%s ActiveState after stop = %q, want %q", unit, got, want)
				}
			}

			if err := units.Start(ctx, stopped); err != nil {
				t.Fatalf("Start: %v", err)
			}
			wantJobs := []string{
				"StopUnit(dcgm.service, replace)",
				"StopUnit(gpu-exporter.service, replace)",
				"StartUnit(gpu-exporter.service, replace)",
				"StartUnit(dcgm.service, replace)",
			}
			if got := sd.JobCalls(); !reflect.DeepEqual(got, wantJobs) {
				t.Errorf("jobs = %q, want %q", got, wantJobs)
			}
			for unit, want := range map[string]string{
				"dcgm.service": "active", "gpu-exporter.service": "active",
				"nvidia-persistenced.service": "inactive", "old-monitor.service": "failed",
			} {
				if got := sd.ActiveState(unit); got != want {
					t.Errorf("%s ActiveState after start = %q, want %q", unit, got, want)
				}
			}
			if sd.Subscribed() {
				t.Error("still subscribed to systemd signals after the runs")
			}
		})
	}
}

func TestUnitsStopFailures(t *testing.T) {
	denied := dbus.NewError("org.freedesktop.DBus.Error.AccessDenied", []any{"Access denied"})
	tests := []struct {
		name        string
		setup       func(*dbustest.Systemd1)
		wantStopped []string
		wantErr     string
		wantIs      error
		wantJobs    []string
	}{
		{
			name:        "stop job fails: error, unit listed for restart, later units untouched",
			setup:       func(sd *dbustest.Systemd1) { sd.SetJobResult("b.service", "failed") },
			wantStopped: []string{"a.service", "b.service"},
			wantErr:     `stop b.service: systemd job did not finish as done: result "failed"`,
			wantIs:      ErrJobFailed,
			wantJobs:    []string{"StopUnit(a.service, replace)", "StopUnit(b.service, replace)"},
		},
		{
			name:        "StopUnit refused: error, unit not listed",
			setup:       func(sd *dbustest.Systemd1) { sd.SetMethodError("StopUnit", "b.service", denied) },
			wantStopped: []string{"a.service"},
			wantErr:     "systemd StopUnit b.service: Access denied",
			wantJobs:    []string{"StopUnit(a.service, replace)", "StopUnit(b.service, replace) = org.freedesktop.DBus.Error.AccessDenied"},
		},
		{
			name:        "GetUnit refused",
			setup:       func(sd *dbustest.Systemd1) { sd.SetMethodError("GetUnit", "a.service", denied) },
			wantStopped: nil,
			wantErr:     "systemd GetUnit a.service: Access denied",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bus := dbustest.Start(t)
			sd := bus.StartSystemd1(t)
			for _, u := range []string{"a.service", "b.service", "c.service"} {
				sd.AddUnit(t, u, "active")
			}
			tt.setup(sd)
			stopped, err := NewUnits(busClient(t, bus), testLogger(t)).StopActive(testContext(t), []string{"a", "b", "c"})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("StopActive error = %v, want %q", err, tt.wantErr)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error %v is not %v", err, tt.wantIs)
			}
			if !reflect.DeepEqual(stopped, tt.wantStopped) {
				t.Errorf("stopped = %q, want %q", stopped, tt.wantStopped)
			}
			if got := sd.JobCalls(); !reflect.DeepEqual(got, tt.wantJobs) {
				t.Errorf("jobs = %q, want %q", got, tt.wantJobs)
			}
			if sd.ActiveState("c.service") != "active" {
				t.Error("a unit after the failure was touched")
			}
		})
	}
}

func TestUnitsStartTriesAll(t *testing.T) {
	bus := dbustest.Start(t)
	sd := bus.StartSystemd1(t)
	sd.AddUnit(t, "a.service", "inactive")
	sd.AddUnit(t, "b.service", "inactive")
	sd.AddUnit(t, "c.service", "inactive")
	sd.SetJobResult("b.service", "failed")
	err := NewUnits(busClient(t, bus), testLogger(t)).Start(testContext(t), []string{"a", "b", "c", "gone"})
	if err == nil || !errors.Is(err, ErrJobFailed) || !strings.Contains(err.Error(), "start b.service") ||
		!strings.Contains(err.Error(), "systemd StartUnit gone.service: Unit gone.service not found.") {
		t.Fatalf("Start error = %v, want b's failed job and gone's missing unit", err)
	}
	want := []string{
		"StartUnit(gone.service, replace) = org.freedesktop.systemd1.NoSuchUnit", "StartUnit(c.service, replace)",
		"StartUnit(b.service, replace)", "StartUnit(a.service, replace)",
	}
	if got := sd.JobCalls(); !reflect.DeepEqual(got, want) {
		t.Errorf("jobs = %q, want %q", got, want)
	}
	if sd.ActiveState("a.service") != "active" || sd.ActiveState("b.service") != "failed" {
		t.Errorf("states a=%s b=%s", sd.ActiveState("a.service"), sd.ActiveState("b.service"))
	}
}

func TestUnitsJobTimeout(t *testing.T) {
	bus := dbustest.Start(t)
	sd := bus.StartSystemd1(t)
	sd.AddUnit(t, "stuck.service", "active")
	sd.HoldJobs("stuck.service", true)
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	units := NewUnits(busClient(t, bus), testLogger(t), WithUnitsClock(clk), WithJobTimeout(time.Minute))

	type result struct {
		stopped []string
		err     error
	}
	done := make(chan result, 1)
	go func() {
		s, err := units.StopActive(testContext(t), []string{"stuck"})
		done <- result{s, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("StopActive never started waiting for its job")
		}
		time.Sleep(time.Millisecond) // waiting for the goroutine, not for time to pass
	}
	clk.Step(59 * time.Second)
	select {
	case r := <-done:
		t.Fatalf("returned before the job timeout: %v %v", r.stopped, r.err)
	default:
	}
	clk.Step(time.Second)
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("StopActive did not time out")
	}
	if !errors.Is(r.err, ErrJobTimeout) || !strings.Contains(r.err.Error(), "ActiveState active") {
		t.Fatalf("error = %v, want ErrJobTimeout with the unit's state", r.err)
	}
	if !reflect.DeepEqual(r.stopped, []string{"stuck.service"}) {
		t.Errorf("stopped = %q, want the stuck unit listed for restart", r.stopped)
	}
}

func TestUnitsBadNames(t *testing.T) {
	bus := dbustest.Start(t)
	sd := bus.StartSystemd1(t)
	units := NewUnits(busClient(t, bus), testLogger(t))
	for _, names := range [][]string{{"ok", "bad name"}, {"a", "a.service"}} {
		if _, err := units.StopActive(testContext(t), names); !errors.Is(err, ErrInvalidUnitName) {
			t.Errorf("StopActive(%q) = %v, want ErrInvalidUnitName", names, err)
		}
		if err := units.Start(testContext(t), names); !errors.Is(err, ErrInvalidUnitName) {
			t.Errorf("Start(%q) = %v, want ErrInvalidUnitName", names, err)
		}
	}
	if calls := sd.Calls(); len(calls) != 0 {
		t.Errorf("systemd was called: %v", calls)
	}
}
