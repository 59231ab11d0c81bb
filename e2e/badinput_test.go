package e2e

// Bad input (issue 9): the CLI answers bad config and settings files with
// exit 2 and a message that says what is wrong, touching nothing; the
// daemon answers bad labels and configs that do not fit with `failed` and
// the reason, evicting nothing and touching nothing.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

const biHead = "version: v1\nmig-configs:\n  a:\n"

// biEntry is one entry of config "a" with these mig-devices.
func biEntry(devices string) string {
	return biHead + "    - devices: all\n      mig-enabled: true\n      mig-devices: " + devices + "\n"
}

// biAliasBomb is a small file whose aliases expand to a million entries:
// one list of a thousand entries, aliased by a thousand configs.
func biAliasBomb() string {
	var b strings.Builder
	b.WriteString("version: v1\nmig-configs:\n  c0: &l [")
	b.WriteString(strings.TrimSuffix(strings.Repeat("{devices: all, mig-enabled: false}, ", 1000), ", "))
	b.WriteString("]\n")
	for i := 1; i < 1000; i++ {
		fmt.Fprintf(&b, "  c%d: *l\n", i)
	}
	return b.String()
}

// biFiles are config files no command may accept: parse errors (exit 2
// from validate alone) and configs that parse but cannot be placed on the
// node's GPUs (exit 2 from validate -c, plan and apply).
var biFiles = []struct {
	name, text, want string
	parses           bool
}{
	{"malformed YAML", biHead + "    - devices: [0\n", "yaml:", false},
	{"braces", "{{{{", "yaml:", false},
	{"binary", "\x00\x01\x02\xff", "", false},
	{"empty", "", "empty document", false},
	{"a list", "- a\n", "the document must be a mapping", false},
	{"version v2", "version: v2\nmig-configs: {}\n", `only "v1" is supported`, false},
	{"unknown top key", "version: v1\nmig-config: {}\n", `unknown key "mig-config"`, false},
	{"unknown entry key", biHead + "    - devices: all\n      mig-enabled: false\n      mig-device: {}\n", `unknown key "mig-device"`, false},
	{"devices wrong type", biHead + "    - devices: {a: 1}\n      mig-enabled: false\n", "devices", false},
	{"mig-enabled wrong type", biHead + "    - devices: all\n      mig-enabled: yes please\n", "not true or false", false},
	{"count a string", biEntry(`{"1g.18gb": seven}`), `count of "1g.18gb" is "seven", not a whole number`, false},
	{"count a float", biEntry(`{"1g.18gb": 1.5}`), "not a whole number", false},
	{"negative count", biEntry(`{"1g.18gb": -1}`), `count of "1g.18gb" is -1; want 0 to 64`, false},
	{"huge count", biEntry(`{"1g.18gb": 1000000}`), "want 0 to 64", false},
	{"count beyond int64", biEntry(`{"1g.18gb": 99999999999999999999999}`), "not a whole number", false},
	{"alias bomb", biAliasBomb(), "more than 100000 YAML nodes", false},
	{"device index out of range", biHead + "    - devices: [0, 5000]\n      mig-enabled: false\n", `devices item is "5000", not a GPU index`, false},
	{"negative device index", biHead + "    - devices: [-1]\n      mig-enabled: false\n", `devices item is "-1"`, false},
	{"duplicate config", biHead + "    - {devices: all, mig-enabled: false}\n  a:\n    - {devices: all, mig-enabled: false}\n", `key "a" repeated in mig-configs`, false},
	{"duplicate device index", biHead + "    - devices: [1, 1]\n      mig-enabled: false\n", "GPU index 1 listed twice", false},
	{"duplicate profile", biEntry(`{"1g.18gb": 1, "1g.18gb": 2}`), `key "1g.18gb" repeated in mig-devices`, false},
	{"profile name garbage", biEntry(`{"one-slice": 1}`), `invalid MIG profile name "one-slice"`, false},
	{"too big", "# " + strings.Repeat("x", 2<<20) + "\n", "bytes, more than", false},

	{"a profile of another GPU", biEntry(`{"1g.10gb": 7}`), `MIG profile not offered by this GPU: "1g.10gb"`, true},
	{"more than fits", biEntry(`{"1g.18gb": 8}`), "8 × 1g.18gb: needs 8 compute slices of 7", true},
	{"sizes that do not fit together", biEntry(`{"7g.141gb": 1, "1g.18gb": 1}`), "needs 8 compute slices of 7", true},
	{"only GPU indices the node lacks", biHead + "    - devices: [7]\n      mig-enabled: false\n", "selects none of this node's 2× NVIDIA H200", true},
	{"config for other hardware", biHead + "    - device-filter: \"0x20B010DE\"\n      devices: all\n      mig-enabled: false\n", "selects none of", true},
}

// biCheckMessage checks a CLI failure: exit 2, one clear line naming want,
// no stack trace.
func biCheckMessage(t *testing.T, what string, code int, stderr, want string) {
	t.Helper()
	if code != 2 {
		t.Errorf("%s: exit %d, want 2; stderr:\n%s", what, code, stderr)
	}
	if !strings.Contains(stderr, "mig-agent: ") || !strings.Contains(stderr, want) {
		t.Errorf("%s: stderr lacks %q:\n%s", what, want, stderr)
	}
	if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "panic") {
		t.Errorf("%s: stack trace:\n%s", what, stderr)
	}
}

func TestBadInputConfigFilesCLI(t *testing.T) {
	state := flPrepareSim(t, "h200x2", "all-1g.18gb")
	before, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	sim := []string{"--nvml", "sim:h200x2", "--sim-state", state}
	dir := t.TempDir()
	for i, tc := range biFiles {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, fmt.Sprintf("bad-%d.yaml", i))
			if err := os.WriteFile(file, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			_, stderr, code := RunCLI(t, "validate", "-f", file)
			if tc.parses {
				if code != 0 {
					t.Errorf("validate without -c: exit %d: %s", code, stderr)
				}
			} else {
				biCheckMessage(t, "validate", code, stderr, tc.want)
			}
			for _, cmd := range [][]string{
				{"validate", "-f", file, "-c", "a"},
				{"plan", "-f", file, "-c", "a"},
				{"plan", "-f", file, "-c", "a", "-o", "json"},
				{"apply", "-f", file, "-c", "a"},
			} {
				out, stderr, code := RunCLI(t, append(cmd, sim...)...)
				biCheckMessage(t, strings.Join(cmd[:1], " "), code, stderr, tc.want)
				if out != "" {
					t.Errorf("%s printed to stdout on bad input:\n%s", cmd[0], out)
				}
			}
			if after, _ := os.ReadFile(state); !bytes.Equal(before, after) {
				t.Fatalf("the GPUs changed")
			}
		})
	}
	// A missing file and a config the file lacks.
	_, stderr, code := RunCLI(t, append([]string{"apply", "-f", filepath.Join(dir, "nope.yaml"), "-c", "a"}, sim...)...)
	biCheckMessage(t, "missing file", code, stderr, "no such file")
	good := filepath.Join(dir, "good.yaml")
	_ = os.WriteFile(good, []byte(biHead+"    - devices: all\n      mig-enabled: false\n"), 0o644)
	_, stderr, code = RunCLI(t, append([]string{"apply", "-f", good, "-c", "b"}, sim...)...)
	biCheckMessage(t, "unknown config", code, stderr, `unknown MIG config: "b" is not in`)
	if after, _ := os.ReadFile(state); !bytes.Equal(before, after) {
		t.Fatalf("the GPUs changed")
	}
}

func TestBadInputSettingsFiles(t *testing.T) {
	dir := t.TempDir()
	tests := []struct{ name, text, want string }{
		{"unknown key", "node-name: n1\nnodename: n1\n", "unknown keys nodename"},
		{"two unknown keys", "drain_timeout: 1m\nfoo: 1\n", "unknown keys drain_timeout, foo"},
		{"settings names itself", "settings: other.yaml\n", "unknown keys settings"},
		{"duration wrong type", "drain-timeout: soon\n", `drain-timeout: "soon" is not a duration`},
		{"integer wrong type", "max-concurrent: two\n", `max-concurrent: "two" is not an integer`},
		{"integer a float", "max-concurrent: 1.5\n", `max-concurrent: "1.5" is not an integer`},
		{"boolean wrong type", "taint: maybe\n", `taint: "maybe" is not a boolean`},
		{"malformed YAML", "taint: [true\n", "settings file"},
		{"a list", "- taint\n", "settings file"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, fmt.Sprintf("settings-%d.yaml", i))
			if err := os.WriteFile(file, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			// run would need a cluster: it must stop at the settings.
			_, stderr, code := RunCLI(t, "run", "--settings", file, "--node-name", "n1", "--kubeconfig", filepath.Join(dir, "none"),
				"--state-dir", filepath.Join(dir, "state"), "--nvml", "sim:h200x1", "--metrics-address", "")
			biCheckMessage(t, "run", code, stderr, tc.want)
			if !strings.HasPrefix(tc.name, "duration") && !strings.HasPrefix(tc.name, "integer") && !strings.HasPrefix(tc.name, "boolean") {
				_, stderr, code = RunCLI(t, "profiles", "--settings", file, "--nvml", "sim:h200x1")
				biCheckMessage(t, "profiles", code, stderr, tc.want)
			}
		})
	}
	_, stderr, code := RunCLI(t, "profiles", "--settings", filepath.Join(dir, "missing.yaml"), "--nvml", "sim:h200x1")
	biCheckMessage(t, "missing settings file", code, stderr, "no such file")
	_, stderr, code = RunCLI(t, "profiles", "--nvml", "sim:h200x1", "--sim-faults", "Create:1=OOPS")
	biCheckMessage(t, "bad --sim-faults", code, stderr, "unknown operation")
	_, stderr, code = RunCLI(t, "profiles", "--nvml", "sim:h999x1")
	biCheckMessage(t, "bad sim spec", code, stderr, "h999")
}

// The daemon: every bad label value and every config that does not fit
// gives failed with the reason, a Warning Event, nothing evicted, nothing
// touched; a good label afterwards still works.
func TestBadInputLabels(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{record.LabelConfig: "all-1g.18gb"})
	state := flPrepareSim(t, "h200x2", "all-1g.18gb")
	st := flReadSim(t, state)
	ns := kubetest.NewName(t, "work")
	kubetest.CreateNamespace(t, ns)
	k := kubetest.StartKubelet(t, c, node)
	mig := st.migUUIDs(0)
	k.RunPod(t, ns, "trainer", map[string]string{"nvidia.com/mig-1g.18gb": "1"}, map[string][]string{"nvidia.com/mig-1g.18gb": {mig[0]}}, nil)
	k.RunPod(t, ns, "whole", map[string]string{"nvidia.com/gpu": "1"}, map[string][]string{"nvidia.com/gpu": {st.GPUs[1].UUID}}, nil)
	file := writeBadFitFile(t)
	o := &Opts{Node: node, Sim: "h200x2", SimState: state, Extra: []string{"-f", file, "--pod-resources-socket", k.Socket()}}
	a := flStart(t, o)
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 30*time.Second)
	before, _ := os.ReadFile(state)

	labels := []struct{ value, want string }{
		{"no-such-config", `"no-such-config" is not in`},
		{"", "is set but empty"},
		{strings.Repeat("x", 63), `"` + strings.Repeat("x", 63) + `" is not in`},
		{"ALL-BALANCED", `"ALL-BALANCED" is not in`},
		{"all-balanced.v2_beta", `"all-balanced.v2_beta" is not in`},
		{"1g.18gb", `"1g.18gb" is not in`},
		{"9", `"9" is not in`},
		{"other-gpu-profile", `MIG profile not offered by this GPU: "1g.10gb"`},
		{"too-many", "8 × 1g.18gb: needs 8 compute slices of 7"},
		{"beyond-the-node", "selects none of this node's 2× NVIDIA H200"},
		{"other-hardware", "selects none of"},
		{"l40s-style-index", "selects none of"},
		{"no-such-config", `"no-such-config" is not in`}, // again, after others
	}
	last := LastChange(t, GetNode(t, c, node)).FinishedAt
	for _, l := range labels {
		if l.value == "" {
			biSetEmpty(t, node) // SetLabel treats "" as removal
		} else {
			SetLabel(t, c, node, record.LabelConfig, l.value, "")
		}
		var rec record.ChangeRecord
		WaitFor(t, 30*time.Second, fmt.Sprintf("failed record for label %q", l.value), func() bool {
			rec = LastChange(t, GetNode(t, c, node))
			return rec.FinishedAt.After(last) && rec.Config == l.value
		})
		last = rec.FinishedAt
		n := GetNode(t, c, node)
		if rec.Result != record.StateFailed || n.Labels[record.LabelState] != record.StateFailed || !strings.Contains(rec.Reason, l.want) {
			t.Errorf("label %q: state %s, record %s %q; want failed with %q", l.value, n.Labels[record.LabelState], rec.Result, rec.Reason, l.want)
		}
		if len(rec.EvictedPods) != 0 || len(rec.GPUsChanged) != 0 {
			t.Errorf("label %q: record says evicted %v changed %v", l.value, rec.EvictedPods, rec.GPUsChanged)
		}
		for _, taint := range n.Spec.Taints {
			if strings.HasPrefix(taint.Key, "migagent.io/") {
				t.Errorf("label %q: node tainted %v", l.value, taint)
			}
		}
	}
	warnings := 0
	for _, e := range flEvents(t, c, node, "") {
		if e.Type == "Warning" {
			warnings++
		}
	}
	if warnings < len(labels)-1 {
		t.Errorf("%d Warning events for %d bad labels", warnings, len(labels))
	}
	if after, _ := os.ReadFile(state); !bytes.Equal(before, after) {
		t.Errorf("bad labels touched the GPUs")
	}
	if f := k.Finished(); len(f) != 0 {
		t.Errorf("bad labels evicted %v", f)
	}
	for _, p := range []string{"trainer", "whole"} {
		if _, err := c.CoreV1().Pods(ns).Get(context.Background(), p, metav1.GetOptions{}); err != nil {
			t.Errorf("pod %s: %v", p, err)
		}
	}
	if strings.Contains(a.Log(), "panic") {
		t.Errorf("panic in the log")
	}
	// Still healthy: a good label goes through.
	SelectConfig(t, c, node, "all-balanced")
	WaitState(t, c, node, record.StateSuccess, "all-balanced", 60*time.Second)
}

// writeBadFitFile writes configs that parse but do not fit an H200 node.
func writeBadFitFile(t *testing.T) string {
	return disConfig(t, `version: v1
mig-configs:
  other-gpu-profile:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  too-many:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 8}
  beyond-the-node:
    - devices: [2, 3]
      mig-enabled: true
      mig-devices: {"1g.18gb": 7}
  other-hardware:
    - device-filter: ["0x20B010DE", "0x20F110DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
  l40s-style-index:
    - devices: [4, 5, 6, 7]
      mig-enabled: false
`)
}

// biSetEmpty sets the desired label to the empty string (a valid label
// value) through server-side apply.
func biSetEmpty(t *testing.T, node string) {
	t.Helper()
	c := kubetest.Client(t)
	n := GetNode(t, c, node)
	n.Labels[record.LabelConfig] = ""
	if _, err := c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{FieldManager: "e2e-test"}); err != nil {
		t.Fatal(err)
	}
}

// A daemon given a config file it cannot parse does not start: exit 2 with
// the parser's message, nothing written to the Node.
func TestBadInputDaemonConfigFile(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{record.LabelConfig: "a"})
	file := disConfig(t, biEntry(`{"1g.18gb": -3}`))
	a := StartAgent(t, &Opts{Node: node, Sim: "h200x2", Extra: []string{"-f", file}})
	code, ok := a.Wait(30 * time.Second)
	if !ok || code != 2 {
		t.Fatalf("daemon with a bad config file: exited %v with %d, want 2", ok, code)
	}
	if !strings.Contains(a.Log(), `count of "1g.18gb" is -3; want 0 to 64`) {
		t.Errorf("log lacks the reason:\n%s", a.Log())
	}
	if n := GetNode(t, c, node); n.Labels[record.LabelState] != "" {
		t.Errorf("state label %q", n.Labels[record.LabelState])
	}
}
