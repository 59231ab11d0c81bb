package e2e

// Issue 4, minimal disruption, end to end: the real binary on the real API
// server, the test playing the kubelet (PodResources over gRPC, finishing
// evicted pods), a real PodDisruptionBudget, real D-Bus for host units.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/dbustest"
	"github.com/migagent/mig-agent/testkit/kubetest"
	"github.com/migagent/mig-agent/testkit/simlibtest"
)

// disGPU is one GPU of `mig-agent profiles -o json` (the fields tests use).
type disGPU struct {
	Index   int    `json:"index"`
	UUID    string `json:"uuid"`
	MigMode struct {
		Current bool `json:"current"`
		Pending bool `json:"pending"`
	} `json:"migMode"`
	Instances []struct {
		Profile string `json:"profile"`
		Start   int    `json:"start"`
		UUID    string `json:"uuid"`
		// Compute is the compute instance's profile when it is smaller
		// than its GPU instance ("1c.3g.20gb"); empty when it is the whole.
		Compute string `json:"compute"`
	} `json:"instances"`
}

// disProfiles reads the simulated GPUs of a state file through the CLI
// (creating the file, all MIG off, when missing).
func disProfiles(t testing.TB, spec, state string) []disGPU {
	t.Helper()
	out, errOut, code := RunCLI(t, "profiles", "-o", "json", "--nvml", "sim:"+spec, "--sim-state", state, "--log-level", "error")
	if code != 0 {
		t.Fatalf("profiles: exit %d: %s", code, errOut)
	}
	var doc struct {
		GPUs []disGPU `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("profiles -o json: %v", err)
	}
	return doc.GPUs
}

// disMIGUUIDs returns "profile@start" → MIG device UUID of one GPU.
func disMIGUUIDs(g disGPU) map[string]string {
	m := map[string]string{}
	for _, in := range g.Instances {
		m[fmt.Sprintf("%s@%d", in.Profile, in.Start)] = in.UUID
	}
	return m
}

// disConfig writes a MIG config file for the test and returns its path.
func disConfig(t testing.TB, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// disOwner is a controller reference to a ReplicaSet that does not exist:
// the pods look managed, as workload pods are.
func disOwner(name string) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name,
		UID: "00000000-0000-0000-0000-00000000e2e0", Controller: ptr.To(true)}
}

// disLivePods lists the names of the namespace's pods that exist and are not
// terminating, sorted.
func disLivePods(t testing.TB, c kubernetes.Interface, ns string) []string {
	t.Helper()
	list, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p.Name)
		}
	}
	slices.Sort(out)
	return out
}

// disTainted reports whether the node carries the reconfiguring taint.
func disTainted(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == record.TaintReconfiguring })
}

// disCreatePDB makes a budget over pods labelled app=app and writes the
// status the disruption controller would (none runs here).
func disCreatePDB(t testing.TB, c kubernetes.Interface, ns, app string, allowed int32) {
	t.Helper()
	ctx := context.Background()
	pdb, err := c.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: app},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	disSetPDB(t, c, ns, pdb.Name, allowed)
}

func disSetPDB(t testing.TB, c kubernetes.Interface, ns, name string, allowed int32) {
	t.Helper()
	ctx := context.Background()
	pdb, err := c.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pdb.Status = policyv1.PodDisruptionBudgetStatus{
		ObservedGeneration: pdb.Generation, DisruptionsAllowed: allowed,
		CurrentHealthy: 1, DesiredHealthy: 1 - allowed, ExpectedPods: 1,
	}
	if _, err := c.PolicyV1().PodDisruptionBudgets(ns).UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// kubeletNode makes a Node with its kubelet stand-in (PodResources at
// kl.Socket()) and a namespace for its pods.
func kubeletNode(t *testing.T) (node string, kl *kubetest.Kubelet, ns string) {
	t.Helper()
	node = kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	kl = kubetest.StartKubelet(t, kubetest.Client(t), node)
	ns = kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	return node, kl, ns
}

// disEightGPUs sets up an H200x8 node with MIG off and two pods
// time-sliced on every GPU (device ids "GPU-<uuid>::0" and "::1", as
// NVIDIA's device plugin hands out shared GPUs). It returns the agent's
// options (not started), the namespace and the kubelet.
func disEightGPUs(t *testing.T, withSocket bool) (*Opts, string, *kubetest.Kubelet) {
	node, kl, ns := kubeletNode(t)
	o := (&Opts{Node: node, Sim: "h200x8"}).Fill(t)
	gpus := disProfiles(t, o.Sim, o.SimState)
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs", len(gpus))
	}
	for _, g := range gpus {
		for r := range 2 {
			kl.RunPod(t, ns, fmt.Sprintf("gpu%d-%d", g.Index, r), map[string]string{"nvidia.com/gpu": "1"},
				map[string][]string{"nvidia.com/gpu": {fmt.Sprintf("%s::%d", g.UUID, r)}}, disOwner("train"))
		}
	}
	cfg := disConfig(t, `version: v1
mig-configs:
  whole:
    - devices: all
      mig-enabled: false
  gpu3-mig:
    - devices: [0, 1, 2, 4, 5, 6, 7]
      mig-enabled: false
    - devices: [3]
      mig-enabled: true
      mig-devices:
        "1g.18gb": 7
`)
	o.Extra = []string{"-f", cfg}
	if withSocket {
		o.Extra = append(o.Extra, "--pod-resources-socket", kl.Socket())
	}
	return o, ns, kl
}

// A1, A7: one GPU of eight changes; only its two pods are evicted.
func TestDisruptionOnlyTheChangedGPUsPods(t *testing.T) {
	c := kubetest.Client(t)
	o, ns, kl := disEightGPUs(t, true)
	a := StartAgent(t, o)
	SelectConfig(t, c, o.Node, "whole")
	rec := WaitState(t, c, o.Node, record.StateSuccess, "whole", 30*time.Second)
	if len(rec.EvictedPods) != 0 || len(rec.GPUsChanged) != 0 {
		t.Fatalf("already applied config evicted %v, changed %v", rec.EvictedPods, rec.GPUsChanged)
	}
	start := time.Now()
	SelectConfig(t, c, o.Node, "gpu3-mig")
	rec = WaitState(t, c, o.Node, record.StateSuccess, "gpu3-mig", 60*time.Second)
	took := time.Since(start)

	want := []string{ns + "/gpu3-0", ns + "/gpu3-1"}
	if got := slices.Sorted(slices.Values(rec.EvictedPods)); !slices.Equal(got, want) {
		t.Errorf("evictedPods = %v, want %v", got, want)
	}
	if !slices.Equal(rec.GPUsChanged, []int{3}) || !slices.Equal(rec.GPUsUntouched, []int{0, 1, 2, 4, 5, 6, 7}) {
		t.Errorf("gpusChanged %v, gpusUntouched %v", rec.GPUsChanged, rec.GPUsUntouched)
	}
	if rec.AffectedBy != "pod-resources" {
		t.Errorf("affectedBy = %q, want pod-resources", rec.AffectedBy)
	}
	live := disLivePods(t, c, ns)
	if len(live) != 14 || slices.Contains(live, "gpu3-0") || slices.Contains(live, "gpu3-1") {
		t.Errorf("pods still running: %v (want the 14 on GPUs other than 3)", live)
	}
	if got := slices.Sorted(slices.Values(kl.Finished())); !slices.Equal(got, want) {
		t.Errorf("the kubelet finished %v, want %v", got, want)
	}
	gpus := disProfiles(t, o.Sim, o.SimState)
	for _, g := range gpus {
		if on := g.Index == 3; g.MigMode.Current != on || (len(g.Instances) == 7) != on {
			t.Errorf("GPU %d: MIG %v with %d instances", g.Index, g.MigMode.Current, len(g.Instances))
		}
	}
	if m := a.Scrape(t); !strings.Contains(m, "migagent_evicted_pods_total 2\n") {
		t.Errorf("metrics lack migagent_evicted_pods_total 2:\n%s", disGrep(m, "evicted"))
	}
	if disTainted(GetNode(t, c, o.Node)) {
		t.Error("the reconfiguring taint is still on the node")
	}
	t.Logf("SCENARIO 8 GPUs x 2 pods, GPU 3 changed: mig-agent evicted %d pods, %d kept running; a whole-node drain evicts 16; took %s",
		len(rec.EvictedPods), len(live), took.Round(time.Millisecond))
}

// A3, A7: without PodResources every GPU pod of the node counts as
// affected, and the record says why.
func TestDisruptionWithoutPodResourcesEvictsAllGPUPods(t *testing.T) {
	c := kubetest.Client(t)
	o, ns, kl := disEightGPUs(t, false)
	// A pod with no GPU stays whatever happens.
	kl.RunPod(t, ns, "cpu-only", map[string]string{"cpu": "1"}, nil, disOwner("web"))
	StartAgent(t, o)
	SelectConfig(t, c, o.Node, "gpu3-mig")
	rec := WaitState(t, c, o.Node, record.StateSuccess, "gpu3-mig", 90*time.Second)
	if len(rec.EvictedPods) != 16 {
		t.Errorf("evicted %d pods, want all 16 GPU pods: %v", len(rec.EvictedPods), rec.EvictedPods)
	}
	if !strings.HasPrefix(rec.AffectedBy, "all-gpu-pods: ") || !strings.Contains(rec.AffectedBy, "no-kubelet.sock") {
		t.Errorf("affectedBy = %q, want all-gpu-pods: and why (the socket)", rec.AffectedBy)
	}
	if live := disLivePods(t, c, ns); !slices.Equal(live, []string{"cpu-only"}) {
		t.Errorf("pods left: %v, want only cpu-only", live)
	}
	if !slices.Equal(rec.GPUsChanged, []int{3}) {
		t.Errorf("gpusChanged = %v", rec.GPUsChanged)
	}
	t.Logf("SCENARIO without PodResources: %d pods evicted; affectedBy %q", len(rec.EvictedPods), rec.AffectedBy)
}

// A2: a change inside a MIG GPU evicts only the pods on the destroyed
// instances; the pods on instances that stay keep running.
func TestDisruptionOnlyDestroyedMIGDevices(t *testing.T) { onlyDestroyedMIGDevices(t, "") }

// TestAgentOverNVMLLibraryEvictsOnlyDestroyedMIGDevices is the same change
// with the agent on its production NVML path: --nvml real over the
// simulator built as libnvidia-ml.so.1 (make simlib), the cgo code that
// runs on customers' nodes; the test reads the GPUs through the in-process
// simulator on the same state file, as a second process on one driver.
func TestAgentOverNVMLLibraryEvictsOnlyDestroyedMIGDevices(t *testing.T) {
	onlyDestroyedMIGDevices(t, simlibtest.Library(t))
}

// onlyDestroyedMIGDevices: GPU 0 goes from seven 1g.18gb to four and a
// 3g.71gb; only the pods on the three destroyed devices are evicted, the
// others keep their devices (same UUIDs), GPU 1 is untouched.
func onlyDestroyedMIGDevices(t *testing.T, library string) {
	c := kubetest.Client(t)
	node, kl, ns := kubeletNode(t)
	cfg := disConfig(t, `version: v1
mig-configs:
  gpu0-mixed:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "1g.18gb": 4
        "3g.71gb": 1
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "1g.18gb": 7
`)
	o := &Opts{Node: node, Sim: "h200x2", Library: library, Extra: []string{"-f", cfg, "--pod-resources-socket", kl.Socket()}}
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 30*time.Second)

	gpus := disProfiles(t, o.Sim, o.SimState)
	onGPU := map[int]int{}
	for _, g := range gpus {
		if len(g.Instances) != 7 {
			t.Fatalf("GPU %d has %d instances after all-1g.18gb", g.Index, len(g.Instances))
		}
		for _, in := range g.Instances {
			if g.Index == 1 && in.Start > 1 {
				continue // two pods on GPU 1, which does not change
			}
			kl.RunPod(t, ns, fmt.Sprintf("g%d-mig%d", g.Index, in.Start), map[string]string{"nvidia.com/mig-1g.18gb": "1"},
				map[string][]string{"nvidia.com/mig-1g.18gb": {in.UUID}}, disOwner("infer"))
			onGPU[g.Index]++
		}
	}
	out, errOut, code := RunCLI(t, "plan", "-f", cfg, "-c", "gpu0-mixed", "-o", "json", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState, "--log-level", "error")
	if code != 0 {
		t.Fatalf("plan: %d %s", code, errOut)
	}
	var plan struct {
		GPUs []struct {
			Index   int    `json:"index"`
			Action  string `json:"action"`
			Destroy []struct {
				Profile string `json:"profile"`
				Start   int    `json:"start"`
			} `json:"destroy"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatal(err)
	}
	if len(plan.GPUs) != 2 || len(plan.GPUs[0].Destroy) != 3 || plan.GPUs[1].Action != "untouched" {
		t.Fatalf("plan: %s", out)
	}

	SelectConfig(t, c, node, "gpu0-mixed")
	rec := WaitState(t, c, node, record.StateSuccess, "gpu0-mixed", 60*time.Second)
	var want []string
	for _, d := range plan.GPUs[0].Destroy {
		want = append(want, fmt.Sprintf("%s/g0-mig%d", ns, d.Start))
	}
	slices.Sort(want)
	if got := slices.Sorted(slices.Values(rec.EvictedPods)); !slices.Equal(got, want) {
		t.Errorf("evictedPods = %v, want %v", got, want)
	}
	live := disLivePods(t, c, ns)
	wantLive := []string{"g0-mig0", "g0-mig1", "g0-mig2", "g0-mig3", "g1-mig0", "g1-mig1"}
	if !slices.Equal(live, wantLive) {
		t.Errorf("running pods %v, want %v", live, wantLive)
	}
	after := disProfiles(t, o.Sim, o.SimState)
	before0, after0 := disMIGUUIDs(gpus[0]), disMIGUUIDs(after[0])
	for i := range 4 {
		k := fmt.Sprintf("1g.18gb@%d", i)
		if before0[k] == "" || before0[k] != after0[k] {
			t.Errorf("MIG device %s of GPU 0 changed: %q → %q", k, before0[k], after0[k])
		}
	}
	if after0["3g.71gb@4"] == "" || len(after0) != 5 {
		t.Errorf("GPU 0 after: %v", after0)
	}
	t.Logf("SCENARIO GPU 0 7x1g.18gb -> 4x1g.18gb+3g.71gb: %d pods evicted of %d on that GPU (%d on the node); %d destroyed instances",
		len(rec.EvictedPods), onGPU[0], onGPU[0]+onGPU[1], len(plan.GPUs[0].Destroy))
}

// disOperandLabels are the GPU Operator deploy labels of the tests: one on,
// one turned off on purpose, the others absent.
var disOperandLabels = map[string]string{
	"nvidia.com/gpu.deploy.device-plugin": "true",
	"nvidia.com/gpu.deploy.dcgm":          "false",
}

// disOperands returns the node's nvidia.com/gpu.deploy.* labels.
func disOperands(n *corev1.Node) map[string]string {
	out := map[string]string{}
	for k, v := range n.Labels {
		if strings.HasPrefix(k, "nvidia.com/gpu.deploy.") {
			out[k] = v
		}
	}
	return out
}

func disSameLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// disGuardedNode is an H200x2 node, MIG off, with the operand labels, one pod
// ("guarded", app=db) on GPU 1 under a budget that allows no disruption,
// and a pod on GPU 0. The config "gpu1-mig" changes GPU 1 only.
func disGuardedNode(t *testing.T, extra ...string) (*Opts, string) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	labels := map[string]string{}
	for k, v := range disOperandLabels {
		labels[k] = v
	}
	kubetest.CreateNode(t, node, labels)
	kl := kubetest.StartKubelet(t, c, node)
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	o := (&Opts{Node: node, Sim: "h200x2"}).Fill(t)
	gpus := disProfiles(t, o.Sim, o.SimState)
	kl.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guarded", Labels: map[string]string{"app": "db"},
			OwnerReferences: []metav1.OwnerReference{*disOwner("db")}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: kubetest.PodContainer, Image: "db",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
	})
	guarded := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guarded"}}
	kl.Assign(guarded, kubetest.PodContainer, "nvidia.com/gpu", gpus[1].UUID)
	kl.RunPod(t, ns, "other", map[string]string{"nvidia.com/gpu": "1"}, map[string][]string{"nvidia.com/gpu": {gpus[0].UUID}}, disOwner("other"))
	disCreatePDB(t, c, ns, "db", 0)
	cfg := disConfig(t, `version: v1
mig-configs:
  gpu1-mig:
    - devices: [0]
      mig-enabled: false
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "3g.71gb": 2
`)
	o.Extra = append([]string{"-f", cfg, "--pod-resources-socket", kl.Socket(), "--pause-gpu-operator",
		"--eviction-retry-delay", "500ms"}, extra...)
	return o, ns
}

// A4, A5: a budget that forbids the eviction fails the change after the
// drain timeout, naming the pod, with no GPU touched and everything
// restored; once the budget allows it, the retry succeeds by itself.
func TestDisruptionPDBBlocksThenRetrySucceeds(t *testing.T) {
	c := kubetest.Client(t)
	o, ns := disGuardedNode(t, "--drain-timeout", "3s", "--retry-backoff-max", "5s")
	StartAgent(t, o)
	SelectConfig(t, c, o.Node, "all-disabled")
	WaitState(t, c, o.Node, record.StateSuccess, "all-disabled", 30*time.Second)

	SelectConfig(t, c, o.Node, "gpu1-mig")
	// While it drains: disTainted, device-plugin paused, dcgm (false) left alone.
	WaitFor(t, 20*time.Second, "operands paused and node disTainted", func() bool {
		n := GetNode(t, c, o.Node)
		return disTainted(n) && disSameLabels(disOperands(n), map[string]string{
			"nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change", "nvidia.com/gpu.deploy.dcgm": "false"})
	})
	rec := WaitState(t, c, o.Node, record.StateFailed, "gpu1-mig", 30*time.Second)
	failedAt := time.Now()
	if !strings.Contains(rec.Reason, ns+"/guarded") {
		t.Errorf("reason does not name the pod: %q", rec.Reason)
	}
	if len(rec.EvictedPods) != 0 {
		t.Errorf("evictedPods = %v", rec.EvictedPods)
	}
	n := GetNode(t, c, o.Node)
	if disTainted(n) {
		t.Error("taint left after the failure")
	}
	if got := disOperands(n); !disSameLabels(got, disOperandLabels) {
		t.Errorf("operand labels after the failure = %v, want %v", got, disOperandLabels)
	}
	for _, g := range disProfiles(t, o.Sim, o.SimState) {
		if g.MigMode.Current || g.MigMode.Pending || len(g.Instances) > 0 {
			t.Errorf("GPU %d touched by a failed change: %+v", g.Index, g)
		}
	}
	if live := disLivePods(t, c, ns); !slices.Equal(live, []string{"guarded", "other"}) {
		t.Errorf("pods: %v", live)
	}
	t.Logf("failed as expected: %s", rec.Reason)

	disSetPDB(t, c, ns, "db", 1)
	rec = WaitState(t, c, o.Node, record.StateSuccess, "gpu1-mig", 40*time.Second)
	t.Logf("succeeded by itself %s after the failure", time.Since(failedAt).Round(time.Millisecond))
	if !slices.Equal(rec.EvictedPods, []string{ns + "/guarded"}) {
		t.Errorf("evictedPods = %v", rec.EvictedPods)
	}
	n = GetNode(t, c, o.Node)
	if disTainted(n) {
		t.Error("taint left after the success")
	}
	if got := disOperands(n); !disSameLabels(got, disOperandLabels) {
		t.Errorf("operand labels after the success = %v, want %v", got, disOperandLabels)
	}
	if live := disLivePods(t, c, ns); !slices.Equal(live, []string{"other"}) {
		t.Errorf("pods: %v", live)
	}
	hist := History(t, n)
	var results []string
	for _, h := range hist {
		if h.Config == "gpu1-mig" {
			results = append(results, h.Result)
		}
	}
	if len(results) < 2 || results[0] != record.StateSuccess || !slices.Contains(results[1:], record.StateFailed) {
		t.Errorf("history of gpu1-mig (newest first) = %v, want success after failed", results)
	}
}

// A5: killed (SIGKILL) while an eviction is blocked, the agent leaves the
// taint and the paused labels behind; restarted, it resumes from its
// journal, finishes, and restores exactly what it found.
func TestDisruptionCrashWhileDrainingResumes(t *testing.T) {
	c := kubetest.Client(t)
	o, ns := disGuardedNode(t, "--drain-timeout", "60s")
	a := StartAgent(t, o)
	SelectConfig(t, c, o.Node, "gpu1-mig")
	WaitFor(t, 20*time.Second, "a blocked eviction", func() bool {
		n := GetNode(t, c, o.Node)
		return disTainted(n) && disOperands(n)["nvidia.com/gpu.deploy.device-plugin"] == "paused-for-mig-change" &&
			strings.Contains(a.Log(), "evicting pods")
	})
	time.Sleep(500 * time.Millisecond) // in the eviction retry loop
	a.Kill()
	n := GetNode(t, c, o.Node)
	if !disTainted(n) || n.Labels[record.LabelState] != record.StatePending {
		t.Fatalf("after the kill: disTainted %v, state %q", disTainted(n), n.Labels[record.LabelState])
	}
	journal, err := os.ReadFile(filepath.Join(o.StateDir, "journal.json"))
	if err != nil || !strings.Contains(string(journal), `"phase": "draining"`) {
		t.Fatalf("journal after the kill (%v):\n%s", err, journal)
	}
	disSetPDB(t, c, ns, "db", 1)
	a2 := StartAgent(t, o)
	rec := WaitState(t, c, o.Node, record.StateSuccess, "gpu1-mig", 40*time.Second)
	if !slices.Equal(rec.EvictedPods, []string{ns + "/guarded"}) {
		t.Errorf("evictedPods = %v", rec.EvictedPods)
	}
	n = GetNode(t, c, o.Node)
	if disTainted(n) {
		t.Error("taint left after the resumed change")
	}
	if got := disOperands(n); !disSameLabels(got, disOperandLabels) {
		t.Errorf("operand labels after the resumed change = %v, want %v", got, disOperandLabels)
	}
	if !strings.Contains(a2.Log(), "resuming change") {
		t.Error("the restarted agent did not say it resumed the change")
	}
	if g := disProfiles(t, o.Sim, o.SimState); !g[1].MigMode.Current || len(g[1].Instances) != 2 || g[0].MigMode.Current {
		t.Errorf("geometry after the resumed change: %+v", g)
	}
}

// A6: host GPU clients are stopped over D-Bus before a MIG mode change and
// started after it, in reverse order; a change with no mode change leaves
// them alone.
func TestDisruptionHostGPUClientsOverDBus(t *testing.T) {
	c := kubetest.Client(t)
	bus := dbustest.Start(t)
	sd := bus.StartSystemd1(t)
	sd.AddUnit(t, "a.service", "active")
	sd.AddUnit(t, "b.service", "active")
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	a := StartAgent(t, &Opts{Node: node, Sim: "a100-40gbx2",
		Extra: []string{"--dbus-address", bus.Address, "--host-gpu-clients", "a.service,b.service"}})
	SelectConfig(t, c, node, "all-1g.5gb")
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.5gb", 30*time.Second)
	if rec.Reboot {
		t.Errorf("reboot in the record: %+v", rec)
	}
	want := []string{"StopUnit(a.service, replace)", "StopUnit(b.service, replace)",
		"StartUnit(b.service, replace)", "StartUnit(a.service, replace)"}
	if got := sd.JobCalls(); !slices.Equal(got, want) {
		t.Errorf("systemd jobs = %v, want %v", got, want)
	}
	for _, u := range []string{"a.service", "b.service"} {
		if s := sd.ActiveState(u); s != "active" {
			t.Errorf("%s is %s after the change", u, s)
		}
	}
	log := a.Log()
	stop := strings.LastIndex(log, `msg="stopping host GPU client" unit=b.service`)
	enable := strings.Index(log, `step="enabling MIG mode"`)
	reset := strings.Index(log, `step="resetting the GPU"`)
	lastCreate := strings.LastIndex(log, `step="creating 1g.5gb@6"`)
	start := strings.Index(log, `msg="starting host GPU client" unit=b.service`)
	if stop < 0 || enable < 0 || reset < 0 || lastCreate < 0 || start < 0 ||
		!(stop < enable && enable < reset && reset < lastCreate && lastCreate < start) {
		t.Errorf("order in the log: stop %d, enable %d, reset %d, last create %d, start %d", stop, enable, reset, lastCreate, start)
	}

	SelectConfig(t, c, node, "all-balanced")
	WaitState(t, c, node, record.StateSuccess, "all-balanced", 30*time.Second)
	if got := sd.JobCalls(); !slices.Equal(got, want) {
		t.Errorf("a change without a mode change queued systemd jobs: %v", got[len(want):])
	}
}

func disGrep(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
