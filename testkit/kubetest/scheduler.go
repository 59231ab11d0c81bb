package kubetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The real kube-scheduler and a second kube-controller-manager, started for
// one test against the test's API server. Both are built by
// hack/kube-apiserver.sh from the same k8s.io/kubernetes module and version
// as kube-apiserver, and cached beside it.

// SchedulerName is the one profile of the scheduler StartScheduler runs.
// Only pods whose spec.schedulerName says it are scheduled by it: the
// other tests' pods (default-scheduler) are bound by the harness's own pod
// loops, and this scheduler leaves them alone (kubernetes
// pkg/scheduler/eventhandlers.go responsibleForPod: a pod is handled only
// by the profile named in its spec.schedulerName).
const SchedulerName = "mig-agent-test-scheduler"

// schedulerConfig is the KubeSchedulerConfiguration: one profile of its own
// name (default plugins, so DynamicResources is on: DRA is GA and locked on
// in 1.37), no leader election, the test's kubeconfig.
const schedulerConfig = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
leaderElection:
  leaderElect: false
profiles:
- schedulerName: %s
`

// SchedulerConfig is the KubeSchedulerConfiguration of the scheduler
// StartScheduler runs, against the API server of kubeconfig: for a program
// (hack/plannerbench) that runs the same scheduler outside a test.
func SchedulerConfig(kubeconfig string) string {
	return fmt.Sprintf(schedulerConfig, kubeconfig, SchedulerName)
}

// stopGrace is how long a server started here has to end after SIGTERM.
const stopGrace = 15 * time.Second

// kubeBinary builds (or finds cached) the harness binary named by option
// ("--with-scheduler", "--with-controller-manager") through the harness
// script, and returns its path: the last line `build` prints.
func kubeBinary(t testing.TB, option string) string {
	t.Helper()
	script, err := FindScript()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", script, "build", option)
	cmd.Stderr = os.Stderr // build progress
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s build %s: %v", Script, option, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if lines[len(lines)-1] == "" {
		t.Fatalf("%s build %s printed no path", Script, option)
	}
	return lines[len(lines)-1]
}

// StartScheduler runs the real kube-scheduler with the single profile
// SchedulerName against the test's API server until the test ends. Its
// log is dir/kube-scheduler.log under the test's temp dir, shown when the
// test fails.
func StartScheduler(t testing.TB) {
	t.Helper()
	skipIfDisabled(t)
	bin := kubeBinary(t, "--with-scheduler")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "scheduler.yaml")
	if err := os.WriteFile(cfg, []byte(SchedulerConfig(Kubeconfig())), 0o600); err != nil {
		t.Fatal(err)
	}
	// --secure-port 0: no serving (and so no delegated authn/authz).
	startServer(t, dir, "kube-scheduler", bin, "--config", cfg, "--secure-port", "0", "--leader-elect=false")
}

// StartControllers runs a kube-controller-manager of its own with only
// these controllers (e.g. "resourceclaim-controller") against the test's
// API server until the test ends; the one Main started keeps running
// Controllers. They act on the whole server, so the package's other
// tests must not run beside that test (none of the packages here runs
// tests in parallel).
func StartControllers(t testing.TB, controllers string) {
	t.Helper()
	skipIfDisabled(t)
	bin := kubeBinary(t, "--with-controller-manager")
	startServer(t, t.TempDir(), "kube-controller-manager", bin, "--kubeconfig", Kubeconfig(),
		"--controllers", controllers, "--leader-elect=false", "--secure-port", "0",
		"--use-service-account-credentials=false")
}

// startServer starts bin with args, its output in dir/name.log, checks that
// it is still running a second later, and stops it (SIGTERM, then SIGKILL
// after stopGrace) when the test ends.
func startServer(t testing.TB, dir, name, bin string, args ...string) {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(stopGrace):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logFile.Close()
		if t.Failed() {
			showLog(t, name, logPath)
		}
	})
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		showLog(t, name, logPath)
		t.Fatalf("%s exited at start: %v", name, err)
	case <-time.After(time.Second):
	}
	t.Logf("%s running (pid %d), log %s", name, cmd.Process.Pid, logPath)
}

// showLog logs the last lines of a server's log.
func showLog(t testing.TB, name, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	t.Logf("---- last lines of %s log:\n%s", name, strings.Join(lines, "\n"))
}
