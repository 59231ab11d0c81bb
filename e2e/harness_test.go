package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// binary is the mig-agent binary under test, built once by TestMain.
func binary() string { return os.Getenv("MIG_AGENT_E2E_BIN") }

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if binary() == "" {
		dir, err := os.MkdirTemp("", "mig-agent-e2e-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bin := filepath.Join(dir, "mig-agent")
		// With the crash test hook (TestCrashMatrix); a production build has none.
		build := exec.Command("go", "build", "-tags", reconcile.TestHooksTag, "-o", bin, "../cmd/mig-agent")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building mig-agent:", err)
			return 1
		}
		os.Setenv("MIG_AGENT_E2E_BIN", bin)
	}
	return kubetest.Main(m)
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Agent is one running mig-agent process.
type Agent struct {
	t       testing.TB
	Args    []string
	cmd     *exec.Cmd
	log     *syncBuffer
	done    chan struct{}
	err     error
	Metrics string // http://127.0.0.1:PORT
}

// Opts describes an agent for a node.
type Opts struct {
	Node       string
	Sim        string // "h200x8"
	SimState   string // default: t.TempDir()/sim.json
	StateDir   string // default: t.TempDir()/state
	Namespace  string // default: mig-agent-e2e (created)
	Kubeconfig string // default: the admin kubeconfig
	Extra      []string
	// Wrapper, when set, is a command line the binary and its arguments
	// are appended to (e.g. unshare, to run it in a mount namespace).
	Wrapper []string
	// Library, when set, is the simulator built as libnvidia-ml.so.1
	// (simlibtest.Library): the agent runs its production NVML path,
	// --nvml real --nvml-library, over Sim and SimState.
	Library string
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Fill sets defaults of o in place and returns it.
func (o *Opts) Fill(t testing.TB) *Opts {
	dir := t.TempDir()
	if o.Sim == "" {
		o.Sim = "h200x8"
	}
	if o.SimState == "" {
		o.SimState = filepath.Join(dir, "sim.json")
	}
	if o.StateDir == "" {
		o.StateDir = filepath.Join(dir, "state")
	}
	if o.Namespace == "" {
		o.Namespace = "mig-agent-e2e"
		ensureNamespace(t, o.Namespace)
	}
	if o.Kubeconfig == "" {
		o.Kubeconfig = kubetest.Kubeconfig()
	}
	return o
}

func ensureNamespace(t testing.TB, ns string) {
	c := kubetest.Client(t)
	_, err := c.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	if err == nil {
		return
	}
	_, _ = c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
}

// StartAgent runs `mig-agent run` for o.Node; it is stopped (SIGTERM) at
// the end of the test. The default reboot method is none and the drift
// interval 1s.
func StartAgent(t testing.TB, o *Opts) *Agent {
	t.Helper()
	o.Fill(t)
	port := freePort(t)
	args := []string{"run", "--node-name", o.Node, "--kubeconfig", o.Kubeconfig, "--namespace", o.Namespace}
	args = append(args, o.nvmlArgs()...)
	args = append(args, "--state-dir", o.StateDir,
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", port), "--reboot-method", "none",
		"--drift-interval", "1s", "--eviction-retry-delay", "1s", "--resource-wait-timeout", "0",
		"--pod-resources-socket", filepath.Join(t.TempDir(), "no-kubelet.sock"))
	args = append(args, o.Extra...)
	a := newAgent(t, o.Wrapper, args, fmt.Sprintf("http://127.0.0.1:%d", port))
	if o.Library != "" {
		a.cmd.Env = append(a.cmd.Env, "MIG_AGENT_SIM="+o.Sim, "MIG_AGENT_SIM_STATE="+o.SimState, "MIG_AGENT_SIM_QUIET=1")
	}
	return a.start()
}

// nvmlArgs selects the agent's NVML: the in-process simulator, or the
// production path over the simulator built as a library.
func (o *Opts) nvmlArgs() []string {
	if o.Library != "" {
		return []string{"--nvml", "real", "--nvml-library", o.Library}
	}
	return []string{"--nvml", "sim:" + o.Sim, "--sim-state", o.SimState}
}

// StartCommand runs the binary with args in the background.
func startProcess(t testing.TB, args []string, metrics string) *Agent {
	return startWrapped(t, nil, args, metrics)
}

// startWrapped is startProcess with the binary run through wrapper.
func startWrapped(t testing.TB, wrapper, args []string, metrics string) *Agent {
	return newAgent(t, wrapper, args, metrics).start()
}

// newAgent prepares the process; start starts it.
func newAgent(t testing.TB, wrapper, args []string, metrics string) *Agent {
	a := &Agent{t: t, Args: args, log: &syncBuffer{}, done: make(chan struct{}), Metrics: metrics}
	argv := append(append(append([]string{}, wrapper...), binary()), args...)
	a.cmd = exec.Command(argv[0], argv[1:]...)
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	a.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET=")
	return a
}

func (a *Agent) start() *Agent {
	t, args := a.t, a.Args
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

// Log returns what the process printed so far.
func (a *Agent) Log() string { return a.log.String() }

// Stop sends SIGTERM and waits (10s, then SIGKILL); it returns the exit code.
func (a *Agent) Stop() int {
	select {
	case <-a.done:
		return a.ExitCode()
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
	}
	return a.ExitCode()
}

// Kill sends SIGKILL and waits.
func (a *Agent) Kill() {
	_ = a.cmd.Process.Kill()
	<-a.done
}

// Wait waits for the process to exit by itself.
func (a *Agent) Wait(timeout time.Duration) (int, bool) {
	select {
	case <-a.done:
		return a.ExitCode(), true
	case <-time.After(timeout):
		return -1, false
	}
}

// ExitCode of an exited process.
func (a *Agent) ExitCode() int {
	if a.cmd.ProcessState == nil {
		return -1
	}
	return a.cmd.ProcessState.ExitCode()
}

// Scrape returns the /metrics text.
func (a *Agent) Scrape(t testing.TB) string {
	resp, err := http.Get(a.Metrics + "/metrics")
	if err != nil {
		t.Fatalf("scraping %s: %v", a.Metrics, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// SetLabel sets a node label as fieldManager through server-side apply (so
// the Node's managedFields name the manager), or with value "" removes it.
func SetLabel(t testing.TB, c kubernetes.Interface, node, key, value, fieldManager string) {
	t.Helper()
	if fieldManager == "" {
		fieldManager = "e2e-test"
	}
	var err error
	if value == "" {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: nil}}})
		_, err = c.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	} else {
		patch, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": node, "labels": map[string]any{key: value}}})
		_, err = c.CoreV1().Nodes().Patch(context.Background(), node, types.ApplyPatchType, patch,
			metav1.PatchOptions{FieldManager: fieldManager, Force: ptr.To(true)})
	}
	if err != nil {
		t.Fatalf("labelling %s %s=%s: %v", node, key, value, err)
	}
}

// SelectConfig sets nvidia.com/mig.config.
func SelectConfig(t testing.TB, c kubernetes.Interface, node, config string) {
	SetLabel(t, c, node, record.LabelConfig, config, "")
}

// WaitFor polls cond every 50ms until it holds or timeout passes.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", timeout, what)
}

// GetNode reads a node.
func GetNode(t testing.TB, c kubernetes.Interface, node string) *corev1.Node {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// WaitState waits until the state label is state and, when config is not
// empty, the last-change record is for config with a result matching the
// state; it returns that record.
func WaitState(t testing.TB, c kubernetes.Interface, node, state, config string, timeout time.Duration) record.ChangeRecord {
	t.Helper()
	var rec record.ChangeRecord
	WaitFor(t, timeout, fmt.Sprintf("node %s state %s for %q", node, state, config), func() bool {
		n := GetNode(t, c, node)
		if n.Labels[record.LabelState] != state {
			return false
		}
		if config == "" {
			return true
		}
		rec = LastChange(t, n)
		return rec.Config == config && (state == record.StatePending || rec.Result == state)
	})
	return rec
}

// LastChange parses migagent.io/last-change.
func LastChange(t testing.TB, n *corev1.Node) record.ChangeRecord {
	var rec record.ChangeRecord
	if raw := n.Annotations[record.AnnotationLastChange]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
			t.Fatalf("last-change annotation: %v", err)
		}
	}
	return rec
}

// NodeHistory parses migagent.io/history: the newest few records, light.
func NodeHistory(t testing.TB, n *corev1.Node) []record.ChangeRecord {
	var recs []record.ChangeRecord
	if raw := n.Annotations[record.AnnotationHistory]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &recs); err != nil {
			t.Fatalf("history annotation: %v", err)
		}
	}
	return recs
}

// History is n's history as n holds it, newest first, with every record
// whole: from the ConfigMap <node>-mig-history (in whichever namespace its
// agent runs) from the record at the head of n's history on, as
// `mig-agent status` reads it; the Node's own entries where no ConfigMap
// holds that record.
func History(t testing.TB, n *corev1.Node) []record.ChangeRecord {
	t.Helper()
	onNode := NodeHistory(t, n)
	if len(onNode) == 0 {
		return onNode
	}
	list, err := kubetest.Client(t).CoreV1().ConfigMaps("").List(context.Background(),
		metav1.ListOptions{LabelSelector: record.LabelNode + "=" + n.Name})
	if err != nil {
		t.Fatalf("history ConfigMaps of %s: %v", n.Name, err)
	}
	head := onNode[0]
	for _, cm := range list.Items {
		if cm.Name != record.HistoryConfigMapName(n.Name) {
			continue
		}
		whole, _, err := record.DecodeHistory(cm.Data[record.HistoryConfigMapKey])
		if err != nil {
			continue
		}
		for i, r := range whole {
			if r.Config == head.Config && r.Result == head.Result && r.StartedAt.Equal(head.StartedAt) && r.FinishedAt.Equal(head.FinishedAt) {
				return whole[i:]
			}
		}
	}
	return onNode
}

// WholeHistory is node's whole history, newest first, from its ConfigMap
// <node>-mig-history in namespace (none when it does not exist).
func WholeHistory(t testing.TB, c kubernetes.Interface, namespace, node string) []record.ChangeRecord {
	t.Helper()
	cm, err := c.CoreV1().ConfigMaps(namespace).Get(context.Background(), record.HistoryConfigMapName(node), metav1.GetOptions{})
	if err != nil {
		return nil
	}
	recs, bad, err := record.DecodeHistory(cm.Data[record.HistoryConfigMapKey])
	if err != nil || len(bad) > 0 {
		t.Fatalf("history ConfigMap of %s: %v %v", node, err, bad)
	}
	return recs
}

// RunCLI runs the binary to completion and returns its stdout and exit code.
func RunCLI(t testing.TB, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary(), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}
