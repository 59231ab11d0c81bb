package systemd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/godbus/dbus/v5"
	"k8s.io/utils/clock"
)

// systemd's D-Bus name, manager object and interfaces.
const (
	systemd1Name    = "org.freedesktop.systemd1"
	systemd1Path    = dbus.ObjectPath("/org/freedesktop/systemd1")
	systemd1Manager = "org.freedesktop.systemd1.Manager"
	systemd1Unit    = "org.freedesktop.systemd1.Unit"

	errNoSuchUnit        = "org.freedesktop.systemd1.NoSuchUnit"
	errAlreadySubscribed = "org.freedesktop.systemd1.AlreadySubscribed"
)

// DefaultJobTimeout bounds the wait for one stop or start job. systemd's own
// default stop timeout is 90s before it kills the unit; this leaves room.
const DefaultJobTimeout = 3 * time.Minute

// Sentinel errors of unit control.
var (
	// ErrJobFailed: systemd finished a job with a result other than "done".
	ErrJobFailed = errors.New("systemd job did not finish as done")
	// ErrJobTimeout: a job did not finish within the job timeout.
	ErrJobTimeout = errors.New("systemd job did not finish in time")
	// ErrInvalidUnitName: a unit name systemd would reject.
	ErrInvalidUnitName = errors.New("invalid systemd unit name")
)

// hasUnitSuffix reports whether name ends in one of systemd's unit types; a
// name without one is a service.
func hasUnitSuffix(name string) bool {
	i := strings.LastIndexByte(name, '.')
	if i <= 0 {
		return false
	}
	switch name[i:] {
	case ".service", ".socket", ".device", ".mount", ".automount", ".swap",
		".target", ".path", ".timer", ".slice", ".scope":
		return true
	}
	return false
}

// NormalizeUnitName checks a unit name as an operator writes it for
// --host-gpu-clients and returns the full name systemd uses: "dcgm" becomes
// "dcgm.service", as systemctl does. Empty names, names with characters
// systemd does not allow, and names longer than 255 bytes are
// ErrInvalidUnitName.
func NormalizeUnitName(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidUnitName)
	}
	for _, c := range []byte(name) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == ':' || c == '-' || c == '_' || c == '.' || c == '\\' || c == '@'
		if !ok {
			return "", fmt.Errorf("%w: %q: character %q not allowed", ErrInvalidUnitName, name, c)
		}
	}
	full := name
	if !hasUnitSuffix(name) {
		full += ".service"
	}
	if strings.HasPrefix(full, ".") || strings.HasPrefix(full, "@") {
		return "", fmt.Errorf("%w: %q", ErrInvalidUnitName, name)
	}
	if len(full) > 255 {
		return "", fmt.Errorf("%w: %q: longer than 255 bytes", ErrInvalidUnitName, name)
	}
	return full, nil
}

// Units stops and starts host GPU client units (DCGM, persistence daemons,
// monitoring agents) through systemd's Manager over D-Bus, waiting for each
// job to finish. Calls are serialised; it is safe for concurrent use.
type Units struct {
	conn       *dbus.Conn
	log        *slog.Logger
	clock      clock.Clock
	jobTimeout time.Duration

	mu sync.Mutex
}

// UnitsOption configures Units.
type UnitsOption func(*Units)

// WithJobTimeout bounds the wait for each job (default DefaultJobTimeout).
func WithJobTimeout(d time.Duration) UnitsOption {
	return func(u *Units) { u.jobTimeout = d }
}

// WithUnitsClock sets the clock of the job timeout (tests use a fake).
func WithUnitsClock(c clock.Clock) UnitsOption {
	return func(u *Units) { u.clock = c }
}

// NewUnits controls units through systemd over conn (see ConnectSystemBus).
func NewUnits(conn *dbus.Conn, log *slog.Logger, opts ...UnitsOption) *Units {
	u := &Units{conn: conn, log: log, clock: clock.RealClock{}, jobTimeout: DefaultJobTimeout}
	for _, o := range opts {
		o(u)
	}
	return u
}

// StopActive stops, in the given order, those of the named units that are
// running (ActiveState active, activating or reloading), waiting for each
// stop job to finish before the next. Units that are inactive, failed or not
// loaded are skipped. Names are normalised as NormalizeUnitName does, and all
// are checked before anything is stopped.
//
// stopped lists, in stop order, every unit a stop job was queued for: on
// error too (the unit whose job failed included), so that the caller
// restarts exactly those with Start and never starts one that was not
// running.
func (u *Units) StopActive(ctx context.Context, names []string) (stopped []string, err error) {
	full, err := normalizeAll(names)
	if err != nil {
		return nil, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	w, err := u.watchJobs(ctx)
	if err != nil {
		return nil, err
	}
	defer w.close()
	for _, name := range full {
		state, err := u.activeState(ctx, name)
		if err != nil {
			return stopped, err
		}
		switch state {
		case "active", "activating", "reloading":
		default:
			u.log.Info("host GPU client not running, left alone", "unit", name, "activeState", state)
			continue
		}
		u.log.Info("stopping host GPU client", "unit", name, "activeState", state)
		job, err := u.queue(ctx, "StopUnit", name)
		if err != nil {
			return stopped, err
		}
		stopped = append(stopped, name)
		if err := u.wait(ctx, w, job, name, "stop"); err != nil {
			return stopped, err
		}
	}
	return stopped, nil
}

// Start starts the named units in reverse order (the reverse of the order
// StopActive stopped them), waiting for each start job. It tries every unit
// and returns the failures joined.
func (u *Units) Start(ctx context.Context, names []string) error {
	full, err := normalizeAll(names)
	if err != nil {
		return err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	w, err := u.watchJobs(ctx)
	if err != nil {
		return err
	}
	defer w.close()
	var errs []error
	for i := len(full) - 1; i >= 0; i-- {
		name := full[i]
		u.log.Info("starting host GPU client", "unit", name)
		job, err := u.queue(ctx, "StartUnit", name)
		if err == nil {
			err = u.wait(ctx, w, job, name, "start")
		}
		if err != nil {
			u.log.Error("host GPU client did not start", "unit", name, "err", err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func normalizeAll(names []string) ([]string, error) {
	out := make([]string, 0, len(names))
	seen := map[string]bool{}
	for _, n := range names {
		full, err := NormalizeUnitName(n)
		if err != nil {
			return nil, err
		}
		if seen[full] {
			return nil, fmt.Errorf("%w: %q named twice", ErrInvalidUnitName, full)
		}
		seen[full] = true
		out = append(out, full)
	}
	return out, nil
}

func (u *Units) manager() dbus.BusObject { return u.conn.Object(systemd1Name, systemd1Path) }

// activeState is the unit's ActiveState; a unit systemd has not loaded is
// "inactive".
func (u *Units) activeState(ctx context.Context, name string) (string, error) {
	var path dbus.ObjectPath
	err := u.manager().CallWithContext(ctx, systemd1Manager+".GetUnit", 0, name).Store(&path)
	if dbusErrorName(err) == errNoSuchUnit {
		return "inactive", nil
	}
	if err != nil {
		return "", fmt.Errorf("systemd GetUnit %s: %w", name, err)
	}
	var v dbus.Variant
	err = u.conn.Object(systemd1Name, path).
		CallWithContext(ctx, "org.freedesktop.DBus.Properties.Get", 0, systemd1Unit, "ActiveState").Store(&v)
	if err != nil {
		return "", fmt.Errorf("systemd %s ActiveState: %w", name, err)
	}
	state, ok := v.Value().(string)
	if !ok {
		return "", fmt.Errorf("systemd %s ActiveState: unexpected type %s", name, v.Signature())
	}
	return state, nil
}

// queue asks systemd for a stop or start job (mode "replace") and returns
// its object path.
func (u *Units) queue(ctx context.Context, method, name string) (dbus.ObjectPath, error) {
	var job dbus.ObjectPath
	if err := u.manager().CallWithContext(ctx, systemd1Manager+"."+method, 0, name, "replace").Store(&job); err != nil {
		return "", fmt.Errorf("systemd %s %s: %w", method, name, err)
	}
	return job, nil
}

// wait waits for the job's JobRemoved signal, bounded by the job timeout.
func (u *Units) wait(ctx context.Context, w *jobWatch, job dbus.ObjectPath, name, verb string) error {
	timeout := u.clock.NewTimer(u.jobTimeout)
	defer timeout.Stop()
	result, err := w.wait(ctx, job, timeout.C())
	if errors.Is(err, ErrJobTimeout) {
		state, serr := u.activeState(ctx, name)
		if serr != nil {
			state = "unknown"
		}
		return fmt.Errorf("%s %s: %w after %s (ActiveState %s)", verb, name, err, u.jobTimeout, state)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, name, err)
	}
	if result != "done" {
		return fmt.Errorf("%s %s: %w: result %q", verb, name, ErrJobFailed, result)
	}
	u.log.Info("systemd job done", "unit", name, "job", verb)
	return nil
}

// unsubscribeTimeout bounds the clean-up call after a stop or start run.
const unsubscribeTimeout = 10 * time.Second

// jobWatch receives systemd's JobRemoved signals from before a job is
// queued: its channel holds a signal that arrives before StopUnit's reply
// (a job that finishes at once), so none is missed.
type jobWatch struct {
	conn         *dbus.Conn
	ch           chan *dbus.Signal
	match        []dbus.MatchOption
	unsubscribe  bool
	unsubscriber dbus.BusObject
}

// watchJobs adds a match for JobRemoved and subscribes to systemd's signals
// (systemd sends them on the system bus only while some client is
// subscribed).
func (u *Units) watchJobs(ctx context.Context) (*jobWatch, error) {
	w := &jobWatch{
		conn: u.conn,
		ch:   make(chan *dbus.Signal, 64),
		match: []dbus.MatchOption{
			dbus.WithMatchSender(systemd1Name),
			dbus.WithMatchObjectPath(systemd1Path),
			dbus.WithMatchInterface(systemd1Manager),
			dbus.WithMatchMember("JobRemoved"),
		},
		unsubscriber: u.manager(),
	}
	if err := u.conn.AddMatchSignalContext(ctx, w.match...); err != nil {
		return nil, fmt.Errorf("watch systemd JobRemoved: %w", err)
	}
	u.conn.Signal(w.ch)
	err := u.manager().CallWithContext(ctx, systemd1Manager+".Subscribe", 0).Err
	switch {
	case err == nil:
		w.unsubscribe = true
	case dbusErrorName(err) == errAlreadySubscribed:
	default:
		w.close()
		return nil, fmt.Errorf("systemd Subscribe: %w", err)
	}
	return w, nil
}

func (w *jobWatch) close() {
	if w.unsubscribe {
		ctx, cancel := context.WithTimeout(context.Background(), unsubscribeTimeout)
		_ = w.unsubscriber.CallWithContext(ctx, systemd1Manager+".Unsubscribe", 0).Err
		cancel()
	}
	w.conn.RemoveSignal(w.ch)
	_ = w.conn.RemoveMatchSignal(w.match...)
}

// wait returns the result of job from its JobRemoved signal; signals of
// other jobs (ours already waited for, or anyone else's) are dropped.
func (w *jobWatch) wait(ctx context.Context, job dbus.ObjectPath, timeout <-chan time.Time) (string, error) {
	for {
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-timeout:
			return "", ErrJobTimeout
		case sig, ok := <-w.ch:
			if !ok {
				return "", errors.New("D-Bus connection closed while waiting for a systemd job")
			}
			if sig.Name != systemd1Manager+".JobRemoved" || sig.Path != systemd1Path {
				continue
			}
			var (
				id     uint32
				path   dbus.ObjectPath
				unit   string
				result string
			)
			if err := dbus.Store(sig.Body, &id, &path, &unit, &result); err != nil {
				continue
			}
			if path == job {
				return result, nil
			}
		}
	}
}

// dbusErrorName is the D-Bus error name of err, or "".
func dbusErrorName(err error) string {
	var e dbus.Error
	if errors.As(err, &e) {
		return e.Name
	}
	var pe *dbus.Error
	if errors.As(err, &pe) && pe != nil {
		return pe.Name
	}
	return ""
}
