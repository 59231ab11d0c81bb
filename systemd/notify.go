package systemd

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"k8s.io/utils/clock"
)

// Notifier tells systemd how the service is doing over the sd_notify
// protocol: readiness, free-text status, stopping, and watchdog pings. Under
// no service manager (NOTIFY_SOCKET unset) every method is a no-op that
// returns nil. It is safe for concurrent use.
type Notifier struct {
	log      *slog.Logger
	clock    clock.WithTicker
	watchdog time.Duration // WATCHDOG_USEC; 0: no watchdog for this process
}

// NotifierOption configures a Notifier.
type NotifierOption func(*Notifier)

// WithNotifierClock sets the clock the watchdog ticks on (tests use a fake).
func WithNotifierClock(c clock.WithTicker) NotifierOption {
	return func(n *Notifier) { n.clock = c }
}

// NewNotifier reads WATCHDOG_USEC and WATCHDOG_PID through go-systemd (the
// watchdog is on only when systemd set it for this process); NOTIFY_SOCKET is
// read at each notification. An unusable WATCHDOG_USEC is logged and turns
// the watchdog off.
func NewNotifier(log *slog.Logger, opts ...NotifierOption) *Notifier {
	n := &Notifier{log: log, clock: clock.RealClock{}}
	for _, o := range opts {
		o(n)
	}
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("systemd watchdog setting unusable, watchdog off", "err", err)
		interval = 0
	}
	n.watchdog = interval
	return n
}

// WatchdogInterval is systemd's watchdog timeout for this process, 0 when
// there is none.
func (n *Notifier) WatchdogInterval() time.Duration { return n.watchdog }

// Ready sends READY=1: start-up is finished.
func (n *Notifier) Ready() error { return n.notify(daemon.SdNotifyReady) }

// Stopping sends STOPPING=1: shutdown has begun.
func (n *Notifier) Stopping() error { return n.notify(daemon.SdNotifyStopping) }

// Status sends STATUS= with free text ("evicting 2 pods on GPU 3",
// "waiting for reboot"), shown by systemctl status. Line breaks become spaces,
// since they separate sd_notify assignments.
func (n *Notifier) Status(format string, args ...any) error {
	text := fmt.Sprintf(format, args...)
	text = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(text)
	return n.notify("STATUS=" + text)
}

func (n *Notifier) notify(state string) error {
	if _, err := daemon.SdNotify(false, state); err != nil {
		return fmt.Errorf("sd_notify %q: %w", state, err)
	}
	return nil
}

// RunWatchdog pings WATCHDOG=1 at once and then every half watchdog interval
// while healthy() returns true; when healthy() returns false the ping is
// skipped, so systemd restarts a wedged agent. It returns when ctx ends, or
// at once when systemd set no watchdog for this process.
func (n *Notifier) RunWatchdog(ctx context.Context, healthy func() bool) {
	if n.watchdog <= 0 {
		return
	}
	period := n.watchdog / 2
	ticker := n.clock.NewTicker(period)
	defer ticker.Stop()
	n.log.Info("systemd watchdog on", "timeout", n.watchdog, "period", period)
	wasHealthy := true
	for ctx.Err() == nil {
		ok := healthy()
		switch {
		case ok:
			if !wasHealthy {
				n.log.Info("agent healthy again, watchdog pings resumed")
			}
			if err := n.notify(daemon.SdNotifyWatchdog); err != nil {
				n.log.Warn("watchdog ping failed", "err", err)
			}
		case wasHealthy:
			n.log.Warn("agent unhealthy, watchdog pings withheld")
		}
		wasHealthy = ok
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}
