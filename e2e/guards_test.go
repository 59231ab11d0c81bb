package e2e

// Issue 19, guards that hold when the agent itself is in trouble: one
// reboot per change across restarts and a lost journal, no journal no
// change, one agent per node, no right to record no change, records that
// always land, bounded reads of the files the user names.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/lease/nodelease"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// grReadyz returns the status code of the agent's /readyz (0: no answer).
func grReadyz(a *Agent) int {
	resp, err := http.Get(a.Metrics + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// grAlive fails the test when the agent exited (a simulated reboot exits 0).
func grAlive(t *testing.T, a *Agent, what string) {
	t.Helper()
	if code, exited := a.Wait(0); exited {
		t.Fatalf("%s: the agent exited (code %d): a reboot or a crash", what, code)
	}
}

// Item 1: three restarts after a failed post-reboot check leave one reboot,
// and so does a restart with the journal lost (the rebooting record on the
// Node counts); a new label value is a new change and may reboot once.
func TestGuardOneRebootAcrossRestarts(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Sim: "a100-40gbx1", Extra: []string{"--sim-no-reset", "--reboot-method", "sim"}}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.5gb")
	if code, exited := a.Wait(30 * time.Second); !exited || code != 0 {
		t.Fatalf("no simulated reboot (exited %v, code %d)", exited, code)
	}
	// The machine came back but the GPU did not take the new mode.
	stillPending := func() {
		sim := rbReadSim(t, o.SimState)
		sim.gpu(0)["migCurrent"], sim.gpu(0)["migPending"] = false, true
		sim.write(t, o.SimState)
	}
	stillPending()
	a2 := StartAgent(t, o)
	WaitState(t, c, node, record.StateFailed, "all-1g.5gb", 30*time.Second)
	grAlive(t, a2, "the failed post-reboot check")
	a2.Stop()

	restart := func(what string) {
		t.Helper()
		before := len(History(t, GetNode(t, c, node)))
		a := StartAgent(t, o)
		WaitFor(t, 30*time.Second, what+": a new record", func() bool {
			_, exited := a.Wait(0)
			return exited || len(History(t, GetNode(t, c, node))) > before
		})
		time.Sleep(time.Second) // a reboot would come right after the record
		grAlive(t, a, what)
		rec := LastChange(t, GetNode(t, c, node))
		if rec.Result != record.StateFailed || !strings.Contains(rec.Reason, "not rebooting again") {
			t.Errorf("%s: last record %s %q, want failed: not rebooting again", what, rec.Result, rec.Reason)
		}
		if b := rbReadSim(t, o.SimState).bootCount(); b != 1 {
			t.Fatalf("%s: boot count %d, want 1: a second reboot for one change", what, b)
		}
		a.Stop()
	}
	for i := range 3 {
		restart("restart " + string(rune('1'+i)))
	}
	// The journal is lost (a reinstall, a wiped state dir): the rebooting
	// record on the Node still says the reboot was made.
	if err := os.Remove(filepath.Join(o.StateDir, "journal.json")); err != nil {
		t.Fatal(err)
	}
	restart("restart without a journal")

	// A new value of the label is a new change: it may reboot once.
	a5 := StartAgent(t, o)
	SelectConfig(t, c, node, "all-2g.10gb")
	if code, exited := a5.Wait(30 * time.Second); !exited || code != 0 {
		t.Fatalf("a new label value did not get its reboot (exited %v, code %d)\n%s", exited, code, a5.Log())
	}
	if b := rbReadSim(t, o.SimState).bootCount(); b != 2 {
		t.Errorf("boot count %d after the new change's reboot, want 2", b)
	}
}

// Item 2: with the state dir read-only, nothing is touched: state failed
// with the reason, a Warning Event, the failed metric, /readyz not ready.
func TestGuardReadOnlyStateDir(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := (&Opts{Node: node, Sim: "h200x2"}).Fill(t)
	if err := os.MkdirAll(o.StateDir, 0o750); err != nil {
		t.Fatal(err)
	}
	// A read-only bind mount of the state dir in a private mount namespace:
	// read-only for root too, as a read-only file system is.
	o.Wrapper = []string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && shift && exec "$@"`, "sh", o.StateDir}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateFailed, "all-1g.18gb", 30*time.Second)
	if !strings.Contains(rec.Reason, "journal") || !strings.Contains(rec.Reason, "cannot be written") {
		t.Errorf("reason %q does not say the journal cannot be written", rec.Reason)
	}
	for _, g := range disProfiles(t, o.Sim, o.SimState) {
		if g.MigMode.Current || g.MigMode.Pending || len(g.Instances) != 0 {
			t.Errorf("GPU %d was touched: MIG %v/%v, %d instances", g.Index, g.MigMode.Current, g.MigMode.Pending, len(g.Instances))
		}
	}
	WaitFor(t, 10*time.Second, "a Warning Event "+record.ReasonJournal, func() bool {
		return len(nodeEvents(t, c, node, record.ReasonJournal)) > 0
	})
	if code := grReadyz(a); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz answered %d with an unwritable journal, want 503", code)
	}
	if m := a.Scrape(t); !strings.Contains(m, `migagent_state{state="failed"} 1`) {
		t.Errorf("migagent_state does not say failed:\n%s", grLines(m, "migagent_state{"))
	}
	if _, err := os.Stat(filepath.Join(o.StateDir, "journal.json")); !os.IsNotExist(err) {
		t.Errorf("a journal was written in the read-only state dir: %v", err)
	}
	grAlive(t, a, "read-only state dir")
}

// grLines returns the lines of text that start with prefix.
func grLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Item 3: one agent per node: a second one on the same state dir exits 1
// with a message that says so, and the first keeps running.
func TestGuardOneAgentPerStateDir(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Sim: "h200x1"}
	a := StartAgent(t, o)
	waitReady(t, a)
	b := StartAgent(t, o)
	code, exited := b.Wait(10 * time.Second)
	if !exited || code != 1 {
		t.Fatalf("the second agent: exited %v, code %d, want exit 1", exited, code)
	}
	if !strings.Contains(b.Log(), "another mig-agent is running") || !strings.Contains(b.Log(), o.StateDir) {
		t.Errorf("the second agent's message does not say why:\n%s", b.Log())
	}
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 30*time.Second)
	if n := len(History(t, GetNode(t, c, node))); n != 1 {
		t.Errorf("%d records for one label change, want 1", n)
	}
	grAlive(t, a, "the first agent")
}

// Item 3, Kubernetes mode: a second agent for the same node with another
// state dir (a DaemonSet beside a systemd unit) exits 1 naming the agent
// that holds the node; once the first stops (it releases the node Lease),
// the second starts at once; a restart of the same agent (same state dir)
// is never refused.
func TestGuardOneAgentPerNode(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := (&Opts{Node: node, Sim: "h200x1"}).Fill(t)
	a := StartAgent(t, o)
	waitReady(t, a)
	other := *o
	other.StateDir = filepath.Join(t.TempDir(), "other-state")
	b := StartAgent(t, &other)
	code, exited := b.Wait(10 * time.Second)
	if !exited || code != 1 {
		t.Fatalf("the second agent: exited %v, code %d, want exit 1\n%s", exited, code, b.Log())
	}
	if !strings.Contains(b.Log(), "another mig-agent is running") || !strings.Contains(b.Log(), o.StateDir) {
		t.Errorf("the second agent's message does not say why:\n%s", b.Log())
	}
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 30*time.Second)
	if n := len(History(t, GetNode(t, c, node))); n != 1 {
		t.Errorf("%d records for one label change, want 1", n)
	}
	grAlive(t, a, "the first agent")

	// The same agent killed and started again takes its Lease back at once.
	a.Kill()
	a = StartAgent(t, o)
	waitReady(t, a)
	grAlive(t, a, "the first agent, restarted after kill -9")
	if code := a.Stop(); code != 0 {
		t.Fatalf("SIGTERM: exit code %d", code)
	}
	l, err := c.CoordinationV1().Leases(o.Namespace).Get(context.Background(), nodelease.NodeLeaseName(node), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" {
		t.Errorf("node Lease still held by %q after SIGTERM", h)
	}
	b = StartAgent(t, &other)
	waitReady(t, b)
	grAlive(t, b, "the second agent, after the first stopped")
}

// grRole binds a ServiceAccount of ns to rules on the cluster and returns a
// kubeconfig that authenticates as it, with the ClusterRole's name.
func grRole(t *testing.T, ns string, rules []rbacv1.PolicyRule) (kubeconfig, role string) {
	t.Helper()
	c := kubetest.Client(t)
	ctx := context.Background()
	name := kubetest.NewName(t, "agent")
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return rbacKubeconfig(t, kubetest.ServiceAccountToken(t, ns, name, nil)), name
}

// Item 4: with a token that may read its Node but not write it (and no
// taint), the agent proves it cannot record the change before it touches
// anything: the GPUs stay as they are, a Warning Event says why, and the
// change is retried; once the right is granted it goes through.
func TestGuardReadOnlyToken(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := (&Opts{Node: node, Sim: "h200x2", Extra: []string{"--taint=false", "--retry-backoff-max", "5s"}}).Fill(t)
	readOnly := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list"}},
	}
	kc, role := grRole(t, o.Namespace, readOnly)
	o.Kubeconfig = kc
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitFor(t, 30*time.Second, "a Warning Event "+record.ReasonPreflight, func() bool {
		return len(nodeEvents(t, c, node, record.ReasonPreflight)) > 0
	})
	ev := nodeEvents(t, c, node, record.ReasonPreflight)[0]
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, "forbidden") {
		t.Errorf("preflight Event: %s %q", ev.Type, ev.Message)
	}
	time.Sleep(6 * time.Second) // a retry, refused again
	for _, g := range disProfiles(t, o.Sim, o.SimState) {
		if g.MigMode.Current || len(g.Instances) != 0 {
			t.Fatalf("GPU %d was changed though the change cannot be recorded: MIG %v, %d instances", g.Index, g.MigMode.Current, len(g.Instances))
		}
	}
	if n := GetNode(t, c, node); n.Labels[record.LabelState] != "" || n.Annotations[record.AnnotationLastChange] != "" {
		t.Errorf("the read-only agent wrote the Node: state %q", n.Labels[record.LabelState])
	}
	if len(nodeEvents(t, c, node, record.ReasonStarted)) != 0 {
		t.Error("a change was started")
	}
	grAlive(t, a, "read-only token")

	// The right to patch the Node comes: the next retry applies the change.
	cr, err := c.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cr.Rules[0].Verbs = append(cr.Rules[0].Verbs, "patch", "update")
	if _, err := c.RbacV1().ClusterRoles().Update(ctx, cr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 30*time.Second)
}

// Item 5: a failure reason longer than a Node takes (a config file of 600
// long names, all listed as known) still gives state failed, with a capped
// reason in the record and the whole text in the log; a history that is not
// JSON is kept aside, with an Event, not dropped.
func TestGuardOversizeReason(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	var b strings.Builder
	b.WriteString("version: v1\nmig-configs:\n")
	var last string
	for i := range 600 {
		last = fmt.Sprintf("config-%03d-%s", i, strings.Repeat("x", 240))
		fmt.Fprintf(&b, "  %s:\n    - devices: all\n      mig-enabled: false\n", last)
	}
	file := disConfig(t, b.String())
	o := &Opts{Node: node, Sim: "h200x1", Extra: []string{"-f", file}}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 30*time.Second)

	const junk = `[{"config": "truncated by hand`
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{record.AnnotationHistory: junk}}})
	if _, err := c.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	SelectConfig(t, c, node, "nope")
	rec := WaitState(t, c, node, record.StateFailed, "nope", 30*time.Second)
	if len(rec.Reason) > record.MaxRecordReason || !strings.Contains(rec.Reason, "is not in") || !strings.Contains(rec.Reason, "bytes in all") {
		t.Errorf("record reason (%d bytes) not capped as it should be: %.200q", len(rec.Reason), rec.Reason)
	}
	if !strings.Contains(a.Log(), last) {
		t.Error("the agent's log does not hold the whole reason")
	}
	n := GetNode(t, c, node)
	if got := n.Annotations[record.AnnotationHistoryUnparsable]; got != junk {
		t.Errorf("the unparsable history was not kept aside: %q", got)
	}
	if h := NodeHistory(t, n); len(h) != 1 || h[0].Config != "nope" {
		t.Errorf("history after the unparsable one: %d records", len(h))
	}
	// The Events follow the record (the state label is written with it).
	WaitFor(t, 10*time.Second, "an Event about the unparsable history", func() bool {
		return len(nodeEvents(t, c, node, record.ReasonHistoryUnparsable)) > 0
	})
	WaitFor(t, 10*time.Second, "an Event about the failure", func() bool {
		return len(nodeEvents(t, c, node, record.ReasonInvalid)) > 0
	})
}

// grRun runs the binary with args to its end or until timeout (then kills
// it), with its data segment capped, so that an agent that is wrong (reads
// /dev/zero to the end, blocks on a FIFO, keeps running) cannot take the
// machine's memory or the test's time. It returns stderr and the exit code.
func grRun(t *testing.T, timeout time.Duration, args ...string) (stderr string, code int, killed bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "prlimit", append([]string{"--data=1000000000", "--", binary()}, args...)...)
	var errb strings.Builder
	cmd.Stderr = &errb
	cmd.WaitDelay = time.Second
	_ = cmd.Run()
	return errb.String(), cmd.ProcessState.ExitCode(), ctx.Err() != nil
}

// Item 6: every file the user names is read only when it is a regular file,
// bounded while reading: /dev/zero and a FIFO exit 2 at once (validate -f,
// run -f, --settings).
func TestGuardSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(p string) []string {
		return []string{"run", "--standalone", "-c", "all-disabled", "--nvml", "sim:h200x1", "--state-dir", filepath.Join(dir, "state"),
			"--metrics-address", "", "-f", p}
	}
	settings := func(p string) []string {
		return []string{"validate", "-f", p, "--settings", p}
	}
	for _, p := range []string{"/dev/zero", fifo} {
		for what, args := range map[string][]string{
			"validate -f": {"validate", "-f", p},
			"run -f":      run(p),
			"--settings":  settings(p),
		} {
			start := time.Now()
			stderr, code, killed := grRun(t, 5*time.Second, args...)
			if killed {
				t.Errorf("%s %s: still running after 5s (killed)", what, p)
				continue
			}
			took := time.Since(start)
			if code != 2 || !strings.Contains(stderr, "not a regular file") || took > time.Second {
				t.Errorf("%s %s: exit %d after %s: %s", what, p, code, took.Round(time.Millisecond), stderr)
			}
		}
	}
}

// Item 6: start failures are clear: a corrupt journal exits 2 naming its
// path, a taken metrics port fails the start; SIGHUP is logged, not fatal.
func TestGuardStartFailures(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o750); err != nil {
		t.Fatal(err)
	}
	journal := filepath.Join(state, "journal.json")
	if err := os.WriteFile(journal, []byte(`{"change": {`), 0o640); err != nil {
		t.Fatal(err)
	}
	base := []string{"run", "--standalone", "-c", "all-disabled", "--nvml", "sim:h200x1", "--sim-state", filepath.Join(dir, "sim.json")}
	stderr, code, _ := grRun(t, 20*time.Second, append(base, "--state-dir", state, "--metrics-address", "")...)
	if code != 2 || !strings.Contains(stderr, journal) {
		t.Errorf("corrupt journal: exit %d: %s", code, stderr)
	}
	os.Remove(journal)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	stderr, code, _ = grRun(t, 20*time.Second, append(base, "--state-dir", state, "--metrics-address", l.Addr().String())...)
	if code != 1 || !strings.Contains(stderr, "address already in use") {
		t.Errorf("taken metrics port: exit %d: %s", code, stderr)
	}

	port := freePort(t)
	a := startProcess(t, append(base, "--state-dir", state, "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port)),
		fmt.Sprintf("http://127.0.0.1:%d", port))
	WaitFor(t, 20*time.Second, "the standalone agent ready", func() bool { return grReadyz(a) == http.StatusOK })
	if err := a.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 5*time.Second, "SIGHUP logged", func() bool { return strings.Contains(a.Log(), "SIGHUP received") })
	grAlive(t, a, "SIGHUP")
}

// Item 6: the config file is read at every pass: a config added to it after
// the start is found, and the record names the file as it is now.
func TestGuardConfigFileReread(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	text := "version: v1\nmig-configs:\n  first:\n    - devices: all\n      mig-enabled: false\n"
	file := disConfig(t, text)
	a := StartAgent(t, &Opts{Node: node, Sim: "h200x1", Extra: []string{"-f", file}})
	waitReady(t, a)
	text += "  second:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.18gb\": 7\n"
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	SelectConfig(t, c, node, "second")
	rec := WaitState(t, c, node, record.StateSuccess, "second", 30*time.Second)
	sum := sha256.Sum256([]byte(text))
	if want := file + "@sha256:" + hex.EncodeToString(sum[:]); rec.ConfigSource != want {
		t.Errorf("configSource %q, want %q", rec.ConfigSource, want)
	}
}

// Item 6: /readyz is false while the API server is unreachable.
func TestGuardNotReadyWithoutAPIServer(t *testing.T) {
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	a := StartAgent(t, &Opts{Node: node, Sim: "h200x1"})
	waitReady(t, a)
	down := make(chan struct{})
	go func() { kubetest.RestartAPIServer(t, 25*time.Second); close(down) }()
	WaitFor(t, 25*time.Second, "/readyz 503 during the outage", func() bool { return grReadyz(a) == http.StatusServiceUnavailable })
	<-down
	WaitFor(t, 30*time.Second, "/readyz 200 after the outage", func() bool { return grReadyz(a) == http.StatusOK })
}

// Item 9: migagent_state shows no state before the agent has decided one:
// on a node nobody has labelled, all four are 0 (a gauge that said success
// would count the node among the converged ones); a restart on a node
// whose label says success shows success after the first pass.
func TestGuardStateUndecidedUntilDecided(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Sim: "h200x1"}
	a := StartAgent(t, o)
	waitReady(t, a)
	time.Sleep(1500 * time.Millisecond) // a pass and a drift check
	states := []string{record.StatePending, record.StateRebooting, record.StateSuccess, record.StateFailed}
	text := a.Scrape(t)
	for _, s := range states {
		if v := metricValue(t, text, "migagent_state", map[string]string{"state": s}); v != 0 {
			t.Errorf("unlabelled node: migagent_state{state=%q} = %v, want 0", s, v)
		}
	}
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 30*time.Second)
	if code := a.Stop(); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	a = StartAgent(t, o)
	waitReady(t, a)
	WaitFor(t, 10*time.Second, "migagent_state success after the restart", func() bool {
		return metricValue(t, a.Scrape(t), "migagent_state", map[string]string{"state": record.StateSuccess}) == 1
	})
}

// Item 9: a blocked eviction's retry delay (40 s here) holds neither a
// newer label nor SIGTERM: the newer label is acted on at once, and
// SIGTERM ends the agent at once (exit 0, the journal keeps the change).
func TestGuardEvictionRetryDelayHoldsNothing(t *testing.T) {
	c := kubetest.Client(t)
	o, _ := disGuardedNode(t, "--drain-timeout", "5m", "--eviction-retry-delay", "40s")
	a := StartAgent(t, o)
	SelectConfig(t, c, o.Node, "all-disabled")
	WaitState(t, c, o.Node, record.StateSuccess, "all-disabled", 30*time.Second)

	refused := func() bool { return strings.Contains(a.Log(), "eviction refused; retrying") }
	SelectConfig(t, c, o.Node, "gpu1-mig")
	WaitFor(t, 20*time.Second, "the eviction refused by the budget", refused)
	start := time.Now()
	SelectConfig(t, c, o.Node, "all-disabled")
	WaitState(t, c, o.Node, record.StateSuccess, "all-disabled", 30*time.Second)
	if took := time.Since(start); took >= 40*time.Second {
		t.Errorf("the newer label waited out the eviction retry delay: %s", took)
	}

	SelectConfig(t, c, o.Node, "gpu1-mig")
	WaitFor(t, 20*time.Second, "the eviction refused again", func() bool {
		return strings.Count(a.Log(), "eviction refused; retrying") >= 2
	})
	start = time.Now()
	if code := a.Stop(); code != 0 {
		t.Fatalf("SIGTERM in the eviction retry delay: exit %d", code)
	}
	if took := time.Since(start); took >= 40*time.Second {
		t.Errorf("SIGTERM waited out the eviction retry delay: %s", took)
	}
	t.Logf("SIGTERM in the retry delay: exited after %s", time.Since(start).Round(time.Millisecond))
}

// Item 7: the Node deleted and created again mid-change (same name, new
// UID, as a node replacement or a re-registration does) is a new object:
// the change goes through its disruption again on it — state pending and
// the taint — before any GPU is touched, then converges.
func TestGuardRecreatedNodeMidChange(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	o, ns := disGuardedNode(t, "--drain-timeout", "5m")
	StartAgent(t, o)
	SelectConfig(t, c, o.Node, "all-disabled")
	WaitState(t, c, o.Node, record.StateSuccess, "all-disabled", 30*time.Second)
	SelectConfig(t, c, o.Node, "gpu1-mig")
	WaitFor(t, 20*time.Second, "the change draining (node tainted)", func() bool { return disTainted(GetNode(t, c, o.Node)) })

	old := GetNode(t, c, o.Node)
	if err := c.CoreV1().Nodes().Delete(ctx, o.Node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 10*time.Second, "the Node gone", func() bool {
		_, err := c.CoreV1().Nodes().Get(ctx, o.Node, metav1.GetOptions{})
		return err != nil
	})
	// The new Node carries the node pool's labels (the operands' and the
	// requested config), nothing of the change: no taint, no state.
	labels := map[string]string{record.LabelConfig: "gpu1-mig"}
	for k, v := range disOperandLabels {
		labels[k] = v
	}
	kubetest.CreateNode(t, o.Node, labels)
	WaitFor(t, 20*time.Second, "the new Node tainted and pending", func() bool {
		n := GetNode(t, c, o.Node)
		return n.UID != old.UID && disTainted(n) && n.Labels[record.LabelState] == record.StatePending
	})
	for _, g := range disProfiles(t, o.Sim, o.SimState) {
		if g.MigMode.Current || len(g.Instances) > 0 {
			t.Errorf("GPU %d changed before the new Node showed the change: %+v", g.Index, g)
		}
	}
	disSetPDB(t, c, ns, "db", 1)
	rec := WaitState(t, c, o.Node, record.StateSuccess, "gpu1-mig", 40*time.Second)
	if !slices.Equal(rec.GPUsChanged, []int{1}) {
		t.Errorf("record on the new Node: changed %v, want [1]", rec.GPUsChanged)
	}
	assertNoTaint(t, c, o.Node)
}
