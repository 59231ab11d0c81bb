package systemd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// --reboot-method kured: the agent asks kured for the reboot instead of
// rebooting itself. kured's daemon checks every --period whether its
// sentinel file exists (kured pkg/checkers FileRebootChecker.RebootRequired:
// os.Stat only, the contents are not read; the path is its
// --reboot-sentinel, default /var/run/reboot-required, which its DaemonSet
// reads from the host's /var/run mounted at /sentinel); where it does, it
// takes its lock (an annotation on its DaemonSet, --concurrency nodes at
// once), cordons and drains the node, and reboots it (rebootAsRequired in
// cmd/kured/main.go). /var/run is /run, a tmpfs: the file goes with the
// reboot, so kured does not reboot twice. The agent resumes the change
// after the boot from its journal, as after any reboot.

// sentinelFirstLine opens the file as Debian's update-notifier writes it,
// so that the login banner says the same.
const sentinelFirstLine = "*** System restart required ***"

// sentinelTag starts the line that says the agent wrote the file, for
// which change, on which boot.
const sentinelTag = "mig-agent:"

// SentinelRebooter writes kured's reboot sentinel (--reboot-method kured).
type SentinelRebooter struct {
	// Path is kured's --reboot-sentinel on the host.
	Path string
	// BootID names the current boot.
	BootID func() string
	Log    *slog.Logger
}

// Reboot creates the sentinel (atomically: kured never sees half a file),
// naming the change and this boot. It returns once the file is there;
// kured reboots when its lock and its window allow.
func (r *SentinelRebooter) Reboot(_ context.Context, reason string) error {
	body := fmt.Sprintf("%s\n%s %s; boot %s\n", sentinelFirstLine, sentinelTag, strings.ReplaceAll(reason, "\n", " "), r.BootID())
	tmp, err := os.CreateTemp(filepath.Dir(r.Path), ".mig-agent-reboot-*")
	if err != nil {
		return fmt.Errorf("writing kured's reboot sentinel %s: %w", r.Path, err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename
	if _, err := tmp.WriteString(body); err != nil {
		tmp.Close()
		return fmt.Errorf("writing kured's reboot sentinel %s: %w", r.Path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("writing kured's reboot sentinel %s: %w", r.Path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing kured's reboot sentinel %s: %w", r.Path, err)
	}
	if err := os.Rename(tmp.Name(), r.Path); err != nil {
		return fmt.Errorf("writing kured's reboot sentinel %s: %w", r.Path, err)
	}
	r.Log.Info("reboot asked of kured: sentinel written", "sentinel", r.Path, "reason", reason)
	return nil
}

// ClearStale removes a sentinel the agent wrote on an earlier boot: the
// reboot it asked for happened. (On a host whose /var/run survives a
// reboot, kured would otherwise reboot the node again at its next check.)
// A sentinel someone else wrote, or one of this boot, stays.
func (r *SentinelRebooter) ClearStale() {
	data, err := os.ReadFile(r.Path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		r.Log.Warn("kured's reboot sentinel cannot be read", "sentinel", r.Path, "err", err)
		return
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	last := lines[len(lines)-1]
	if len(lines) != 2 || lines[0] != sentinelFirstLine || !strings.HasPrefix(last, sentinelTag) {
		return // someone else's
	}
	if boot := last[strings.LastIndex(last, "; boot ")+len("; boot "):]; strings.Contains(last, "; boot ") && boot == r.BootID() {
		return // this boot's: kured has not rebooted yet
	}
	if err := os.Remove(r.Path); err != nil {
		r.Log.Warn("removing the reboot sentinel of an earlier boot failed", "sentinel", r.Path, "err", err)
		return
	}
	r.Log.Info("removed the reboot sentinel written on an earlier boot: the reboot happened", "sentinel", r.Path)
}
