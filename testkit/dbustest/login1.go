package dbustest

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"

	"github.com/godbus/dbus/v5"
)

// logind's well-known name, object and interface.
const (
	Login1Name      = "org.freedesktop.login1"
	Login1Path      = dbus.ObjectPath("/org/freedesktop/login1")
	Login1Interface = "org.freedesktop.login1.Manager"
)

// Call is one method call a stand-in service received, in arrival order.
type Call struct {
	// Method is the member name: "CanReboot", "Reboot", "StopUnit", ...
	Method string
	// Args are the call's arguments as D-Bus delivered them.
	Args []any
	// Err is the name of the D-Bus error the stand-in answered with, or ""
	// when the call succeeded.
	Err string
}

// String is "Method(arg, arg)", with " = ErrorName" when it failed; handy for
// comparing call sequences.
func (c Call) String() string {
	s := c.Method + "("
	for i, a := range c.Args {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprint(a)
	}
	s += ")"
	if c.Err != "" {
		s += " = " + c.Err
	}
	return s
}

// Inhibitor is one inhibitor lock the stand-in logind handed out.
type Inhibitor struct {
	What, Who, Why, Mode string
	// Released is closed once every copy of the lock's fd was closed by the
	// client (the stand-in read EOF on its end, as logind does).
	Released <-chan struct{}
}

// IsReleased reports whether the client closed the lock's fd.
func (i Inhibitor) IsReleased() bool {
	select {
	case <-i.Released:
		return true
	default:
		return false
	}
}

// Login1 is a stand-in for systemd-logind's Manager on a test bus: it
// answers CanReboot with a configurable answer, records Reboot calls, and
// hands out inhibitor locks as the write end of a pipe whose closing it
// observes, as logind does with its FIFOs. Configure it before the code under test runs, or at any time
// (it is safe for concurrent use).
type Login1 struct {
	conn  *dbus.Conn
	hooks *replyHooks

	mu           sync.Mutex
	canReboot    string
	canRebootErr *dbus.Error
	rebootErr    *dbus.Error
	inhibitErr   *dbus.Error
	calls        []Call
	inhibitors   []Inhibitor
	pipes        []*os.File // read ends, closed at shutdown
	readers      sync.WaitGroup
}

// StartLogin1 connects a stand-in logind to the bus, owning
// org.freedesktop.login1; it is stopped when the test ends. CanReboot
// answers "yes" until SetCanReboot says otherwise.
func (b *Bus) StartLogin1(t testing.TB) *Login1 {
	t.Helper()
	l := &Login1{hooks: newReplyHooks(), canReboot: "yes"}
	conn, err := claimName(context.Background(), b.Address, Login1Name, l.hooks.options()...)
	if err != nil {
		t.Fatalf("dbustest: login1: %v", err)
	}
	l.conn = conn
	if err := conn.Export(login1Methods{l}, Login1Path, Login1Interface); err != nil {
		_ = conn.Close()
		t.Fatalf("dbustest: login1: export: %v", err)
	}
	t.Cleanup(l.close)
	return l
}

func (l *Login1) close() {
	_ = l.conn.Close()
	l.hooks.drain()
	l.mu.Lock()
	for _, r := range l.pipes {
		_ = r.Close() // ends a reader whose lock the client still holds
	}
	l.mu.Unlock()
	l.readers.Wait()
}

// SetCanReboot sets CanReboot's answer: "yes", "no", "challenge", "na".
func (l *Login1) SetCanReboot(answer string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.canReboot = answer
}

// SetCanRebootError makes CanReboot fail with err (nil: answer again).
func (l *Login1) SetCanRebootError(err *dbus.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.canRebootErr = err
}

// SetRebootError makes Reboot fail with err (nil: succeed again).
func (l *Login1) SetRebootError(err *dbus.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rebootErr = err
}

// SetInhibitError makes Inhibit fail with err (nil: succeed again).
func (l *Login1) SetInhibitError(err *dbus.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inhibitErr = err
}

// Calls returns every Manager call received so far, in order, failed ones
// included.
func (l *Login1) Calls() []Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Call(nil), l.calls...)
}

// RebootCalls returns the "interactive" argument of every Reboot call that
// succeeded, in order: one element per reboot logind would have performed.
func (l *Login1) RebootCalls() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []bool
	for _, c := range l.calls {
		if c.Method == "Reboot" && c.Err == "" {
			out = append(out, c.Args[0].(bool))
		}
	}
	return out
}

// Inhibitors returns the inhibitor locks handed out so far, in order.
func (l *Login1) Inhibitors() []Inhibitor {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Inhibitor(nil), l.inhibitors...)
}

// record appends a call; err is the D-Bus error answered, or nil. It returns
// err, so handlers can end with "return l.record(...)".
func (l *Login1) record(err *dbus.Error, method string, args ...any) *dbus.Error {
	c := Call{Method: method, Args: args}
	if err != nil {
		c.Err = err.Name
	}
	l.calls = append(l.calls, c)
	return err
}

// login1Methods holds the exported D-Bus methods, so that Login1's own
// exported Go methods are not exported on the bus.
type login1Methods struct{ l *Login1 }

func (m login1Methods) CanReboot() (string, *dbus.Error) {
	l := m.l
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.canReboot, l.record(l.canRebootErr, "CanReboot")
}

func (m login1Methods) Reboot(interactive bool) *dbus.Error {
	l := m.l
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.record(l.rebootErr, "Reboot", interactive)
}

func (m login1Methods) Inhibit(msg dbus.Message, what, who, why, mode string) (dbus.UnixFD, *dbus.Error) {
	l := m.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inhibitErr != nil {
		return 0, l.record(l.inhibitErr, "Inhibit", what, who, why, mode)
	}
	switch mode {
	case "block", "delay", "block-weak":
	default:
		return 0, l.record(dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs",
			[]any{"Invalid mode specification " + mode}), "Inhibit", what, who, why, mode)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, l.record(dbus.MakeFailedError(err), "Inhibit", what, who, why, mode)
	}
	l.record(nil, "Inhibit", what, who, why, mode)
	l.pipes = append(l.pipes, r)
	released := make(chan struct{})
	l.inhibitors = append(l.inhibitors, Inhibitor{What: what, Who: who, Why: why, Mode: mode, Released: released})
	l.readers.Add(1)
	go func() {
		defer l.readers.Done()
		defer close(released)
		_, _ = io.Copy(io.Discard, r) // returns at EOF: every write end closed
	}()
	// Our copy of the write end must go once the reply carried it to the
	// client; until then closing it would fail the send.
	l.hooks.afterReply(msg, func() { _ = w.Close() })
	return dbus.UnixFD(w.Fd()), nil
}
