package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// changeTimeout bounds one change on sim:h200x8 (well under a second when
// the machine is idle; CI shares two cores).
const changeTimeout = 60 * time.Second

// The basic protocol: label → pending → success, with a complete record.
func TestLabelToSuccess(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	a := StartAgent(t, &Opts{Node: node})
	SelectConfig(t, c, node, "all-balanced")
	rec := WaitState(t, c, node, record.StateSuccess, "all-balanced", 60*time.Second)
	if len(rec.GPUsChanged) != 8 || rec.ConfigSource != gpus.ConfigSourceGenerated || rec.ConfigHash == "" {
		t.Fatalf("record: %+v", rec)
	}
	if rec.RequestedBy != "e2e-test" {
		t.Errorf("requestedBy = %q, want e2e-test", rec.RequestedBy)
	}
	_ = a
}

// ---------------------------------------------------------------- helpers --

// stateChange is one value of the state label seen on the Node.
type stateChange struct {
	State string
	At    time.Time // when the watch delivered it
}

// nodeWatch records every state label transition of one Node, as a watch
// started before the test acts delivers them: a state that lasts a few
// milliseconds is seen too.
type nodeWatch struct {
	mu      sync.Mutex
	changes []stateChange
	last    string
	notify  chan struct{}
}

// watchNode starts watching node's state label; it stops when the test ends.
func watchNode(t testing.TB, c kubernetes.Interface, node string) *nodeWatch {
	t.Helper()
	n := GetNode(t, c, node)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", node).String(),
		ResourceVersion: n.ResourceVersion,
	})
	if err != nil {
		cancel()
		t.Fatalf("watch node %s: %v", node, err)
	}
	nw := &nodeWatch{last: n.Labels[record.LabelState], notify: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type != watch.Modified && ev.Type != watch.Added {
				continue
			}
			obj, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			nw.mu.Lock()
			if s := obj.Labels[record.LabelState]; s != nw.last {
				nw.last = s
				nw.changes = append(nw.changes, stateChange{State: s, At: time.Now()})
			}
			nw.mu.Unlock()
			select {
			case nw.notify <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); cancel(); <-done })
	return nw
}

// mark returns the number of transitions seen so far, for since.
func (nw *nodeWatch) mark() int {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return len(nw.changes)
}

// since returns the transitions after mark m.
func (nw *nodeWatch) since(m int) []stateChange {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return slices.Clone(nw.changes[m:])
}

// states returns the state values seen after mark m.
func (nw *nodeWatch) states(m int) []string {
	var out []string
	for _, c := range nw.since(m) {
		out = append(out, c.State)
	}
	return out
}

// wait waits until state was seen after mark m and returns when.
func (nw *nodeWatch) wait(t testing.TB, m int, state string, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.After(timeout)
	for {
		for _, c := range nw.since(m) {
			if c.State == state {
				return c.At
			}
		}
		select {
		case <-nw.notify:
		case <-deadline:
			t.Fatalf("state %q not seen within %s; seen %v", state, timeout, nw.states(m))
		}
	}
}

// simFile identifies one version of the simulator's state file. The
// simulator writes it (temporary file and rename) on every mutation, so a
// new inode means the GPUs were touched.
type simFile struct {
	ino   uint64
	mtime time.Time
	data  []byte
}

func snapshotSim(t testing.TB, path string) simFile {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("sim state: %v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("sim state: %v", err)
	}
	return simFile{ino: st.Sys().(*syscall.Stat_t).Ino, mtime: st.ModTime(), data: data}
}

// assertSimUntouched fails when the state file was rewritten since before.
func assertSimUntouched(t testing.TB, path string, before simFile, what string) {
	t.Helper()
	now := snapshotSim(t, path)
	if now.ino != before.ino || !now.mtime.Equal(before.mtime) || !bytes.Equal(now.data, before.data) {
		t.Errorf("%s: the simulated GPUs were written (inode %d→%d, mtime %s→%s, content equal: %v)", what,
			before.ino, now.ino, before.mtime.Format(time.RFC3339Nano), now.mtime.Format(time.RFC3339Nano), bytes.Equal(now.data, before.data))
	}
}

// planJSON is the part of `plan -o json` the tests read.
type planJSON struct {
	Config string `json:"config"`
	GPUs   []struct {
		Index  int    `json:"index"`
		Action string `json:"action"`
	} `json:"gpus"`
}

// assertGeometry checks with `mig-agent plan` on the sim state file that
// every GPU already holds config (all untouched).
func assertGeometry(t testing.TB, o *Opts, config string, file string) {
	t.Helper()
	args := []string{"plan", "--nvml", "sim:" + o.Sim, "--sim-state", o.SimState, "-c", config, "-o", "json"}
	if file != "" {
		args = append(args, "-f", file)
	}
	out, errOut, code := RunCLI(t, args...)
	if code != 0 {
		t.Fatalf("plan exit %d: %s", code, errOut)
	}
	var p planJSON
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("plan output: %v\n%s", err, out)
	}
	if len(p.GPUs) != 8 {
		t.Fatalf("plan lists %d GPUs, want 8", len(p.GPUs))
	}
	for _, g := range p.GPUs {
		if g.Action != "untouched" {
			t.Errorf("GPU %d does not hold %s: plan says %s", g.Index, config, g.Action)
		}
	}
}

// nodeEvents lists the Events about node with reason (all reasons when "").
func nodeEvents(t testing.TB, c kubernetes.Interface, node, reason string) []corev1.Event {
	t.Helper()
	sel := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node}
	if reason != "" {
		sel["reason"] = reason
	}
	list, err := c.CoreV1().Events(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{FieldSelector: sel.String()})
	if err != nil {
		t.Fatalf("list events: %v", err)
	}
	return list.Items
}

// eventuallyNodeEvents waits up to 10 s for an Event about node with
// reason and returns those there are (none when the wait ran out): an
// Event is posted after the record and the state label it reports, so a
// read at once may come before it on a loaded machine.
func eventuallyNodeEvents(t testing.TB, c kubernetes.Interface, node, reason string) []corev1.Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs := nodeEvents(t, c, node, reason)
		if len(evs) > 0 || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rawRecord reads the last-change annotation as a generic JSON object.
func rawRecord(t testing.TB, n *corev1.Node) map[string]any {
	t.Helper()
	raw := n.Annotations[record.AnnotationLastChange]
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatalf("last-change %q: %v", raw, err)
	}
	return m
}

var hexSHA256 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// checkRecord checks every field docs/reference.md#change-record lists in a raw record.
func checkRecord(t testing.TB, m map[string]any, notBefore time.Time) {
	t.Helper()
	for _, k := range []string{"config", "previousConfig", "result", "startedAt", "finishedAt", "gpusChanged",
		"gpusUntouched", "evictedPods", "reboot", "agentVersion", "driverVersion", "configHash", "configSource",
		"requestedBy", "requestedBySource", "requestedAt"} {
		if _, ok := m[k]; !ok {
			t.Errorf("record has no %q: %v", k, m)
		}
	}
	times := map[string]time.Time{}
	for _, k := range []string{"startedAt", "finishedAt", "requestedAt"} {
		s, _ := m[k].(string)
		ts, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Errorf("%s = %q is not RFC 3339: %v", k, s, err)
			continue
		}
		times[k] = ts
		if ts.Before(notBefore.Add(-2*time.Second)) || ts.After(time.Now().Add(time.Second)) {
			t.Errorf("%s = %s is outside the test's window [%s, now]", k, s, notBefore.Format(time.RFC3339Nano))
		}
	}
	if times["finishedAt"].Before(times["startedAt"]) {
		t.Errorf("finishedAt %s before startedAt %s", times["finishedAt"], times["startedAt"])
	}
	// managedFields times have second precision.
	if times["requestedAt"].After(times["startedAt"]) {
		t.Errorf("requestedAt %s after startedAt %s", times["requestedAt"], times["startedAt"])
	}
	if v, _ := m["agentVersion"].(string); v == "" {
		t.Errorf("agentVersion empty")
	}
	if v, _ := m["driverVersion"].(string); v != nvmlsim.DriverVersion {
		t.Errorf("driverVersion = %q, want %q", v, nvmlsim.DriverVersion)
	}
	if v, _ := m["configHash"].(string); !hexSHA256.MatchString(v) {
		t.Errorf("configHash = %q, want 64 hex digits", v)
	}
	if _, ok := m["reboot"].(bool); !ok {
		t.Errorf("reboot = %v, want a bool", m["reboot"])
	}
	for _, k := range []string{"gpusChanged", "gpusUntouched", "evictedPods"} {
		if _, ok := m[k].([]any); !ok {
			t.Errorf("%s = %v, want an array", k, m[k])
		}
	}
	listed := map[float64]bool{}
	for _, k := range []string{"gpusChanged", "gpusUntouched"} {
		list, _ := m[k].([]any)
		for _, x := range list {
			i, _ := x.(float64)
			if listed[i] {
				t.Errorf("GPU %v listed twice in gpusChanged/gpusUntouched", x)
			}
			listed[i] = true
		}
	}
	if len(listed) != 8 {
		t.Errorf("gpusChanged and gpusUntouched cover %d GPUs, want 8: %v %v", len(listed), m["gpusChanged"], m["gpusUntouched"])
	}
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// writeFile writes a file in a temporary directory and returns its path.
func writeFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// testConfigs is a config file: one config of its own, one with the same
// geometry as the generated all-balanced, and one that cannot be placed.
const testConfigs = `version: v1
mig-configs:
  two-threes:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.71gb": 2
  balanced-copy:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.18gb": 2
        "2g.35gb": 1
        "3g.71gb": 1
  two-fours:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices:
        "4g.71gb": 2
`

// ------------------------------------------------------------------ tests --

// Every field of the record (docs/reference.md#change-record) is present and plausible; the
// pending state is seen on the way; the second record names the first
// config as previous; configSource names the file and its digest when the
// config comes from -f.
func TestChangeRecordFields(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	file := writeFile(t, "configs.yaml", testConfigs)
	o := &Opts{Node: node, Extra: []string{"-f", file}}
	StartAgent(t, o)
	w := watchNode(t, c, node)

	start := time.Now()
	m := w.mark()
	SetLabel(t, c, node, record.LabelConfig, "all-balanced", "alice-kubectl")
	w.wait(t, m, record.StatePending, changeTimeout)
	rec := WaitState(t, c, node, record.StateSuccess, "all-balanced", changeTimeout)
	if got := w.states(m); !slices.Equal(got, []string{record.StatePending, record.StateSuccess}) {
		t.Errorf("state transitions %v, want [pending success]", got)
	}
	n := GetNode(t, c, node)
	raw := rawRecord(t, n)
	checkRecord(t, raw, start)
	if rec.Result != record.StateSuccess || rec.Reason != "" || rec.PreviousConfig != "" || rec.Reboot {
		t.Errorf("first record: result %q reason %q previous %q reboot %v", rec.Result, rec.Reason, rec.PreviousConfig, rec.Reboot)
	}
	if !slices.Equal(rec.GPUsChanged, []int{0, 1, 2, 3, 4, 5, 6, 7}) || len(rec.GPUsUntouched) != 0 || len(rec.EvictedPods) != 0 {
		t.Errorf("first record: changed %v untouched %v evicted %v", rec.GPUsChanged, rec.GPUsUntouched, rec.EvictedPods)
	}
	if rec.ConfigSource != gpus.ConfigSourceGenerated {
		t.Errorf("configSource = %q, want generated (all-balanced is not in the file)", rec.ConfigSource)
	}
	if rec.RequestedBy != "alice-kubectl" {
		t.Errorf("requestedBy = %q, want the field manager alice-kubectl", rec.RequestedBy)
	}
	version, _, _ := RunCLI(t, "version")
	if !strings.HasPrefix(version, "mig-agent "+rec.AgentVersion+"\n") {
		t.Errorf("agentVersion %q is not what `mig-agent version` prints: %q", rec.AgentVersion, version)
	}
	firstHash := rec.ConfigHash

	// The second config comes from the file; another manager asks for it.
	m = w.mark()
	SetLabel(t, c, node, record.LabelConfig, "two-threes", "bob-gitops")
	w.wait(t, m, record.StatePending, changeTimeout)
	rec = WaitState(t, c, node, record.StateSuccess, "two-threes", changeTimeout)
	checkRecord(t, rawRecord(t, GetNode(t, c, node)), start)
	if rec.PreviousConfig != "all-balanced" {
		t.Errorf("previousConfig = %q, want all-balanced", rec.PreviousConfig)
	}
	sum, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if want := file + "@sha256:" + sha256Hex(sum); rec.ConfigSource != want {
		t.Errorf("configSource = %q, want %q", rec.ConfigSource, want)
	}
	if rec.RequestedBy != "bob-gitops" {
		t.Errorf("requestedBy = %q, want bob-gitops", rec.RequestedBy)
	}
	if rec.ConfigHash == firstHash {
		t.Errorf("configHash %s is the same for all-balanced and two-threes", rec.ConfigHash)
	}
	if !slices.Equal(rec.GPUsChanged, []int{0, 1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("gpusChanged = %v, want all 8", rec.GPUsChanged)
	}
	hist := History(t, GetNode(t, c, node))
	if len(hist) != 2 || hist[0].Config != "two-threes" || hist[1].Config != "all-balanced" {
		t.Errorf("history: %+v", hist)
	}
	assertGeometry(t, o, "two-threes", file)
	// The Event follows the record.
	for _, reason := range []string{record.ReasonStarted, record.ReasonApplied} {
		WaitFor(t, 10*time.Second, "two Events "+reason, func() bool { return len(nodeEvents(t, c, node, reason)) == 2 })
	}
}

// The history keeps the newest records, newest first, bounded in count
// and size: the newest record.HistoryMaxRecords whole in the ConfigMap,
// the newest record.NodeHistoryMaxRecords of them light on the Node.
func TestHistoryBound(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node}
	StartAgent(t, o)
	configs := []string{"all-balanced", "all-1g.18gb", "all-3g.71gb", "all-disabled"}
	var asked []string
	for i := range record.HistoryMaxRecords + 3 {
		cfg := configs[i%len(configs)]
		SelectConfig(t, c, node, cfg)
		WaitState(t, c, node, record.StateSuccess, cfg, changeTimeout)
		asked = append(asked, cfg)
		// The last-change record is written with the state; wait for a
		// new one before the next change (a config can repeat).
		WaitFor(t, changeTimeout, "history to grow", func() bool {
			return len(WholeHistory(t, c, o.Namespace, node)) >= min(i+1, record.HistoryMaxRecords)
		})
	}
	n := GetNode(t, c, node)
	raw := n.Annotations[record.AnnotationHistory]
	onNode := NodeHistory(t, n)
	hist := WholeHistory(t, c, o.Namespace, node)
	t.Logf("history: %d records whole in the ConfigMap; %d light on the Node in %d bytes", len(hist), len(onNode), len(raw))
	if len(hist) != record.HistoryMaxRecords {
		t.Fatalf("the ConfigMap holds %d records, want %d", len(hist), record.HistoryMaxRecords)
	}
	if len(onNode) != record.NodeHistoryMaxRecords || len(raw) > record.NodeHistoryMaxBytes {
		t.Fatalf("the Node holds %d records in %d bytes, bounds are %d and %d", len(onNode), len(raw), record.NodeHistoryMaxRecords, record.NodeHistoryMaxBytes)
	}
	slices.Reverse(asked)
	for i, r := range hist {
		if r.Config != asked[i] {
			t.Errorf("history[%d] is %s, want %s (newest first)", i, r.Config, asked[i])
		}
		if i > 0 && r.FinishedAt.After(hist[i-1].FinishedAt) {
			t.Errorf("history[%d] finished after history[%d]", i, i-1)
		}
		if i+1 < len(asked) && r.PreviousConfig != asked[i+1] {
			t.Errorf("history[%d].previousConfig = %s, want %s", i, r.PreviousConfig, asked[i+1])
		}
		if i < len(onNode) && (onNode[i].Config != r.Config || !onNode[i].FinishedAt.Equal(r.FinishedAt)) {
			t.Errorf("the Node's history[%d] %+v is not the ConfigMap's %+v", i, onNode[i], r)
		}
	}
	if last := LastChange(t, n); last.Config != hist[0].Config || !last.FinishedAt.Equal(hist[0].FinishedAt) {
		t.Errorf("last-change %+v is not history[0] %+v", last, hist[0])
	}
}

// The ConfigMap <node>-mig-config holds what `mig-agent profiles` generates,
// with its labels, owned by the Node.
func TestConfigMap(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	created := kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node}
	StartAgent(t, o)
	var cm *corev1.ConfigMap
	WaitFor(t, changeTimeout, "ConfigMap", func() bool {
		var err error
		cm, err = c.CoreV1().ConfigMaps(o.Namespace).Get(context.Background(), node+"-mig-config", metav1.GetOptions{})
		return err == nil
	})
	out, errOut, code := RunCLI(t, "profiles", "--nvml", "sim:"+o.Sim, "-o", "json")
	if code != 0 {
		t.Fatalf("profiles exit %d: %s", code, errOut)
	}
	var prof struct {
		Configs string `json:"configs"`
	}
	if err := json.Unmarshal([]byte(out), &prof); err != nil {
		t.Fatal(err)
	}
	if prof.Configs == "" || cm.Data[record.ConfigMapKey] != prof.Configs {
		t.Errorf("ConfigMap %s differs from `mig-agent profiles`:\n%s\n--- profiles:\n%s", record.ConfigMapKey, cm.Data[record.ConfigMapKey], prof.Configs)
	}
	if len(cm.Data) != 1 {
		t.Errorf("ConfigMap keys: %v", cm.Data)
	}
	if cm.Labels[record.LabelManagedBy] != "mig-agent" || cm.Labels[record.LabelNode] != node {
		t.Errorf("ConfigMap labels: %v", cm.Labels)
	}
	refs := cm.OwnerReferences
	if len(refs) != 1 || refs[0].APIVersion != "v1" || refs[0].Kind != "Node" || refs[0].Name != node || refs[0].UID != created.UID {
		t.Errorf("ConfigMap ownerReferences: %+v, want the Node %s (uid %s)", refs, node, created.UID)
	}
	// Found by its labels, as the docs say.
	list, err := c.CoreV1().ConfigMaps(o.Namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: record.LabelManagedBy + "=mig-agent," + record.LabelNode + "=" + node})
	if err != nil || len(list.Items) != 1 {
		t.Errorf("ConfigMaps by label: %v, %v", list, err)
	}
}

// An unknown config, and a config that cannot be placed, fail at once: a
// reason, a Warning Event, no GPU touched, no pod evicted, no taint.
func TestInvalidConfigFails(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	created := kubetest.CreateNode(t, node, nil)
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	kl := kubetest.StartKubelet(t, c, node)
	file := writeFile(t, "configs.yaml", testConfigs)
	o := &Opts{Node: node, Extra: []string{"-f", file, "--evict-unmanaged-pods"}}
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-balanced")
	WaitState(t, c, node, record.StateSuccess, "all-balanced", changeTimeout)
	// A GPU pod: with no PodResources (the harness's socket does not exist)
	// every GPU pod counts as affected by a change.
	pod := kl.RunPod(t, ns, "gpu-pod", map[string]string{"nvidia.com/gpu": "1"}, nil, nil)

	for _, tc := range []struct {
		config string
		reason []string // substrings of the reason
	}{
		{"no-such-config", []string{`"no-such-config"`, "all-balanced", "two-threes"}},
		{"two-fours", []string{"GPU 0", "4g.71gb"}},
	} {
		t.Run(tc.config, func(t *testing.T) {
			before := snapshotSim(t, o.SimState)
			w := watchNode(t, c, node)
			start := time.Now()
			SelectConfig(t, c, node, tc.config)
			rec := WaitState(t, c, node, record.StateFailed, tc.config, 10*time.Second)
			took := time.Since(start)
			t.Logf("failed after %s: %s", took.Round(time.Millisecond), rec.Reason)
			if got := w.states(0); slices.Contains(got, record.StatePending) {
				t.Errorf("state transitions %v: pending for a config that cannot be applied", got)
			}
			for _, s := range tc.reason {
				if !strings.Contains(rec.Reason, s) {
					t.Errorf("reason %q does not say %q", rec.Reason, s)
				}
			}
			if rec.Result != record.StateFailed || rec.PreviousConfig != "all-balanced" || len(rec.GPUsChanged) != 0 || len(rec.EvictedPods) != 0 {
				t.Errorf("record: %+v", rec)
			}
			// The Event follows the record.
			WaitFor(t, 10*time.Second, "a Warning Event "+record.ReasonInvalid+" naming "+tc.config, func() bool {
				for _, ev := range nodeEvents(t, c, node, record.ReasonInvalid) {
					if ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Message, rec.Reason) && ev.InvolvedObject.UID == created.UID {
						return true
					}
				}
				return false
			})
			// Not retried by itself: nothing changes while the drift check
			// (1s) runs twice.
			time.Sleep(2500 * time.Millisecond)
			assertSimUntouched(t, o.SimState, before, "a config that failed validation")
			n := GetNode(t, c, node)
			if n.Labels[record.LabelState] != record.StateFailed || len(History(t, n)) == 0 || History(t, n)[0].Config != tc.config {
				t.Errorf("after 2.5s: state %q, history head %+v", n.Labels[record.LabelState], History(t, n)[0])
			}
			for _, taint := range n.Spec.Taints {
				if taint.Key == record.TaintReconfiguring {
					t.Errorf("node tainted: %+v", taint)
				}
			}
			p, err := c.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
			if err != nil || p.DeletionTimestamp != nil || p.UID != pod.UID {
				t.Errorf("GPU pod disturbed: %v, %+v", err, p.ObjectMeta)
			}
		})
	}
	if len(kl.Finished()) != 0 {
		t.Errorf("pods finished by the kubelet: %v", kl.Finished())
	}
	assertGeometry(t, o, "all-balanced", "")
}

// Re-selecting what is applied touches nothing: A → B → A change the GPUs;
// a restart, the same value set again by someone else, and a config with
// the same geometry under another name leave the GPUs alone; a label that
// names the applied config gives success with gpusChanged empty.
func TestReselectApplied(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	file := writeFile(t, "configs.yaml", testConfigs)
	o := &Opts{Node: node, Extra: []string{"-f", file}}
	a := StartAgent(t, o)
	for _, step := range []struct {
		config  string
		changed []int
	}{
		{"all-balanced", []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"two-threes", []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"all-balanced", []int{0, 1, 2, 3, 4, 5, 6, 7}},
	} {
		before := len(History(t, GetNode(t, c, node)))
		SelectConfig(t, c, node, step.config)
		WaitFor(t, changeTimeout, "a new record for "+step.config, func() bool {
			return len(History(t, GetNode(t, c, node))) > before
		})
		rec := WaitState(t, c, node, record.StateSuccess, step.config, changeTimeout)
		if !slices.Equal(rec.GPUsChanged, step.changed) {
			t.Errorf("%s: gpusChanged %v, want %v", step.config, rec.GPUsChanged, step.changed)
		}
	}
	assertGeometry(t, o, "all-balanced", "")
	records := len(History(t, GetNode(t, c, node)))

	// A restart holds the geometry without touching it or writing a record.
	if code := a.Stop(); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	sim := snapshotSim(t, o.SimState)
	a = StartAgent(t, o)
	waitReady(t, a)
	// The same value set again (another manager): nothing to act on.
	SetLabel(t, c, node, record.LabelConfig, "all-balanced", "carol-kubectl")
	time.Sleep(2 * time.Second) // two drift checks
	assertSimUntouched(t, o.SimState, sim, "restart and the same label value again")
	if n := len(History(t, GetNode(t, c, node))); n != records {
		t.Errorf("history grew from %d to %d records without a new label value", records, n)
	}

	// Another name for the geometry that is there: success, no GPU touched.
	checkUnchanged := func(config, previous string) {
		t.Helper()
		before := len(History(t, GetNode(t, c, node)))
		w := watchNode(t, c, node)
		SelectConfig(t, c, node, config)
		WaitFor(t, changeTimeout, "a new record for "+config, func() bool {
			return len(History(t, GetNode(t, c, node))) > before
		})
		rec := WaitState(t, c, node, record.StateSuccess, config, changeTimeout)
		if len(rec.GPUsChanged) != 0 || !slices.Equal(rec.GPUsUntouched, []int{0, 1, 2, 3, 4, 5, 6, 7}) || rec.PreviousConfig != previous {
			t.Errorf("%s: gpusChanged %v untouched %v previous %q, want none, all 8, %q", config, rec.GPUsChanged, rec.GPUsUntouched, rec.PreviousConfig, previous)
		}
		if got := w.states(0); slices.Contains(got, record.StatePending) {
			t.Errorf("%s: state went %v for a config already applied", config, got)
		}
		WaitFor(t, 10*time.Second, "an Event "+record.ReasonUnchanged, func() bool {
			for _, ev := range nodeEvents(t, c, node, record.ReasonUnchanged) {
				if strings.Contains(ev.Message, config) || strings.Contains(ev.Message, "already applied") {
					return true
				}
			}
			return false
		})
		assertSimUntouched(t, o.SimState, sim, config+" names the geometry already there")
	}
	checkUnchanged("balanced-copy", "all-balanced")

	// The label removed and set again to the applied config: a new request,
	// recorded as such, no GPU touched.
	SetLabel(t, c, node, record.LabelConfig, "", "")
	checkUnchanged("balanced-copy", "balanced-copy")
	assertGeometry(t, o, "all-balanced", "")
}

// waitReady waits for the agent's /readyz.
func waitReady(t testing.TB, a *Agent) {
	t.Helper()
	WaitFor(t, changeTimeout, "/readyz", func() bool {
		resp, err := http.Get(a.Metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// warnings counts the Warning Events on the node.
func warnings(t testing.TB, c kubernetes.Interface, node string) []string {
	t.Helper()
	var out []string
	for _, ev := range nodeEvents(t, c, node, "") {
		if ev.Type == corev1.EventTypeWarning {
			out = append(out, ev.Reason+": "+ev.Message)
		}
	}
	return out
}

// SIGTERM ends the daemon with exit code 0, idle or mid-change; a restart
// after an idle stop touches nothing and writes nothing, and a restart after
// a stop mid-change finishes the change.
func TestSIGTERM(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-balanced")
	WaitState(t, c, node, record.StateSuccess, "all-balanced", changeTimeout)
	WaitFor(t, 10*time.Second, "the success Event", func() bool { return len(nodeEvents(t, c, node, record.ReasonApplied)) == 1 })

	if code := a.Stop(); code != 0 {
		t.Fatalf("SIGTERM while idle: exit code %d, want 0", code)
	}
	sim := snapshotSim(t, o.SimState)
	before := GetNode(t, c, node)
	a = StartAgent(t, o)
	waitReady(t, a)
	time.Sleep(2500 * time.Millisecond) // two drift checks, one reconcile
	assertSimUntouched(t, o.SimState, sim, "a restart")
	after := GetNode(t, c, node)
	for _, k := range []string{record.AnnotationLastChange, record.AnnotationHistory} {
		if before.Annotations[k] != after.Annotations[k] {
			t.Errorf("a restart rewrote %s:\n%s\n→\n%s", k, before.Annotations[k], after.Annotations[k])
		}
	}
	if s := after.Labels[record.LabelState]; s != record.StateSuccess {
		t.Errorf("state after restart: %q", s)
	}
	if w := warnings(t, c, node); len(w) != 0 {
		t.Errorf("Warning Events: %v", w)
	}
	if m := metricValue(t, a.Scrape(t), "migagent_state", map[string]string{"state": "success"}); m != 1 {
		t.Errorf("migagent_state{state=success} = %v after restart", m)
	}

	// Mid-change: stopped as soon as pending shows, it exits 0 and the next
	// start finishes the change.
	w := watchNode(t, c, node)
	SelectConfig(t, c, node, "all-1g.18gb")
	w.wait(t, 0, record.StatePending, changeTimeout)
	stopped := time.Now()
	if code := a.Stop(); code != 0 {
		t.Fatalf("SIGTERM mid-change: exit code %d, want 0", code)
	}
	t.Logf("SIGTERM mid-change: exited after %s", time.Since(stopped).Round(time.Millisecond))
	StartAgent(t, o)
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", changeTimeout)
	if !slices.Equal(rec.GPUsChanged, []int{0, 1, 2, 3, 4, 5, 6, 7}) || rec.PreviousConfig != "all-balanced" {
		t.Errorf("record after the interrupted change: changed %v previous %q", rec.GPUsChanged, rec.PreviousConfig)
	}
	assertGeometry(t, o, "all-1g.18gb", "")
	assertNoTaint(t, c, node)
	if w := warnings(t, c, node); len(w) != 0 {
		t.Errorf("Warning Events: %v", w)
	}
}

func assertNoTaint(t testing.TB, c kubernetes.Interface, node string) {
	t.Helper()
	for _, taint := range GetNode(t, c, node).Spec.Taints {
		if taint.Key == record.TaintReconfiguring {
			t.Errorf("node still tainted: %+v", taint)
		}
	}
}

// kill -9 at random moments of a change, then a restart: the node converges
// to the desired config and the record says what changed.
func TestKillMidChange(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node}
	a := StartAgent(t, o)
	w := watchNode(t, c, node)
	previous := ""
	for i, step := range []struct {
		config string
		delay  time.Duration
	}{
		{"all-balanced", 0},
		{"all-1g.18gb", 2 * time.Millisecond},
		{"all-3g.71gb", 10 * time.Millisecond},
		{"all-disabled", 30 * time.Millisecond},
		{"all-balanced", 60 * time.Millisecond},
		{"all-7g.141gb", 120 * time.Millisecond},
		{"all-2g.35gb", 250 * time.Millisecond},
	} {
		m := w.mark()
		SelectConfig(t, c, node, step.config)
		w.wait(t, m, record.StatePending, changeTimeout)
		time.Sleep(step.delay)
		a.Kill()
		killedIn := "?"
		if raw, err := os.ReadFile(filepath.Join(o.StateDir, "journal.json")); err == nil {
			var j journal.State
			if json.Unmarshal(raw, &j) == nil {
				killedIn = "finished"
				if j.Change != nil {
					killedIn = string(j.Change.Phase) + " " + j.Change.Step
				}
			}
		}
		t.Logf("%d: %s killed %s after pending, in %q", i, step.config, step.delay, killedIn)
		a = StartAgent(t, o)
		rec := WaitState(t, c, node, record.StateSuccess, step.config, changeTimeout)
		assertGeometry(t, o, step.config, "")
		if !slices.Equal(rec.GPUsChanged, []int{0, 1, 2, 3, 4, 5, 6, 7}) || len(rec.GPUsUntouched) != 0 {
			t.Errorf("%d: record says GPUs %v changed, %v untouched; all 8 changed", i, rec.GPUsChanged, rec.GPUsUntouched)
		}
		if rec.PreviousConfig != previous {
			t.Errorf("%d: previousConfig %q, want %q", i, rec.PreviousConfig, previous)
		}
		previous = step.config
		assertNoTaint(t, c, node)
	}
	for _, r := range History(t, GetNode(t, c, node)) {
		if r.Result != record.StateSuccess {
			t.Errorf("history holds a %s record: %+v", r.Result, r)
		}
	}
	if w := warnings(t, c, node); len(w) != 0 {
		t.Errorf("Warning Events: %v", w)
	}
}

// The API server goes away for a while right after the label is set; the
// change completes and its record is written once the server is back.
func TestAPIServerRestartMidChange(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node}
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-balanced")
	WaitState(t, c, node, record.StateSuccess, "all-balanced", changeTimeout)

	start := time.Now()
	SetLabel(t, c, node, record.LabelConfig, "all-3g.71gb", "dave-kubectl")
	kubetest.RestartAPIServer(t, 5*time.Second)
	c = kubetest.Client(t)
	rec := WaitState(t, c, node, record.StateSuccess, "all-3g.71gb", 2*changeTimeout)
	checkRecord(t, rawRecord(t, GetNode(t, c, node)), start)
	if rec.PreviousConfig != "all-balanced" || rec.RequestedBy != "dave-kubectl" || !slices.Equal(rec.GPUsChanged, []int{0, 1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("record: %+v", rec)
	}
	assertGeometry(t, o, "all-3g.71gb", "")
	assertNoTaint(t, c, node)
	hist := History(t, GetNode(t, c, node))
	if len(hist) != 2 || hist[0].Config != "all-3g.71gb" || hist[1].Config != "all-balanced" {
		t.Errorf("history: %+v", hist)
	}
}

// metricFamilies parses a /metrics text.
func metricFamilies(t testing.TB, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// metricSeries returns the series of name whose labels include want.
func metricSeries(t testing.TB, text, name string, want map[string]string) []*dto.Metric {
	t.Helper()
	fam := metricFamilies(t, text)[name]
	if fam == nil {
		return nil
	}
	var out []*dto.Metric
	for _, m := range fam.Metric {
		ok := true
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			ok = ok && found
		}
		if ok {
			out = append(out, m)
		}
	}
	return out
}

// metricValue returns the value of the one series of name with labels
// want (gauge or counter), or -1 when there is none.
func metricValue(t testing.TB, text, name string, want map[string]string) float64 {
	t.Helper()
	ms := metricSeries(t, text, name, want)
	switch len(ms) {
	case 0:
		return -1
	case 1:
	default:
		t.Fatalf("%s%v: %d series", name, want, len(ms))
	}
	if g := ms[0].GetGauge(); g != nil {
		return g.GetValue()
	}
	return ms[0].GetCounter().GetValue()
}

// After a change the metrics show the state, the configs, the counters
// and all 8 GPUs with their instances.
func TestMetricsAfterChange(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-balanced")
	rec := WaitState(t, c, node, record.StateSuccess, "all-balanced", changeTimeout)
	text := a.Scrape(t)
	for state, want := range map[string]float64{"success": 1, "pending": 0, "failed": 0, "rebooting": 0} {
		if got := metricValue(t, text, "migagent_state", map[string]string{"state": state}); got != want {
			t.Errorf("migagent_state{state=%q} = %v, want %v", state, got, want)
		}
	}
	if got := metricValue(t, text, "migagent_desired_config_info", map[string]string{"config": "all-balanced"}); got != 1 {
		t.Errorf("migagent_desired_config_info{config=all-balanced} = %v", got)
	}
	if got := metricValue(t, text, "migagent_applied_config_info", map[string]string{"config": "all-balanced", "hash": rec.ConfigHash}); got != 1 {
		t.Errorf("migagent_applied_config_info{config=all-balanced,hash=%s} = %v:\n%s", rec.ConfigHash, got, grepLines(text, "applied_config"))
	}
	if got := metricValue(t, text, "migagent_reconfigurations_total", map[string]string{"result": "success"}); got < 1 {
		t.Errorf("migagent_reconfigurations_total{result=success} = %v", got)
	}
	if got := metricValue(t, text, "migagent_geometry_drift", nil); got != 0 {
		t.Errorf("migagent_geometry_drift = %v", got)
	}
	for name, want := range map[string]float64{"migagent_evicted_pods_total": 0, "migagent_reboots_total": 0, "migagent_nvml_up": 1} {
		if got := metricValue(t, text, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if bi := metricFamilies(t, text)["migagent_build_info"]; bi == nil || len(bi.GetMetric()) != 1 || bi.GetMetric()[0].GetGauge().GetValue() != 1 ||
		len(bi.GetMetric()[0].GetLabel()) != 2 {
		t.Errorf("migagent_build_info: %v", bi)
	}
	if got := metricValue(t, text, "migagent_last_success_timestamp_seconds", nil); got < float64(rec.StartedAt.Unix()) {
		t.Errorf("migagent_last_success_timestamp_seconds = %v, the change started at %d", got, rec.StartedAt.Unix())
	}
	fams := metricFamilies(t, text)
	if h := fams["migagent_reconfiguration_duration_seconds"]; h == nil || h.Metric[0].GetHistogram().GetSampleCount() < 1 {
		t.Errorf("migagent_reconfiguration_duration_seconds: %v", h)
	}
	// The GPUs as `mig-agent profiles` reports them.
	out, errOut, code := RunCLI(t, "profiles", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState, "-o", "json")
	if code != 0 {
		t.Fatalf("profiles: %s", errOut)
	}
	var prof struct {
		GPUs []struct {
			Index    int    `json:"index"`
			UUID     string `json:"uuid"`
			Name     string `json:"name"`
			PCIBusID string `json:"pciBusId"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &prof); err != nil {
		t.Fatal(err)
	}
	if len(prof.GPUs) != 8 || len(fams["migagent_gpu_info"].GetMetric()) != 8 {
		t.Fatalf("%d GPUs in profiles, %d series of migagent_gpu_info", len(prof.GPUs), len(fams["migagent_gpu_info"].GetMetric()))
	}
	for _, g := range prof.GPUs {
		gpu := map[string]string{"gpu": strconv.Itoa(g.Index), "UUID": g.UUID}
		info := map[string]string{"gpu": strconv.Itoa(g.Index), "UUID": g.UUID, "modelName": g.Name, "pci_bus_id": g.PCIBusID}
		if got := metricValue(t, text, "migagent_gpu_info", info); got != 1 {
			t.Errorf("migagent_gpu_info%v = %v", info, got)
		}
		if got := metricValue(t, text, "migagent_gpu_mig_enabled", gpu); got != 1 {
			t.Errorf("migagent_gpu_mig_enabled%v = %v", gpu, got)
		}
		if got := metricValue(t, text, "migagent_gpu_mig_mode_change_pending", gpu); got != 0 {
			t.Errorf("migagent_gpu_mig_mode_change_pending%v = %v", gpu, got)
		}
		for profile, n := range map[string]float64{"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1} {
			l := map[string]string{"gpu": strconv.Itoa(g.Index), "UUID": g.UUID, "profile": profile}
			if got := metricValue(t, text, "migagent_gpu_instances", l); got != n {
				t.Errorf("migagent_gpu_instances%v = %v, want %v", l, got, n)
			}
		}
	}
}

func grepLines(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestMeasureLatency measures, on sim:h200x8, the time from setting the
// label to seeing pending and success on the Node (median of 20 changes
// between all-disabled and all-balanced, which touch all 8 GPUs), and the
// agent's resident memory in steady state. It logs the figures and asserts
// only that every change succeeded.
func TestMeasureLatency(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	a := StartAgent(t, &Opts{Node: node})
	waitReady(t, a)
	w := watchNode(t, c, node)
	const n = 20
	var toPending, toSuccess []time.Duration
	for i := range n {
		cfg := "all-balanced"
		if i%2 == 1 {
			cfg = "all-disabled"
		}
		m := w.mark()
		start := time.Now()
		SelectConfig(t, c, node, cfg)
		pending := w.wait(t, m, record.StatePending, changeTimeout)
		success := w.wait(t, m, record.StateSuccess, changeTimeout)
		toPending = append(toPending, pending.Sub(start))
		toSuccess = append(toSuccess, success.Sub(start))
		if rec := LastChange(t, GetNode(t, c, node)); rec.Config != cfg || rec.Result != record.StateSuccess || len(rec.GPUsChanged) != 8 {
			t.Fatalf("change %d: record %+v", i, rec)
		}
	}
	time.Sleep(2 * time.Second) // steady state: drift checks only
	rss := vmRSS(t, a.cmd.Process.Pid)
	t.Logf("sim:h200x8, %d changes all-disabled <-> all-balanced: label->pending median %s (min %s, max %s); label->success median %s (min %s, max %s); agent %s",
		n, median(toPending), slices.Min(toPending), slices.Max(toPending), median(toSuccess), slices.Min(toSuccess), slices.Max(toSuccess), rss)
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2].Round(time.Millisecond)
	}
	return ((s[len(s)/2-1] + s[len(s)/2]) / 2).Round(time.Millisecond)
}

// vmRSS reads VmRSS of pid from /proc, with its anonymous and file-backed
// parts (the latter mostly the binary's own pages).
func vmRSS(t testing.TB, pid int) string {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, l := range strings.Split(string(raw), "\n") {
		for _, k := range []string{"VmRSS:", "RssAnon:", "RssFile:"} {
			if v, ok := strings.CutPrefix(l, k); ok {
				parts = append(parts, k+" "+strings.TrimSpace(v))
			}
		}
	}
	if len(parts) == 0 {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	return strings.Join(parts, ", ")
}

// After a failure that is retried with backoff, removing the label and
// setting it again is a label change: acted on at once, not after the
// backoff.
func TestRelabelSkipsBackoff(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Extra: []string{"--sim-faults", "CreateGpuInstanceWithPlacement:1=ERROR_INSUFFICIENT_RESOURCES",
		"--retry-backoff-max", "1m"}}
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-balanced")
	rec := WaitState(t, c, node, record.StateFailed, "all-balanced", changeTimeout)
	if !strings.Contains(rec.Reason, "INSUFFICIENT_RESOURCES") {
		t.Fatalf("reason %q does not name the injected error", rec.Reason)
	}
	SetLabel(t, c, node, record.LabelConfig, "", "")
	start := time.Now()
	SelectConfig(t, c, node, "all-balanced")
	WaitState(t, c, node, record.StateSuccess, "all-balanced", changeTimeout)
	// The first retry would come 5 s after the failure.
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the label set again was acted on after %s, as if it waited for the backoff", took.Round(time.Millisecond))
	}
	assertGeometry(t, o, "all-balanced", "")
	hist := History(t, GetNode(t, c, node))
	if len(hist) != 2 || hist[0].Result != record.StateSuccess || hist[1].Result != record.StateFailed {
		t.Errorf("history: %+v", hist)
	}
}

// GPUs changed by hand while the agent was down (or instances lost in a
// reboot) are put back at the next start, with a record.
func TestRestartRestoresGeometry(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-balanced")
	WaitState(t, c, node, record.StateSuccess, "all-balanced", changeTimeout)
	if code := a.Stop(); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	// Someone changes GPUs 0-7 by hand.
	if _, errOut, code := RunCLI(t, "apply", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState, "-c", "all-1g.18gb"); code != 0 {
		t.Fatalf("apply by hand: exit %d: %s", code, errOut)
	}
	before := len(History(t, GetNode(t, c, node)))
	StartAgent(t, o)
	WaitFor(t, changeTimeout, "a new record", func() bool { return len(History(t, GetNode(t, c, node))) > before })
	rec := WaitState(t, c, node, record.StateSuccess, "all-balanced", changeTimeout)
	if !slices.Equal(rec.GPUsChanged, []int{0, 1, 2, 3, 4, 5, 6, 7}) || rec.PreviousConfig != "all-balanced" {
		t.Errorf("record: changed %v previous %q", rec.GPUsChanged, rec.PreviousConfig)
	}
	assertGeometry(t, o, "all-balanced", "")
}
