package e2e

// Issue 5, standalone mode: `mig-agent run --standalone` applies the
// selected config with no Kubernetes at all, holds it across reboots, and
// reports to systemd over a real NOTIFY_SOCKET.

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// saNotify is a NOTIFY_SOCKET: a unixgram socket that collects every
// sd_notify datagram, as systemd does for a Type=notify service.
type saNotify struct {
	Path string
	mu   sync.Mutex
	msgs []string
}

func saListenNotify(t testing.TB) *saNotify {
	t.Helper()
	dir, err := os.MkdirTemp("", "notify-") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	n := &saNotify{Path: filepath.Join(dir, "notify.sock")}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.Path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			k, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, strings.Split(strings.TrimSpace(string(buf[:k])), "\n")...)
			n.mu.Unlock()
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return n
}

// Lines returns every notification line received, in order.
func (n *saNotify) Lines() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.msgs)
}

func (n *saNotify) index(line string) int {
	return slices.IndexFunc(n.Lines(), func(l string) bool { return strings.HasPrefix(l, line) })
}

// saStart runs `mig-agent run --standalone ...` with NOTIFY_SOCKET set (the
// harness clears it for the Kubernetes-mode agents).
func saStart(t testing.TB, args []string, notify *saNotify, env ...string) *Agent {
	t.Helper()
	port := freePort(t)
	metrics := fmt.Sprintf("127.0.0.1:%d", port)
	args = append(slices.Clone(args), "--metrics-address", metrics)
	a := &Agent{t: t, Args: args, log: &syncBuffer{}, done: make(chan struct{}), Metrics: "http://" + metrics}
	a.cmd = exec.Command(binary(), args...)
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	a.cmd.Env = append(append(os.Environ(), "NOTIFY_SOCKET="+notify.Path, "WATCHDOG_USEC=", "WATCHDOG_PID="), env...)
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.err = a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		a.Stop()
		if t.Failed() {
			t.Logf("mig-agent %s log:\n%s", strings.Join(args, " "), a.log.String())
		}
	})
	return a
}

// saExport returns `mig-agent export -o json` of the state file, each
// entry as "devices=[…] mig=true 1g.18gb=2,…" (profiles sorted).
func saExport(t testing.TB, spec, state string) string {
	t.Helper()
	out, errOut, code := RunCLI(t, "export", "-o", "json", "--nvml", "sim:"+spec, "--sim-state", state, "--log-level", "error")
	if code != 0 {
		t.Fatalf("export: %d %s", code, errOut)
	}
	var doc struct {
		Configs map[string][]struct {
			Devices    any            `json:"devices"`
			MigEnabled bool           `json:"mig-enabled"`
			MigDevices map[string]int `json:"mig-devices"`
		} `json:"mig-configs"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("export -o json: %v\n%s", err, out)
	}
	var entries []string
	for _, e := range doc.Configs["current"] {
		var devs []string
		for k, v := range e.MigDevices {
			devs = append(devs, fmt.Sprintf("%s=%d", k, v))
		}
		slices.Sort(devs)
		entries = append(entries, fmt.Sprintf("devices=%v mig=%v %s", e.Devices, e.MigEnabled, strings.Join(devs, ",")))
	}
	return strings.Join(entries, "; ")
}

const saWant = "devices=[0 1] mig=true 1g.18gb=2,2g.35gb=1,3g.71gb=1"

// C: applies at start, says READY only then, holds the geometry across a
// reboot (re-applied at the next start), and serves metrics with no API
// server anywhere.
func TestStandaloneAppliesAndHoldsAcrossReboot(t *testing.T) {
	dir := t.TempDir()
	state, stateDir := filepath.Join(dir, "sim.json"), filepath.Join(dir, "state")
	cfg := disConfig(t, `version: v1
mig-configs:
  inference:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.18gb": 2
        "2g.35gb": 1
        "3g.71gb": 1
`)
	args := []string{"run", "--standalone", "-f", cfg, "-c", "inference", "--nvml", "sim:h200x2",
		"--sim-state", state, "--state-dir", stateDir, "--reboot-method", "none", "--drift-interval", "1s",
		"--kubeconfig", "/nonexistent/kubeconfig"}
	notify := saListenNotify(t)
	start := time.Now()
	// systemd's WatchdogSec=1s: the agent pings every half of it.
	a := saStart(t, args, notify, "WATCHDOG_USEC=1000000")
	WaitFor(t, 20*time.Second, "READY=1", func() bool { return notify.index("READY=1") >= 0 })
	ready := time.Since(start)
	// READY comes after the geometry is in place: what systemd orders the
	// kubelet after.
	if got := saExport(t, "h200x2", state); got != saWant {
		t.Fatalf("geometry at READY=1:\n%s\nwant:\n%s", got, saWant)
	}
	applied := notify.index("STATUS=config inference applied")
	if r := notify.index("READY=1"); applied < 0 || applied > r {
		t.Errorf("notifications: %q (want STATUS applied before READY)", notify.Lines())
	}
	WaitFor(t, 5*time.Second, "two watchdog pings", func() bool {
		return strings.Count(strings.Join(notify.Lines(), "\n"), "WATCHDOG=1") >= 2
	})
	m := a.Scrape(t)
	for _, want := range []string{`migagent_state{state="success"} 1`, `migagent_applied_config_info{config="inference"`,
		`migagent_reconfigurations_total{result="success"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	t.Logf("standalone: READY=1 %s after start, geometry applied; notifications %q", ready.Round(time.Millisecond), notify.Lines())
	if code := a.Stop(); code != 0 {
		t.Errorf("exit %d on SIGTERM", code)
	}
	if notify.index("STOPPING=1") < 0 {
		t.Errorf("no STOPPING=1: %q", notify.Lines())
	}

	// A restart without a reboot changes nothing.
	a = saStart(t, args, notify)
	WaitFor(t, 20*time.Second, "a second READY=1", func() bool { return strings.Count(strings.Join(notify.Lines(), "\n"), "READY=1") == 2 })
	if strings.Contains(a.Log(), "applying") {
		t.Error("a restart on the applied geometry touched a GPU")
	}
	a.Stop()

	// The machine reboots: every instance is gone; the next start re-applies.
	if _, errOut, code := RunCLI(t, "sim", "reboot", "--sim-state", state); code != 0 {
		t.Fatalf("sim reboot: %d %s", code, errOut)
	}
	for _, g := range disProfiles(t, "h200x2", state) {
		if len(g.Instances) != 0 {
			t.Fatalf("GPU %d kept %d instances through the reboot", g.Index, len(g.Instances))
		}
	}
	a = saStart(t, args, notify)
	WaitFor(t, 20*time.Second, "a third READY=1", func() bool { return strings.Count(strings.Join(notify.Lines(), "\n"), "READY=1") == 3 })
	if got := saExport(t, "h200x2", state); got != saWant {
		t.Errorf("geometry after the reboot:\n%s", got)
	}
	if !strings.Contains(a.Log(), `msg="mig config applied" config=inference`) {
		t.Error("no re-apply in the log")
	}
	if _, err := os.Stat(filepath.Join(stateDir, "journal.json")); err != nil {
		t.Errorf("journal: %v", err)
	}
}

// C: a config that needs a reboot (Ampere, no reset) makes the standalone
// agent reboot once (sim: exit 0) and finish after it, with no API server.
func TestStandaloneRebootOnceAndFinish(t *testing.T) {
	dir := t.TempDir()
	state, stateDir := filepath.Join(dir, "sim.json"), filepath.Join(dir, "state")
	args := []string{"run", "--standalone", "-c", "all-1g.5gb", "--nvml", "sim:a100-40gbx2", "--sim-no-reset",
		"--sim-state", state, "--state-dir", stateDir, "--reboot-method", "sim", "--drift-interval", "0"}
	notify := saListenNotify(t)
	a := saStart(t, args, notify)
	if code, exited := a.Wait(20 * time.Second); !exited || code != 0 {
		t.Fatalf("no simulated reboot: exited %v code %d", exited, code)
	}
	if notify.index("READY=1") >= 0 {
		t.Errorf("READY=1 before the reboot the geometry needed: %q", notify.Lines())
	}
	a = saStart(t, args, notify)
	WaitFor(t, 20*time.Second, "READY=1 after the reboot", func() bool { return notify.index("READY=1") >= 0 })
	if b := rbReadSim(t, state).bootCount(); b != 1 {
		t.Errorf("boot count %d", b)
	}
	for _, g := range disProfiles(t, "a100-40gbx2", state) {
		if !g.MigMode.Current || len(g.Instances) != 7 {
			t.Errorf("GPU %d: MIG %v, %d instances", g.Index, g.MigMode.Current, len(g.Instances))
		}
	}
	if v := rbMetric(a.Scrape(t), "migagent_reboots_total"); v != "1" {
		t.Errorf("migagent_reboots_total = %q", v)
	}
	if !strings.Contains(a.Log(), "reboot=true") {
		t.Errorf("the change record in the journal log does not say reboot=true")
	}
}

// C: the packaged unit is what a standalone host needs (Type=notify with a
// watchdog, before the kubelet, after the driver's services, restarted on
// failure) and passes `systemd-analyze verify` against this host's systemd
// units, with the binary in place; `systemd-analyze security` rates its
// hardening.
func TestStandaloneSystemdUnit(t *testing.T) {
	unit, err := os.ReadFile("../packaging/systemd/mig-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "WatchdogSec=", "Before=kubelet.service",
		"After=nvidia-persistenced.service nvidia-fabricmanager.service", "Wants=nvidia-persistenced.service nvidia-fabricmanager.service",
		"ExecStart=/usr/bin/mig-agent run --standalone --settings /etc/mig-agent/settings.yaml\n",
		"Restart=on-failure", "StateDirectory=mig-agent", "Conflicts=nvidia-mig-manager.service\n", "DeviceAllow=char-nvidia* rwm", "WantedBy=multi-user.target"} {
		if !strings.Contains(string(unit), "\n"+want) {
			t.Errorf("the unit lacks a line starting %q", want)
		}
	}
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the unit is not verified")
	}
	if _, err := os.Stat("/usr/lib/systemd/system/sysinit.target"); err != nil {
		t.Skip("no systemd units under /usr/lib/systemd/system to verify against")
	}
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "etc/systemd/system", "usr/lib/systemd"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/systemd/system/mig-agent.service"), unit, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "usr/bin/mig-agent")
	if err := os.Link(binary(), bin); err != nil {
		if out, err := exec.Command("cp", binary(), bin).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
	}
	if out, err := exec.Command("cp", "-a", "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	out, err := exec.Command(sa, "verify", "--root="+root, "mig-agent.service").CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	sec, err := exec.Command(sa, "security", "--offline=true", "--root="+root, "mig-agent.service").CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, sec)
	}
	var level float64
	for _, l := range strings.Split(string(sec), "\n") {
		if i := strings.Index(l, "Overall exposure level for mig-agent.service: "); i >= 0 {
			fmt.Sscanf(l[i+len("Overall exposure level for mig-agent.service: "):], "%g", &level)
		}
	}
	if level == 0 || level > 5 {
		t.Errorf("exposure level %.1f, want at most 5 (OK):\n%s", level, sec)
	}
	t.Logf("systemd-analyze verify: clean; security: exposure %.1f (systemd %s)", level, saVersion(sa))
}

func saVersion(sa string) string {
	out, _ := exec.Command(sa, "--version").Output()
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(first)
}
