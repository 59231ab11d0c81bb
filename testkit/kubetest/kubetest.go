// Package kubetest runs the project's integration tests against a real
// kube-apiserver backed by a real etcd, both started on loopback by
// hack/kube-apiserver.sh (built once from the Go module proxy and cached in
// ~/.cache/kube-test-apiserver), with kube-controller-manager running the
// DaemonSet controller. There is no kubelet: tests play the kubelet with
// Kubelet (PodResources over its real gRPC protocol, pod status, finishing
// evicted pods) and NVIDIA's device plugin with DevicePlugin. The real
// kube-scheduler runs only for a test that starts it (StartScheduler), and
// schedules only pods naming its profile (SchedulerName).
//
// A package uses it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }
//
// Main starts the server for the test binary (or reuses the one named by
// KUBE_TEST_STATE_DIR and KUBECONFIG, as `hack/kube-apiserver.sh run -- go
// test ...` exports them) and stops it afterwards. MIG_AGENT_SKIP_KUBE=1
// skips, visibly, every test that asks for the server; without it a server
// that cannot start fails the package.
//
// The server's coordinates live in the process environment (KUBECONFIG,
// KUBE_TEST_STATE_DIR), not in package variables.
package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Environment variables read and set by this package.
const (
	// EnvSkip set to 1 skips every test that needs the API server.
	EnvSkip = "MIG_AGENT_SKIP_KUBE"
	// EnvStateDir is the state dir of a running server (set by
	// `hack/kube-apiserver.sh run`, and by Main for the server it starts).
	EnvStateDir = "KUBE_TEST_STATE_DIR"
	// EnvKubeconfig is the admin kubeconfig of that server.
	EnvKubeconfig = "KUBECONFIG"
	// Controllers are the kube-controller-manager controllers Main runs.
	Controllers = "daemonset-controller"
	// Script is the harness script, relative to the module root.
	Script = "hack/kube-apiserver.sh"
)

// Main starts etcd and kube-apiserver for the test binary, runs the tests and
// stops the servers. Use it as os.Exit(kubetest.Main(m)) in TestMain. The
// first use builds the binaries (minutes; progress on stderr).
func Main(m *testing.M) int {
	if os.Getenv(EnvSkip) == "1" {
		fmt.Fprintf(os.Stderr, "kubetest: %s=1: tests that need a real kube-apiserver are skipped\n", EnvSkip)
		return m.Run()
	}
	if os.Getenv(EnvStateDir) != "" && os.Getenv(EnvKubeconfig) != "" {
		return m.Run() // a server is already running (hack/kube-apiserver.sh run)
	}
	script, err := FindScript()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubetest: FAIL: %v (set %s=1 to skip these tests)\n", err, EnvSkip)
		return 1
	}
	start := time.Now()
	// The DaemonSet controller is the real one: DevicePlugin's pods come
	// and go as it decides (deploy labels, evictions, taints).
	cmd := exec.Command("bash", script, "start", "--owner-pid", strconv.Itoa(os.Getpid()),
		"--with-controller-manager="+Controllers)
	cmd.Stderr = os.Stderr // build progress and errors
	out, err := cmd.Output()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubetest: FAIL: cannot start kube-apiserver with %s: %v (set %s=1 to skip these tests)\n", script, err, EnvSkip)
		return 1
	}
	kubeconfig := strings.TrimSpace(string(out))
	stateDir := filepath.Dir(kubeconfig)
	defer func() {
		stop := exec.Command("bash", script, "stop", stateDir)
		stop.Stderr = os.Stderr
		if err := stop.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "kubetest: stopping the servers in %s: %v\n", stateDir, err)
		}
	}()
	if err := setenv(kubeconfig, stateDir); err != nil {
		fmt.Fprintf(os.Stderr, "kubetest: FAIL: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "kubetest: kube-apiserver up after %s\n", time.Since(start).Round(time.Millisecond))
	rc := m.Run()
	if rc != 0 {
		// The controller manager's log goes with the state dir; a failed run
		// keeps its last warnings, where a DaemonSet that did not act says why.
		showTail(filepath.Join(stateDir, "kube-controller-manager.log"), 80)
	}
	return rc
}

// showTail copies the last n lines but klog's info lines of path to stderr.
func showTail(path string, n int) {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubetest: %v\n", err)
		return
	}
	lines := slices.DeleteFunc(strings.Split(strings.TrimRight(string(b), "\n"), "\n"), func(l string) bool { return strings.HasPrefix(l, "I") })
	lines = lines[max(0, len(lines)-n):]
	fmt.Fprintf(os.Stderr, "kubetest: ---- last %d lines of %s:\n%s\n", len(lines), path, strings.Join(lines, "\n"))
}

func setenv(kubeconfig, stateDir string) error {
	for k, v := range map[string]string{EnvKubeconfig: kubeconfig, EnvStateDir: stateDir} {
		if err := os.Setenv(k, v); err != nil {
			return fmt.Errorf("setenv %s: %w", k, err)
		}
	}
	return nil
}

// FindScript returns the absolute path of hack/kube-apiserver.sh, found by
// walking up from the working directory to the directory holding go.mod.
func FindScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, Script)
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("module root %s has no %s: %w", dir, Script, err)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory, so no " + Script)
		}
		dir = parent
	}
}

// skipIfDisabled skips t when the API server is switched off, and fails it
// when Main was not used.
func skipIfDisabled(t testing.TB) {
	t.Helper()
	if os.Getenv(EnvSkip) == "1" {
		t.Skipf("%s=1: this test needs a real kube-apiserver", EnvSkip)
	}
	if os.Getenv(EnvKubeconfig) == "" || os.Getenv(EnvStateDir) == "" {
		t.Fatalf("no kube-apiserver: call kubetest.Main from TestMain (or run under %s run)", Script)
	}
}

// Kubeconfig returns the admin kubeconfig path of the running server, or ""
// when there is none.
func Kubeconfig() string {
	if os.Getenv(EnvStateDir) == "" {
		return ""
	}
	return os.Getenv(EnvKubeconfig)
}

// StateDir returns the server's state dir (logs, pids, certificates).
func StateDir() string { return os.Getenv(EnvStateDir) }

// RestConfig returns a fresh admin rest.Config for the server; it skips t
// when the server is switched off.
func RestConfig(t testing.TB) *rest.Config {
	t.Helper()
	skipIfDisabled(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", Kubeconfig())
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", Kubeconfig(), err)
	}
	cfg.QPS, cfg.Burst = 200, 400 // tests are bursty; the server is ours
	cfg.UserAgent = "kubetest/" + t.Name()
	return cfg
}

// Client returns an admin clientset for the server.
func Client(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(RestConfig(t))
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	return c
}

// NewName returns a DNS-1123 label unique to this call: prefix, a trace of
// the test's name, and a random suffix; at most 63 characters.
func NewName(t testing.TB, prefix string) string {
	t.Helper()
	var b strings.Builder
	for _, r := range strings.ToLower(t.Name()) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	trace := strings.Trim(strings.TrimPrefix(b.String(), "test"), "-")
	for strings.Contains(trace, "--") {
		trace = strings.ReplaceAll(trace, "--", "-")
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	sb := make([]byte, 5)
	for i := range sb {
		sb[i] = alphabet[rand.IntN(len(alphabet))]
	}
	suffix := string(sb)
	keep := 63 - len(prefix) - len(suffix) - 2
	if keep < 0 {
		t.Fatalf("NewName: prefix %q is too long", prefix)
	}
	if len(trace) > keep {
		trace = strings.Trim(trace[:keep], "-")
	}
	parts := []string{}
	for _, p := range []string{prefix, trace, suffix} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "-")
}

// readyz polls GET /readyz until it says ok or the timeout passes.
func readyz(ctx context.Context, cfg *rest.Config, timeout time.Duration) error {
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		body, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && bytes.Equal(bytes.TrimSpace(body), []byte("ok")) {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("/readyz not ok within %s: %w (last: %v)", timeout, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
