package systemd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"

	"github.com/godbus/dbus/v5"

	"github.com/migagent/mig-agent/internal/boundcmd"
)

// logind's D-Bus name, object and interface.
const (
	login1Name    = "org.freedesktop.login1"
	login1Path    = dbus.ObjectPath("/org/freedesktop/login1")
	login1Manager = "org.freedesktop.login1.Manager"
)

// inhibitWho is the "who" of mig-agent's inhibitor locks (systemd-inhibit --list).
const inhibitWho = "mig-agent"

// ErrRebootNotPermitted is returned when logind's CanReboot answers anything
// but "yes" or "challenge" ("no", "na"): the reboot was not requested.
var ErrRebootNotPermitted = errors.New("logind does not permit a reboot")

// Rebooter reboots the machine. The agent calls it once per change that needs
// a reboot, after journaling the intent; a nil error means the reboot was
// requested (the process may be killed any moment after). A retry after an
// error asks again.
type Rebooter interface {
	Reboot(ctx context.Context, reason string) error
}

var (
	_ Rebooter = (*LogindRebooter)(nil)
	_ Rebooter = (*SystemctlRebooter)(nil)
)

// ConnectSystemBus opens a private connection (authenticated, Hello sent):
// to the system bus when address is "" (DBUS_SYSTEM_BUS_ADDRESS honoured),
// else to address ("unix:path=/run/dbus/system_bus_socket"). The caller
// closes it.
func ConnectSystemBus(address string) (*dbus.Conn, error) {
	var (
		conn *dbus.Conn
		err  error
	)
	if address == "" {
		conn, err = dbus.ConnectSystemBus()
		address = "system bus"
	} else {
		conn, err = dbus.Connect(address)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to D-Bus (%s): %w", address, err)
	}
	return conn, nil
}

// LogindRebooter reboots through systemd-logind's Manager over D-Bus and
// takes logind inhibitor locks.
type LogindRebooter struct {
	conn *dbus.Conn
	log  *slog.Logger
}

// NewLogindRebooter talks to logind over conn (see ConnectSystemBus).
func NewLogindRebooter(conn *dbus.Conn, log *slog.Logger) *LogindRebooter {
	return &LogindRebooter{conn: conn, log: log}
}

func (r *LogindRebooter) manager() dbus.BusObject {
	return r.conn.Object(login1Name, login1Path)
}

// Reboot asks logind whether a reboot is allowed (CanReboot must answer
// "yes" or "challenge", else ErrRebootNotPermitted with the answer) and then
// calls Reboot(interactive=false). logind's errors (access denied, a
// shutdown already under way, ...) are returned, not dropped.
func (r *LogindRebooter) Reboot(ctx context.Context, reason string) error {
	var answer string
	if err := r.manager().CallWithContext(ctx, login1Manager+".CanReboot", 0).Store(&answer); err != nil {
		return fmt.Errorf("logind CanReboot: %w", err)
	}
	switch answer {
	case "yes", "challenge":
	default:
		return fmt.Errorf("%w: CanReboot answered %q", ErrRebootNotPermitted, answer)
	}
	r.log.Warn("requesting reboot through logind", "reason", reason, "canReboot", answer)
	if err := r.manager().CallWithContext(ctx, login1Manager+".Reboot", 0, false).Err; err != nil {
		return fmt.Errorf("logind Reboot: %w", err)
	}
	return nil
}

// Inhibit takes a logind "delay" inhibitor lock on shutdown (who
// "mig-agent", why as given), so that a reboot or power-off asked for by
// someone else waits (up to logind's InhibitDelayMaxSec) while NVML is
// mid-change. release closes the lock's fd; it is idempotent. The fd is not
// inherited by child processes.
func (r *LogindRebooter) Inhibit(ctx context.Context, why string) (release func() error, err error) {
	var fd dbus.UnixFD
	call := r.manager().CallWithContext(ctx, login1Manager+".Inhibit", 0, "shutdown", inhibitWho, why, "delay")
	if err := call.Store(&fd); err != nil {
		return nil, fmt.Errorf("logind Inhibit: %w", err)
	}
	if fd < 0 {
		return nil, fmt.Errorf("logind Inhibit: invalid fd %d", fd)
	}
	syscall.CloseOnExec(int(fd))
	f := os.NewFile(uintptr(fd), "logind-inhibitor")
	r.log.Info("holding shutdown inhibitor lock", "why", why)
	var once sync.Once
	var closeErr error
	return func() error {
		once.Do(func() {
			if err := f.Close(); err != nil {
				closeErr = fmt.Errorf("release logind inhibitor: %w", err)
				return
			}
			r.log.Info("released shutdown inhibitor lock", "why", why)
		})
		return closeErr
	}, nil
}

// RunFunc runs a command; SystemctlRebooter calls it as run(ctx, "systemctl",
// "reboot", ...).
type RunFunc func(ctx context.Context, name string, args ...string) error

// SystemctlRebooter reboots by running `systemctl reboot`.
type SystemctlRebooter struct {
	run RunFunc
}

// NewSystemctlRebooter runs `systemctl reboot` through run; a nil run
// executes the command, with its output in the error when it fails.
func NewSystemctlRebooter(run func(ctx context.Context, name string, args ...string) error) *SystemctlRebooter {
	if run == nil {
		run = ExecRun
	}
	return &SystemctlRebooter{run: run}
}

// Reboot runs `systemctl reboot`, with --message=REASON when reason is set
// (logged by systemd with the shutdown).
func (s *SystemctlRebooter) Reboot(ctx context.Context, reason string) error {
	args := []string{"reboot"}
	if reason != "" {
		args = append(args, "--message="+reason)
	}
	if err := s.run(ctx, "systemctl", args...); err != nil {
		return fmt.Errorf("systemctl reboot: %w", err)
	}
	return nil
}

// ExecRun runs name with args, for at most boundcmd.DefaultTimeout, and
// returns an error that includes the command's combined output when it
// fails.
func ExecRun(ctx context.Context, name string, args ...string) error {
	out, err := boundcmd.CombinedOutput(ctx, boundcmd.DefaultTimeout, exec.Command(name, args...))
	if err != nil {
		if msg := strings.TrimSpace(string(out)); msg != "" {
			return fmt.Errorf("%s: %w: %s", name, err, msg)
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
