package dbustest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/prop"
)

// systemd's well-known name, manager object and interfaces.
const (
	Systemd1Name             = "org.freedesktop.systemd1"
	Systemd1Path             = dbus.ObjectPath("/org/freedesktop/systemd1")
	Systemd1ManagerInterface = "org.freedesktop.systemd1.Manager"
	Systemd1UnitInterface    = "org.freedesktop.systemd1.Unit"
)

// Error names systemd answers with.
const (
	ErrNoSuchUnit       = "org.freedesktop.systemd1.NoSuchUnit"
	ErrAlreadySubscribe = "org.freedesktop.systemd1.AlreadySubscribed"
	ErrNotSubscribed    = "org.freedesktop.systemd1.NotSubscribed"
)

// Systemd1 is a stand-in for systemd's Manager on a test bus. It knows a set
// of units with an ActiveState each, exported at their unit object paths
// through org.freedesktop.DBus.Properties; StopUnit and StartUnit return a
// job path and emit JobRemoved (only while some client is subscribed, as
// systemd does on the system bus), then set the unit's ActiveState. Every
// Manager call is recorded in order. It is safe for concurrent use.
type Systemd1 struct {
	conn  *dbus.Conn
	hooks *replyHooks

	mu           sync.Mutex
	units        map[string]*fakeUnit
	calls        []Call
	subscribers  map[string]bool
	nextJob      uint32
	beforeReply  bool
	methodErrors map[string]*dbus.Error // "StopUnit a.service" → error
}

type fakeUnit struct {
	path   dbus.ObjectPath
	props  *prop.Properties
	result string // result of the next jobs: "" means "done"
	hold   bool   // jobs never finish
}

// StartSystemd1 connects a stand-in systemd to the bus, owning
// org.freedesktop.systemd1; it is stopped when the test ends.
func (b *Bus) StartSystemd1(t testing.TB) *Systemd1 {
	t.Helper()
	s := &Systemd1{
		hooks:        newReplyHooks(),
		units:        map[string]*fakeUnit{},
		subscribers:  map[string]bool{},
		methodErrors: map[string]*dbus.Error{},
	}
	conn, err := claimName(context.Background(), b.Address, Systemd1Name, s.hooks.options()...)
	if err != nil {
		t.Fatalf("dbustest: systemd1: %v", err)
	}
	s.conn = conn
	if err := conn.Export(systemd1Methods{s}, Systemd1Path, Systemd1ManagerInterface); err != nil {
		_ = conn.Close()
		t.Fatalf("dbustest: systemd1: export: %v", err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		s.hooks.drain()
	})
	return s
}

// UnitPath is the object path systemd gives a unit: /org/freedesktop/systemd1/unit/
// followed by the name with every byte outside [A-Za-z0-9] written as _XX.
func UnitPath(name string) dbus.ObjectPath {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' && i > 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "_%02x", c)
		}
	}
	return dbus.ObjectPath(string(Systemd1Path) + "/unit/" + b.String())
}

// AddUnit makes a loaded unit known with the given ActiveState ("active",
// "inactive", "failed", "activating", ...). Units never added answer
// GetUnit with NoSuchUnit, as systemd does for units that are not loaded.
func (s *Systemd1) AddUnit(t testing.TB, name, activeState string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.units[name]; ok {
		t.Fatalf("dbustest: systemd1: unit %s added twice", name)
	}
	path := UnitPath(name)
	props, err := prop.Export(s.conn, path, prop.Map{
		Systemd1UnitInterface: {
			"Id":          {Value: name, Emit: prop.EmitTrue},
			"LoadState":   {Value: "loaded", Emit: prop.EmitTrue},
			"ActiveState": {Value: activeState, Emit: prop.EmitTrue},
		},
	})
	if err != nil {
		t.Fatalf("dbustest: systemd1: export unit %s: %v", name, err)
	}
	s.units[name] = &fakeUnit{path: path, props: props}
}

// ActiveState is the unit's ActiveState now ("" for an unknown unit).
func (s *Systemd1) ActiveState(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.units[name]
	if !ok {
		return ""
	}
	return u.props.GetMust(Systemd1UnitInterface, "ActiveState").(string)
}

// SetJobResult sets the result JobRemoved reports for the unit's next jobs:
// "done" (the default), "failed", "timeout", "canceled", "dependency",
// "skipped". A job that is not done leaves ActiveState as it was, except a
// failed start, which leaves "failed".
func (s *Systemd1) SetJobResult(name, result string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u, ok := s.units[name]; ok {
		u.result = result
	}
}

// HoldJobs makes the unit's jobs never finish: no JobRemoved, no change of
// ActiveState (a unit stuck stopping).
func (s *Systemd1) HoldJobs(name string, hold bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u, ok := s.units[name]; ok {
		u.hold = hold
	}
}

// SetMethodError makes method ("GetUnit", "StopUnit", "StartUnit") fail for
// unit with err; nil clears it.
func (s *Systemd1) SetMethodError(method, unit string, err *dbus.Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		delete(s.methodErrors, method+" "+unit)
		return
	}
	s.methodErrors[method+" "+unit] = err
}

// SetJobRemovedBeforeReply, when true, emits JobRemoved before the reply to
// StopUnit/StartUnit is sent, so the client sees the signal first: the race
// a client must handle. By default the signal follows the reply.
func (s *Systemd1) SetJobRemovedBeforeReply(before bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.beforeReply = before
}

// Calls returns every Manager call received so far, in order.
func (s *Systemd1) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// JobCalls returns the StopUnit and StartUnit calls, in order, as strings
// like "StopUnit(dcgm.service, replace)".
func (s *Systemd1) JobCalls() []string {
	var out []string
	for _, c := range s.Calls() {
		if c.Method == "StopUnit" || c.Method == "StartUnit" {
			out = append(out, c.String())
		}
	}
	return out
}

// Subscribed reports whether any client is subscribed now.
func (s *Systemd1) Subscribed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.subscribers) > 0
}

func (s *Systemd1) record(err *dbus.Error, method string, args ...any) *dbus.Error {
	c := Call{Method: method, Args: args}
	if err != nil {
		c.Err = err.Name
	}
	s.calls = append(s.calls, c)
	return err
}

func noSuchUnit(name string) *dbus.Error {
	return dbus.NewError(ErrNoSuchUnit, []any{fmt.Sprintf("Unit %s not loaded.", name)})
}

// systemd1Methods holds the exported D-Bus methods.
type systemd1Methods struct{ s *Systemd1 }

func (m systemd1Methods) GetUnit(name string) (dbus.ObjectPath, *dbus.Error) {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.methodErrors["GetUnit "+name]; err != nil {
		return "", s.record(err, "GetUnit", name)
	}
	u, ok := s.units[name]
	if !ok {
		return "", s.record(noSuchUnit(name), "GetUnit", name)
	}
	return u.path, s.record(nil, "GetUnit", name)
}

func (m systemd1Methods) Subscribe(sender dbus.Sender) *dbus.Error {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subscribers[string(sender)] {
		return s.record(dbus.NewError(ErrAlreadySubscribe, []any{"Client is already subscribed."}), "Subscribe")
	}
	s.subscribers[string(sender)] = true
	return s.record(nil, "Subscribe")
}

func (m systemd1Methods) Unsubscribe(sender dbus.Sender) *dbus.Error {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.subscribers[string(sender)] {
		return s.record(dbus.NewError(ErrNotSubscribed, []any{"Client is not subscribed."}), "Unsubscribe")
	}
	delete(s.subscribers, string(sender))
	return s.record(nil, "Unsubscribe")
}

func (m systemd1Methods) StopUnit(msg dbus.Message, name, mode string) (dbus.ObjectPath, *dbus.Error) {
	return m.s.job(msg, "StopUnit", name, mode)
}

func (m systemd1Methods) StartUnit(msg dbus.Message, name, mode string) (dbus.ObjectPath, *dbus.Error) {
	return m.s.job(msg, "StartUnit", name, mode)
}

// job queues a stop or start job and arranges its JobRemoved.
func (s *Systemd1) job(msg dbus.Message, method, name, mode string) (dbus.ObjectPath, *dbus.Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.methodErrors[method+" "+name]; err != nil {
		return "", s.record(err, method, name, mode)
	}
	u, ok := s.units[name]
	if !ok {
		return "", s.record(dbus.NewError(ErrNoSuchUnit, []any{fmt.Sprintf("Unit %s not found.", name)}), method, name, mode)
	}
	switch mode {
	case "replace", "fail", "isolate", "ignore-dependencies", "ignore-requirements":
	default:
		return "", s.record(dbus.NewError("org.freedesktop.DBus.Error.InvalidArgs",
			[]any{"Job mode " + mode + " invalid."}), method, name, mode)
	}
	s.record(nil, method, name, mode)
	s.nextJob++
	id := s.nextJob
	job := dbus.ObjectPath(fmt.Sprintf("%s/job/%d", Systemd1Path, id))
	if u.hold {
		return job, nil
	}
	result := u.result
	if result == "" {
		result = "done"
	}
	state := ""
	switch {
	case result == "done" && method == "StopUnit":
		state = "inactive"
	case result == "done" && method == "StartUnit":
		state = "active"
	case result == "failed" && method == "StartUnit":
		state = "failed"
	}
	finish := func() {
		if state != "" {
			u.props.SetMust(Systemd1UnitInterface, "ActiveState", state)
		}
		s.mu.Lock()
		subscribed := len(s.subscribers) > 0
		s.mu.Unlock()
		if subscribed {
			_ = s.conn.Emit(Systemd1Path, Systemd1ManagerInterface+".JobRemoved", id, job, name, result)
		}
	}
	if s.beforeReply {
		s.mu.Unlock()
		finish()
		s.mu.Lock()
	} else {
		s.hooks.afterReply(msg, finish)
	}
	return job, nil
}
