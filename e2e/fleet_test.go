package e2e

// Fleet realities (issue 10): mixed nodes, the MIG strategy label, a
// default config for unlabelled nodes, who asked, and other MIG managers.
// Each test runs the real binary against the real API server.

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/migagent/mig-agent/kube"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// flSimGPU is what the tests read of one GPU in a --sim-state file.
type flSimGPU struct {
	Model      string `json:"model"`
	UUID       string `json:"uuid"`
	MigCurrent bool   `json:"migCurrent"`
	MigPending bool   `json:"migPending"`
	Instances  []struct {
		ID        int `json:"id"`
		ProfileID int `json:"profileId"`
		Placement struct {
			Start int `json:"start"`
			Size  int `json:"size"`
		} `json:"placement"`
		ComputeInstances []struct {
			ID        int    `json:"id"`
			ProfileID int    `json:"profileId"`
			UUID      string `json:"uuid"`
		} `json:"computeInstances"`
	} `json:"gpuInstances"`
}

type flSim struct {
	BootCount int        `json:"bootCount"`
	GPUs      []flSimGPU `json:"gpus"`
}

// flReadSim parses a --sim-state file.
func flReadSim(t testing.TB, path string) flSim {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("sim state: %v", err)
	}
	var s flSim
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("sim state %s: %v", path, err)
	}
	return s
}

// migUUIDs lists the MIG device UUIDs of GPU i, sorted.
func (s flSim) migUUIDs(i int) []string {
	var out []string
	for _, gi := range s.GPUs[i].Instances {
		for _, ci := range gi.ComputeInstances {
			out = append(out, ci.UUID)
		}
	}
	slices.Sort(out)
	return out
}

// flPrepareSim applies config on a fresh sim state file with the CLI, so a
// daemon starts from that geometry.
func flPrepareSim(t testing.TB, spec, config string, extra ...string) string {
	t.Helper()
	state := filepath.Join(t.TempDir(), "sim.json")
	args := append([]string{"apply", "--nvml", "sim:" + spec, "--sim-state", state, "-c", config}, extra...)
	if _, stderr, code := RunCLI(t, args...); code != 0 {
		t.Fatalf("preparing %s with %s: exit %d: %s", spec, config, code, stderr)
	}
	return state
}

// flStart starts an agent and waits until it serves /readyz (node watch
// up, sim state file written) or exits.
func flStart(t testing.TB, o *Opts) *Agent {
	t.Helper()
	a := StartAgent(t, o)
	WaitFor(t, 30*time.Second, "the agent's /readyz", func() bool {
		if _, exited := a.Wait(time.Millisecond); exited {
			return true // gone before ready (a simulated reboot, a crash): the caller sees it
		}
		resp, err := http.Get(a.Metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return a
}

// flWaitLog waits until the agent's log holds substr.
func flWaitLog(t testing.TB, a *Agent, substr string, timeout time.Duration) {
	t.Helper()
	WaitFor(t, timeout, "log line "+substr, func() bool { return strings.Contains(a.Log(), substr) })
}

// flEvents lists the Events on node with reason.
func flEvents(t testing.TB, c kubernetes.Interface, node, reason string) []corev1.Event {
	t.Helper()
	evs, err := c.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", node).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range evs.Items {
		if reason == "" || e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// flExpectFailed waits for state failed on config whose reason holds every
// one of want, and checks the Warning Event and that the GPUs were not
// touched (the sim state is still before, read before the label was set).
func flExpectFailed(t testing.TB, c kubernetes.Interface, node, config, simState string, before flSim, want ...string) record.ChangeRecord {
	t.Helper()
	rec := WaitState(t, c, node, record.StateFailed, config, 60*time.Second)
	for _, w := range want {
		if !strings.Contains(rec.Reason, w) {
			t.Errorf("reason %q lacks %q", rec.Reason, w)
		}
	}
	if len(rec.EvictedPods) != 0 {
		t.Errorf("failed change evicted %v", rec.EvictedPods)
	}
	WaitFor(t, 10*time.Second, "a Warning Event with the reason", func() bool {
		for _, e := range flEvents(t, c, node, "") {
			if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, want[0]) {
				return true
			}
		}
		return false
	})
	if after := flReadSim(t, simState); !reflect.DeepEqual(before, after) {
		t.Errorf("a failed change touched the GPUs:\nbefore %+v\nafter  %+v", before, after)
	}
	return rec
}

// A node of four H100s and four L40Ss: devices-all configs change the
// H100s and leave the L40Ss alone (untouched in the record), an entry that
// names an L40S for MIG fails with that reason, and the generated configs
// in the ConfigMap carry device-filters.
func TestFleetMixedNode(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	file := disConfig(t, `version: v1
mig-configs:
  l40s-mig:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
    - devices: [5]
      mig-enabled: true
      mig-devices: {}
`)
	o := &Opts{Node: node, Sim: "h100-80gbx4,l40sx4", Extra: []string{"-f", file}}
	flStart(t, o)

	var cm *corev1.ConfigMap
	WaitFor(t, 30*time.Second, "the generated-config ConfigMap", func() bool {
		var err error
		cm, err = c.CoreV1().ConfigMaps(o.Namespace).Get(context.Background(), node+"-mig-config", metav1.GetOptions{})
		return err == nil
	})
	text := cm.Data["config.yaml"]
	if n := strings.Count(text, "device-filter"); n != strings.Count(text, "mig-enabled:")-1 || !strings.Contains(text, `"0x233010DE"`) || strings.Contains(text, "0x26B910DE") {
		t.Errorf("generated configs on a mixed node: %d device-filters, want one per entry but all-disabled's, all for 0x233010DE:\n%s", n, text)
	}

	SelectConfig(t, c, node, "all-balanced")
	rec := WaitState(t, c, node, record.StateSuccess, "all-balanced", 60*time.Second)
	if !reflect.DeepEqual(rec.GPUsChanged, []int{0, 1, 2, 3}) || !reflect.DeepEqual(rec.GPUsUntouched, []int{4, 5, 6, 7}) {
		t.Errorf("changed %v untouched %v; want the H100s 0-3 changed and the L40Ss 4-7 untouched", rec.GPUsChanged, rec.GPUsUntouched)
	}
	st := flReadSim(t, o.SimState)
	for i, g := range st.GPUs {
		if i >= 4 && (g.MigCurrent || g.MigPending || len(g.Instances) > 0) {
			t.Errorf("L40S GPU %d touched: %+v", i, g)
		}
		if i < 4 && (!g.MigCurrent || len(g.Instances) != 4) {
			t.Errorf("H100 GPU %d not balanced: %+v", i, g)
		}
	}

	before := flReadSim(t, o.SimState)
	SelectConfig(t, c, node, "l40s-mig")
	flExpectFailed(t, c, node, "l40s-mig", o.SimState, before,
		"GPU 5 (NVIDIA L40S, 0x26B910DE) is named by index with mig-enabled true", "GPU cannot do MIG")
}

// nvidia.com/mig.strategy=single: a config with several profiles fails
// with the reason, one with a single profile succeeds; plan --strategy
// shows the same verdict and the strategy it checked against.
func TestFleetStrategySingle(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{record.LabelStrategy: "single"})
	o := &Opts{Node: node, Sim: "h100-80gbx2"}
	flStart(t, o)

	before := flReadSim(t, o.SimState)
	SelectConfig(t, c, node, "all-balanced")
	flExpectFailed(t, c, node, "all-balanced", o.SimState, before,
		`strategy "single"`, "GPU 0 would hold 3 profiles (1g.10gb, 2g.20gb, 3g.40gb)")

	SelectConfig(t, c, node, "all-1g.10gb")
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.10gb", 60*time.Second)
	if len(rec.GPUsChanged) != 2 {
		t.Errorf("record %+v", rec)
	}

	// The CLI, offline, with the strategy given.
	sim := []string{"--nvml", "sim:h100-80gbx2"}
	_, stderr, code := RunCLI(t, append([]string{"plan", "-c", "all-balanced", "--strategy", "single"}, sim...)...)
	if code != 2 || !strings.Contains(stderr, `under MIG strategy "single"`) || !strings.Contains(stderr, "single needs one profile") {
		t.Errorf("plan all-balanced --strategy single: exit %d: %s", code, stderr)
	}
	out, stderr, code := RunCLI(t, append([]string{"plan", "-c", "all-1g.10gb", "--strategy", "single", "-o", "json"}, sim...)...)
	var plan struct {
		Strategy string `json:"strategy"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &plan) != nil || plan.Strategy != "single" {
		t.Errorf("plan -o json --strategy single: exit %d, strategy %q: %s", code, plan.Strategy, stderr)
	}
	out, _, code = RunCLI(t, append([]string{"plan", "-c", "all-1g.10gb", "--strategy", "single"}, sim...)...)
	if code != 0 || !strings.Contains(out, "MIG strategy single") {
		t.Errorf("plan text: exit %d:\n%s", code, out)
	}
	out, _, _ = RunCLI(t, append([]string{"plan", "-c", "all-1g.10gb", "-o", "json"}, sim...)...)
	if strings.Contains(out, `"strategy"`) {
		t.Errorf("plan without --strategy claims one:\n%s", out)
	}
}

// --default-config: a Node that joins with no label converges to the
// default (requestedBy default-config); the label, once set, wins; a
// removed label brings the default back.
func TestFleetDefaultConfig(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	flStart(t, &Opts{Node: node, Sim: "h100-80gbx2", Extra: []string{"--default-config", "all-1g.10gb"}})

	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.10gb", 60*time.Second)
	if rec.RequestedBy != "default-config" || len(rec.GPUsChanged) != 2 {
		t.Errorf("default config record: requestedBy %q changed %v", rec.RequestedBy, rec.GPUsChanged)
	}
	if _, ok := GetNode(t, c, node).Labels[record.LabelConfig]; ok {
		t.Errorf("the agent set the desired label itself")
	}

	SetLabel(t, c, node, record.LabelConfig, "all-balanced", "pool-admin")
	rec = WaitState(t, c, node, record.StateSuccess, "all-balanced", 60*time.Second)
	if rec.RequestedBy != "pool-admin" || rec.PreviousConfig != "all-1g.10gb" {
		t.Errorf("label over default: requestedBy %q previous %q", rec.RequestedBy, rec.PreviousConfig)
	}

	SetLabel(t, c, node, record.LabelConfig, "", "pool-admin")
	rec = WaitState(t, c, node, record.StateSuccess, "all-1g.10gb", 60*time.Second)
	if rec.RequestedBy != "default-config" {
		t.Errorf("label removed: requestedBy %q", rec.RequestedBy)
	}
}

// requestedBy names the field manager that set the label, each time.
func TestFleetRequestedBy(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	flStart(t, &Opts{Node: node, Sim: "h200x2"})
	for _, step := range []struct{ config, manager string }{
		{"all-balanced", "alice-kubectl"},
		{"all-1g.18gb", "fleet-controller"},
		{"all-disabled", "alice-kubectl"},
	} {
		before := len(History(t, GetNode(t, c, node)))
		SetLabel(t, c, node, record.LabelConfig, step.config, step.manager)
		var rec record.ChangeRecord
		WaitFor(t, 60*time.Second, "a record for "+step.manager, func() bool {
			n := GetNode(t, c, node)
			rec = LastChange(t, n)
			return len(History(t, n)) > before && rec.Config == step.config && rec.Result == record.StateSuccess
		})
		if rec.RequestedBy != step.manager || rec.RequestedAt == nil {
			t.Errorf("%s by %s: record says requestedBy %q at %v", step.config, step.manager, rec.RequestedBy, rec.RequestedAt)
		}
	}
}

// Another MIG manager on the node: the GPU Operator's MIG manager (its pod)
// or the NVIDIA DRA driver with MIG devices → failed,
// naming it, nothing touched; --allow-other-mig-manager proceeds with a
// warning.
func TestFleetOtherManager(t *testing.T) {
	c := kubetest.Client(t)
	start := func(t *testing.T, labels map[string]string, extra ...string) (string, *Agent, *Opts) {
		node := kubetest.NewName(t, "node")
		kubetest.CreateNode(t, node, labels)
		o := &Opts{Node: node, Sim: "h200x2", Extra: extra}
		a := flStart(t, o)
		return node, a, o
	}
	// operatorPod runs a pod of the GPU Operator's MIG manager on node.
	operatorPod := func(t *testing.T, node string) string {
		ns := kubetest.NewName(t, "gpu-operator")
		kubetest.CreateNamespace(t, ns)
		k := kubetest.StartKubelet(t, c, node)
		pod := k.CreatePod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nvidia-mig-manager-x7k2p", Labels: map[string]string{"app": kube.OperatorMigManagerApp}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.12.1"}}},
		})
		if pod.Status.Phase != corev1.PodRunning {
			t.Fatalf("pod phase %s", pod.Status.Phase)
		}
		return ns + "/" + pod.Name
	}
	t.Run("operator pod", func(t *testing.T) {
		node, _, o := start(t, nil)
		pod := operatorPod(t, node)
		before := flReadSim(t, o.SimState)
		SelectConfig(t, c, node, "all-balanced")
		flExpectFailed(t, c, node, "all-balanced", o.SimState, before, "pod "+pod, "another MIG manager")
		if evs := flEvents(t, c, node, record.ReasonManagerConflict); len(evs) == 0 {
			t.Errorf("no %s event", record.ReasonManagerConflict)
		}
	})
	// The GPU Operator labels every MIG-capable node so, whether or not its
	// MIG manager is enabled: the label alone is no conflict
	// (e2e/gpuoperator_test.go shows it with the operator's own controller).
	t.Run("deploy label alone", func(t *testing.T) {
		node, _, _ := start(t, map[string]string{kube.LabelDeployMigManager: "true"})
		SelectConfig(t, c, node, "all-balanced")
		WaitState(t, c, node, record.StateSuccess, "all-balanced", 60*time.Second)
	})
	t.Run("deploy label false", func(t *testing.T) {
		node, _, _ := start(t, map[string]string{kube.LabelDeployMigManager: "false"})
		SelectConfig(t, c, node, "all-balanced")
		WaitState(t, c, node, record.StateSuccess, "all-balanced", 60*time.Second)
	})
	t.Run("allowed", func(t *testing.T) {
		node, a, _ := start(t, map[string]string{kube.LabelDeployMigManager: "true"}, "--allow-other-mig-manager")
		operatorPod(t, node)
		SelectConfig(t, c, node, "all-balanced")
		WaitState(t, c, node, record.StateSuccess, "all-balanced", 60*time.Second)
		flWaitLog(t, a, "another MIG manager is at work on this node; acting anyway", 5*time.Second)
		if !strings.Contains(a.Log(), "level=WARN") {
			t.Errorf("no warning logged")
		}
	})
	t.Run("DRA driver", func(t *testing.T) {
		node, _, o := start(t, nil)
		// The driver in DynamicMIG mode: it makes MIG devices itself.
		slice := kubetest.CreateSlices(t, c, kubetest.DynamicMIGSlices(node, node+"-gpu.nvidia.com")...)[0]
		before := flReadSim(t, o.SimState)
		SelectConfig(t, c, node, "all-balanced")
		flExpectFailed(t, c, node, "all-balanced", o.SimState, before, "ResourceSlice "+slice.Name+" carries 1 shared counter sets", "NVIDIA DRA driver in DynamicMIG mode")
	})
}
