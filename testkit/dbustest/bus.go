// Package dbustest runs a real dbus-daemon for tests, with stand-in
// org.freedesktop.login1 and org.freedesktop.systemd1 services written in Go
// on it, so that the reboot and unit-control paths of mig-agent talk real
// D-Bus (authentication, name ownership, signals, UNIX fd passing) in unit
// tests and in scenario tests that run the real binary with --dbus-address.
//
// A test that needs the bus fails when dbus-daemon is missing (install it
// with hack/ensure-dbus.sh) unless MIG_AGENT_SKIP_DBUS=1 is set, in which
// case it is skipped.
package dbustest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
)

// SkipEnv, set to "1", skips tests that need dbus-daemon instead of failing them.
const SkipEnv = "MIG_AGENT_SKIP_DBUS"

// DaemonEnv names a dbus-daemon binary to use instead of the one on $PATH.
const DaemonEnv = "MIG_AGENT_DBUS_DAEMON"

// startTimeout bounds how long the daemon may take to print its address.
const startTimeout = 15 * time.Second

// Bus is a private dbus-daemon started for one test.
type Bus struct {
	// Address is the bus address the daemon printed
	// ("unix:path=/tmp/.../bus,guid=..."): pass it to dbus.Connect or to
	// mig-agent's --dbus-address.
	Address string
	// Dir is the temporary directory holding the socket and the config.
	Dir string
}

// configTemplate is a session-bus-like configuration: one unix socket,
// EXTERNAL authentication, and a policy that lets every local user own any
// name and call anything (the stand-in services and the agent run as the
// test's user, or as a child process of it).
const configTemplate = `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path=%s</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
  </policy>
</busconfig>
`

// DaemonPath finds dbus-daemon: $MIG_AGENT_DBUS_DAEMON, then $PATH, then
// /usr/bin/dbus-daemon.
func DaemonPath() (string, error) {
	if p := os.Getenv(DaemonEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", DaemonEnv, p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("dbus-daemon"); err == nil {
		return p, nil
	}
	const fallback = "/usr/bin/dbus-daemon"
	if _, err := os.Stat(fallback); err == nil {
		return fallback, nil
	}
	return "", errors.New("dbus-daemon not found on $PATH nor at /usr/bin/dbus-daemon")
}

// Start runs a private dbus-daemon in a temporary directory and stops it when
// the test ends. It fails the test when dbus-daemon is missing, or skips it
// when MIG_AGENT_SKIP_DBUS=1.
func Start(t testing.TB) *Bus {
	t.Helper()
	if os.Getenv(SkipEnv) == "1" {
		t.Skipf("%s=1: skipping a test that needs dbus-daemon", SkipEnv)
	}
	daemon, err := DaemonPath()
	if err != nil {
		t.Fatalf("dbustest: %v; install it with hack/ensure-dbus.sh, or set %s=1 to skip tests that need it", err, SkipEnv)
	}
	dir := shortTempDir(t)
	socket := filepath.Join(dir, "bus")
	config := filepath.Join(dir, "bus.conf")
	if err := os.WriteFile(config, fmt.Appendf(nil, configTemplate, escapeAddressValue(socket)), 0o600); err != nil {
		t.Fatalf("dbustest: write config: %v", err)
	}

	cmd := exec.Command(daemon, "--config-file="+config, "--nofork", "--print-address")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("dbustest: %v", err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("dbustest: start %s: %v", daemon, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}

	addr := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		line, _ := r.ReadString('\n')
		addr <- strings.TrimSpace(line)
		// Keep draining so the daemon never blocks on a full pipe.
		_, _ = r.WriteTo(io.Discard)
	}()
	var address string
	select {
	case address = <-addr:
	case err := <-exited:
		t.Fatalf("dbustest: %s exited before printing its address: %v; stderr: %s", daemon, err, stderr.String())
	case <-time.After(startTimeout):
		stop()
		t.Fatalf("dbustest: %s printed no address within %s; stderr: %s", daemon, startTimeout, stderr.String())
	}
	if address == "" {
		stop()
		t.Fatalf("dbustest: %s printed an empty address; stderr: %s", daemon, stderr.String())
	}
	t.Cleanup(func() {
		stop()
		if s := stderr.String(); s != "" && t.Failed() {
			t.Logf("dbus-daemon stderr: %s", s)
		}
	})
	return &Bus{Address: address, Dir: dir}
}

// Connect opens a client connection (authenticated, Hello sent) to the bus,
// closed when the test ends.
func (b *Bus) Connect(t testing.TB) *dbus.Conn {
	t.Helper()
	conn, err := dbus.Connect(b.Address)
	if err != nil {
		t.Fatalf("dbustest: connect to %s: %v", b.Address, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// shortTempDir is t.TempDir unless that path is too long for a unix socket
// (108 bytes on Linux), in which case a shorter one under /tmp is used.
func shortTempDir(t testing.TB) string {
	dir := t.TempDir()
	if len(dir)+len("/bus") < 100 {
		return dir
	}
	dir, err := os.MkdirTemp("/tmp", "dbustest")
	if err != nil {
		t.Fatalf("dbustest: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// escapeAddressValue writes a value of a D-Bus address the way the
// specification asks: bytes outside [-0-9A-Za-z_/.\*] as %XX. (Test names
// with commas or colons end up in temporary paths.) The result needs no XML
// escaping either.
func escapeAddressValue(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("-_/.\\*", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02x", c)
		}
	}
	return b.String()
}

// claimName connects to the bus and takes name as its primary owner.
func claimName(ctx context.Context, address, name string, opts ...dbus.ConnOption) (*dbus.Conn, error) {
	conn, err := dbus.Connect(address, append(opts, dbus.WithContext(ctx))...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", address, err)
	}
	reply, err := conn.RequestName(name, dbus.NameFlagDoNotQueue)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("request name %s: %w", name, err)
	}
	if reply != dbus.RequestNameReplyPrimaryOwner {
		_ = conn.Close()
		return nil, fmt.Errorf("request name %s: not the primary owner (reply %d)", name, reply)
	}
	return conn, nil
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
