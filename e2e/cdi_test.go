package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// e2eFakeCTK is an nvidia-ctk that records its arguments and writes what
// --output names, as the real one does.
const e2eFakeCTK = `#!/bin/sh
echo "nvidia-ctk $*" >> "$CDI_CALLS"
for a in "$@"; do case "$a" in --output=*) echo "kind: management.nvidia.com/gpu" > "${a#--output=}" ;; esac; done
`

const e2eFakeSMI = `#!/bin/sh
echo "nvidia-smi $*" >> "$CDI_CALLS"
`

// The real binary runs NVIDIA's CDI steps after a change that touched
// GPUs (--cdi=on; the toolkit's nvidia-ctk found in --toolkit-dir), and
// not for a config already applied.
func TestCDIAfterChange(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	dir := t.TempDir()
	calls, toolkit, bin, specs := filepath.Join(dir, "calls"), filepath.Join(dir, "toolkit"), filepath.Join(dir, "bin"), filepath.Join(dir, "cdi")
	for path, body := range map[string]string{filepath.Join(toolkit, "nvidia-ctk"): e2eFakeCTK, filepath.Join(bin, "nvidia-smi"): e2eFakeSMI} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("CDI_CALLS", calls)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	o := (&Opts{Node: node, Sim: "h200x1"}).Fill(t)
	o.Extra = append(o.Extra, "--cdi", "on", "--toolkit-dir", toolkit, "--cdi-spec-dir", specs, "--driver-root", "/")
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	raw, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	want := []string{"nvidia-smi", "nvidia-ctk system create-device-nodes --control-devices --dev-root=/", "nvidia-ctk cdi generate --mode=management"}
	if len(lines) != len(want) {
		t.Fatalf("calls:\n%s", raw)
	}
	for i := range want {
		if !strings.HasPrefix(strings.TrimSpace(lines[i]), want[i]) {
			t.Errorf("call %d = %q, want %q", i, lines[i], want[i])
		}
	}
	if _, err := os.Stat(filepath.Join(specs, "management.nvidia.com-gpu.yaml")); err != nil {
		t.Errorf("management spec: %v", err)
	}
}

// A hung nvidia-smi (a wedged driver does that) is killed at
// --command-timeout: the change ends failed naming the step, the node is
// not left tainted or pending, the rollout slot is free, and the retry,
// once nvidia-smi answers again, succeeds.
func TestCDIHungNvidiaSMIFails(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	dir := t.TempDir()
	calls, toolkit, bin, specs := filepath.Join(dir, "calls"), filepath.Join(dir, "toolkit"), filepath.Join(dir, "bin"), filepath.Join(dir, "cdi")
	hung := "#!/bin/sh\necho \"nvidia-smi $*\" >> \"$CDI_CALLS\"\nsleep 3600\n"
	smi := filepath.Join(bin, "nvidia-smi")
	for path, body := range map[string]string{filepath.Join(toolkit, "nvidia-ctk"): e2eFakeCTK, smi: hung} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("CDI_CALLS", calls)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	ns := kubetest.NewName(t, "agents")
	kubetest.CreateNamespace(t, ns)
	o := (&Opts{Node: node, Sim: "h200x1", Namespace: ns}).Fill(t)
	o.Extra = append(o.Extra, "--cdi", "on", "--toolkit-dir", toolkit, "--cdi-spec-dir", specs, "--driver-root", "/",
		"--command-timeout", "3s", "--max-concurrent", "1")
	StartAgent(t, o)
	start := time.Now()
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateFailed, "all-1g.18gb", 60*time.Second)
	took := time.Since(start)
	if !strings.Contains(rec.Reason, "refreshing CDI failed: nvidia-smi") || !strings.Contains(rec.Reason, "command timed out after 3s") {
		t.Errorf("reason = %q", rec.Reason)
	}
	if took > 20*time.Second {
		t.Errorf("failed %s after the label, the command timeout being 3s", took)
	}
	n := GetNode(t, c, node)
	for _, taint := range n.Spec.Taints {
		if taint.Key == record.TaintReconfiguring {
			t.Errorf("node left tainted: %v", taint)
		}
	}
	if st := n.Labels[record.LabelState]; st != record.StateFailed {
		t.Errorf("state %q, want failed", st)
	}
	// The slot is released as the change ends, after its record.
	WaitFor(t, 10*time.Second, "the rollout slot to be free", func() bool {
		l, err := c.CoordinationV1().Leases(ns).Get(context.Background(), "mig-agent-slot-0", metav1.GetOptions{})
		return err == nil && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "")
	})
	// nvidia-smi answers again: the retry runs the step and succeeds.
	if err := os.WriteFile(smi, []byte(e2eFakeSMI), 0o755); err != nil {
		t.Fatal(err)
	}
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	if _, err := os.Stat(filepath.Join(specs, "management.nvidia.com-gpu.yaml")); err != nil {
		t.Errorf("management spec: %v", err)
	}
}
