package e2e

// Proof under faults (issue 9): injected NVML failures at every call of
// every mutating operation, SIGKILL at every journaled step, an API server
// outage mid-change. Each run must end in success after a retry, or failed
// with a reason that names the GPU; GPUs and pods the change does not
// touch stay as they were.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/profiles"
	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// ffCall is one mutating NVML call: the --sim-faults operation name and
// the GPU it was made on.
type ffCall struct {
	op  string
	gpu int
}

// ffRecorder records the mutating calls made through it, under the names
// --sim-faults counts them by (a GPU instance creation counts under both
// of its names, as the simulator counts it).
type ffRecorder struct {
	nvmlx.GPU
	calls []ffCall
}

var _ nvmlx.GPU = (*ffRecorder)(nil)

func (r *ffRecorder) add(gpu int, ops ...string) {
	for _, op := range ops {
		r.calls = append(r.calls, ffCall{op, gpu})
	}
}

func (r *ffRecorder) SetMigMode(gpu int, enabled bool) (nvmlx.MigMode, error) {
	r.add(gpu, nvmlsim.OpSetMigMode)
	return r.GPU.SetMigMode(gpu, enabled)
}

func (r *ffRecorder) CreateGPUInstance(gpu, profileID int, at profiles.Placement) (int, error) {
	r.add(gpu, nvmlsim.OpCreateGpuInstanceWithPlacement, nvmlsim.OpCreateGpuInstance)
	return r.GPU.CreateGPUInstance(gpu, profileID, at)
}

func (r *ffRecorder) CreateComputeInstance(gpu, gi, ciProfileIndex int) (nvmlx.ComputeInstance, error) {
	r.add(gpu, nvmlsim.OpCreateComputeInstance)
	return r.GPU.CreateComputeInstance(gpu, gi, ciProfileIndex)
}

func (r *ffRecorder) DestroyComputeInstance(gpu, gi, ci int) error {
	r.add(gpu, nvmlsim.OpComputeInstanceDestroy)
	return r.GPU.DestroyComputeInstance(gpu, gi, ci)
}

func (r *ffRecorder) DestroyGPUInstance(gpu, gi int) error {
	r.add(gpu, nvmlsim.OpGpuInstanceDestroy)
	return r.GPU.DestroyGPUInstance(gpu, gi)
}

func (r *ffRecorder) ResetGPU(gpu int) error {
	r.add(gpu, nvmlsim.OpResetGpu)
	return r.GPU.ResetGPU(gpu)
}

// ffOps are the operations --sim-faults knows, with the NVML errors the
// matrix injects into each: what the driver answers when resources or the
// GPU are busy, and the catch-all.
var ffOps = []struct {
	op     string
	errors []string
}{
	{nvmlsim.OpGpuInstanceDestroy, []string{"ERROR_IN_USE", "ERROR_UNKNOWN"}},
	{nvmlsim.OpComputeInstanceDestroy, []string{"ERROR_IN_USE", "ERROR_UNKNOWN"}},
	{nvmlsim.OpSetMigMode, []string{"ERROR_IN_USE", "ERROR_UNKNOWN"}},
	{nvmlsim.OpResetGpu, []string{"ERROR_IN_USE", "ERROR_UNKNOWN"}},
	{nvmlsim.OpCreateGpuInstanceWithPlacement, []string{"ERROR_INSUFFICIENT_RESOURCES", "ERROR_UNKNOWN"}},
	{nvmlsim.OpCreateGpuInstance, []string{"ERROR_INSUFFICIENT_RESOURCES", "ERROR_UNKNOWN"}},
	{nvmlsim.OpCreateComputeInstance, []string{"ERROR_INSUFFICIENT_RESOURCES", "ERROR_UNKNOWN"}},
}

// ffTransition is one representative change.
type ffTransition struct {
	name     string
	spec     string // sim spec
	from     string // config applied first ("" = fresh: MIG off)
	config   string // the change
	file     string // config file text ("" = generated configs only)
	simFlags []string
}

var ffTransitions = []ffTransition{
	{name: "h200x8 all-1g.18gb to all-balanced", spec: "h200x8", from: "all-1g.18gb", config: "all-balanced"},
	{name: "a100-40gbx2 all-disabled to all-balanced", spec: "a100-40gbx2", config: "all-balanced"},
	{name: "h200x8 two of eight GPUs change", spec: "h200x8", from: "all-1g.18gb", config: "two-gpus", file: ffTwoGPUs},
}

// ffTwoGPUs changes GPUs 2 and 5 of an all-1g.18gb H200 node to balanced
// and keeps the others.
const ffTwoGPUs = `version: v1
mig-configs:
  two-gpus:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 7}
    - devices: [2, 5]
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
  gpu0-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 7}
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
`

// ffShape is the geometry of one GPU without identities: MIG mode and the
// GPU instances (profile id, placement, compute profile ids), sorted.
// ffMode is the MIG mode part of ffShape ("mig=current/pending").
func ffMode(g flSimGPU) string { return strings.Fields(ffShape(g))[0] }

func ffShape(g flSimGPU) string {
	var parts []string
	for _, gi := range g.Instances {
		var cis []string
		for _, ci := range gi.ComputeInstances {
			cis = append(cis, fmt.Sprint(ci.ProfileID))
		}
		slices.Sort(cis)
		parts = append(parts, fmt.Sprintf("%d@%d+%d[%s]", gi.ProfileID, gi.Placement.Start, gi.Placement.Size, strings.Join(cis, ",")))
	}
	slices.Sort(parts)
	return fmt.Sprintf("mig=%v/%v %s", g.MigCurrent, g.MigPending, strings.Join(parts, " "))
}

// ffUUIDs lists the MIG device UUIDs of a GPU.
func ffUUIDs(g flSimGPU) []string {
	var out []string
	for _, gi := range g.Instances {
		for _, ci := range gi.ComputeInstances {
			out = append(out, ci.UUID)
		}
	}
	slices.Sort(out)
	return out
}

// ffReference applies tr once, in process, on a copy of base, recording
// the mutating calls; it returns them, the final state and the plan.
func ffReference(t *testing.T, tr ffTransition, base, fileName string) ([]ffCall, flSim, *geometry.Plan) {
	t.Helper()
	state := filepath.Join(t.TempDir(), "ref.json")
	raw, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(state, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	sim, err := nvmlx.NewSim(tr.spec, nvmlsim.Options{StatePath: state})
	if err != nil {
		t.Fatal(err)
	}
	rec := &ffRecorder{GPU: sim}
	n, err := gpus.Discover(rec)
	if err != nil {
		t.Fatal(err)
	}
	file, err := gpus.LoadConfigFile(fileName)
	if err != nil {
		t.Fatal(err)
	}
	spec, _, err := gpus.Lookup(file, tr.config, n.GPUs)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := geometry.BuildPlan(spec, tr.config, n.GPUs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gpus.ApplyAndVerify(rec, n, plan, file, tr.config, gpus.ApplyOptions{}); err != nil {
		t.Fatalf("reference apply: %v", err)
	}
	muts := sim.Mutations()
	for _, o := range ffOps {
		if o.op == nvmlsim.OpCreateGpuInstance {
			continue // counted under CreateGpuInstanceWithPlacement
		}
		n := 0
		for _, c := range rec.calls {
			if c.op == o.op {
				n++
			}
		}
		if muts[o.op] != n {
			t.Fatalf("%s: the simulator counts %d mutations, the recorder %d calls", o.op, muts[o.op], n)
		}
	}
	return rec.calls, flReadSim(t, state), plan
}

// TestFaultMatrix injects each NVML error at every call position of every
// mutating operation of representative changes, in a fresh `apply` each,
// then applies again without faults (the retry).
func TestFaultMatrix(t *testing.T) {
	runs := 0
	for _, tr := range ffTransitions {
		t.Run(tr.name, func(t *testing.T) {
			var base string
			if tr.from != "" {
				base = flPrepareSim(t, tr.spec, tr.from)
			} else {
				base = filepath.Join(t.TempDir(), "base.json")
				if _, stderr, code := RunCLI(t, "export", "--nvml", "sim:"+tr.spec, "--sim-state", base); code != 0 {
					t.Fatal(stderr)
				}
			}
			baseRaw, _ := os.ReadFile(base)
			before := flReadSim(t, base)
			var fileArgs []string
			fileName := ""
			if tr.file != "" {
				fileName = disConfig(t, tr.file)
				fileArgs = []string{"-f", fileName}
			}
			calls, ref, plan := ffReference(t, tr, base, fileName)
			changed := map[int]bool{}
			for _, gp := range plan.GPUs {
				changed[gp.Index] = gp.Action == geometry.ActionChange
			}
			byOp := map[string][]int{}
			for _, c := range calls {
				byOp[c.op] = append(byOp[c.op], c.gpu)
			}
			counts := map[string]int{}
			for op, g := range byOp {
				counts[op] = len(g)
			}
			t.Logf("mutating calls without faults: %v", counts)
			dir := t.TempDir()
			apply := func(state string, faults string) (string, int) {
				args := append([]string{"apply", "-c", tr.config, "--nvml", "sim:" + tr.spec, "--sim-state", state}, fileArgs...)
				args = append(args, tr.simFlags...)
				if faults != "" {
					args = append(args, "--sim-faults", faults)
				}
				_, stderr, code := RunCLI(t, args...)
				return stderr, code
			}
			for _, o := range ffOps {
				// One past the last call: the fault never fires, so the
				// count is complete.
				state := filepath.Join(dir, "past.json")
				_ = os.WriteFile(state, baseRaw, 0o644)
				if stderr, code := apply(state, fmt.Sprintf("%s:%d=ERROR_UNKNOWN", o.op, len(byOp[o.op])+1)); code != 0 {
					t.Errorf("%s:%d (past the last call): exit %d: %s", o.op, len(byOp[o.op])+1, code, stderr)
				}
				runs++
				for n, gpu := range byOp[o.op] {
					for _, nvErr := range o.errors {
						fault := fmt.Sprintf("%s:%d=%s", o.op, n+1, nvErr)
						state := filepath.Join(dir, "run.json")
						_ = os.WriteFile(state, baseRaw, 0o644)
						runs++
						stderr, code := apply(state, fault)
						switch {
						case code == 1:
							want := fmt.Sprintf("GPU %d left partly applied", gpu)
							if !strings.Contains(stderr, want) || !strings.Contains(stderr, nvErr) || !strings.Contains(stderr, fault[:strings.Index(fault, "=")]) {
								t.Errorf("%s: message lacks %q, the error or the fault:\n%s", fault, want, stderr)
							}
						case code == 3 && o.op == nvmlsim.OpResetGpu:
							// The reset failed: the mode change waits for a
							// reboot (docs/reference.md#disruption-and-reboot), and the message says so.
							if !strings.Contains(stderr, fmt.Sprintf("GPUs [%d]", gpu)) || !strings.Contains(stderr, "reboot") {
								t.Errorf("%s: exit 3 without naming GPU %d: %s", fault, gpu, stderr)
							}
						default:
							t.Errorf("%s: exit %d (want 1, or 3 for a reset): %s", fault, code, stderr)
							continue
						}
						// apply works as nvidia-mig-parted's does: first the
						// MIG mode of every GPU, then the MIG devices of every
						// GPU (pkg/mig/config ApplyMigConfigWithHooks order:
						// pre-apply-mode, mode, pre-apply-config, config). A
						// failure stops the apply at that GPU of that step;
						// a mode change that waits for a reboot (exit 3)
						// ends it after the mode step: instances made before
						// a reboot would not survive it.
						modeStep := o.op == nvmlsim.OpSetMigMode || o.op == nvmlsim.OpResetGpu
						mid := flReadSim(t, state)
						for i := range mid.GPUs {
							unchanged := !changed[i] || code == 1 && modeStep && i > gpu
							switch {
							case unchanged:
								if !reflect.DeepEqual(mid.GPUs[i], before.GPUs[i]) {
									t.Errorf("%s: GPU %d, not reached, changed:\nbefore %s\nafter  %s", fault, i, ffShape(before.GPUs[i]), ffShape(mid.GPUs[i]))
								}
							case i == gpu:
							case code == 1 && !modeStep && i < gpu:
								if ffShape(mid.GPUs[i]) != ffShape(ref.GPUs[i]) {
									t.Errorf("%s: GPU %d, done before the fault, is not as planned: %s, want %s", fault, i, ffShape(mid.GPUs[i]), ffShape(ref.GPUs[i]))
								}
							default:
								// The mode step reached this GPU; its devices
								// come in the second step.
								if ffMode(mid.GPUs[i]) != ffMode(ref.GPUs[i]) {
									t.Errorf("%s: GPU %d, mode step done before the fault, is not as planned: %s, want %s", fault, i, ffShape(mid.GPUs[i]), ffShape(ref.GPUs[i]))
								}
							}
						}
						// The retry.
						if stderr, code := apply(state, ""); code != 0 {
							t.Errorf("%s: retry: exit %d: %s", fault, code, stderr)
							continue
						}
						after := flReadSim(t, state)
						for i := range after.GPUs {
							if ffShape(after.GPUs[i]) != ffShape(ref.GPUs[i]) {
								t.Errorf("%s: after the retry GPU %d is %s, want %s", fault, i, ffShape(after.GPUs[i]), ffShape(ref.GPUs[i]))
							}
							if !changed[i] && !reflect.DeepEqual(after.GPUs[i], before.GPUs[i]) {
								t.Errorf("%s: untouched GPU %d changed (instance UUIDs %v → %v)", fault, i, ffUUIDs(before.GPUs[i]), ffUUIDs(after.GPUs[i]))
							}
							// What the plan keeps survives the fault and the retry.
							for _, u := range ffUUIDs(ref.GPUs[i]) {
								if slices.Contains(ffUUIDs(before.GPUs[i]), u) && !slices.Contains(ffUUIDs(after.GPUs[i]), u) {
									t.Errorf("%s: GPU %d: kept MIG device %s was recreated or lost", fault, i, u)
								}
							}
						}
					}
				}
			}
		})
	}
	t.Logf("fault matrix: %d apply runs with faults (each followed by a retry when it fired)", runs)
}

// ffPod is a pod of a scene: which GPU it uses and how — "destroy": a MIG
// device the change destroys, "keep": one it keeps, "whole": the whole GPU.
type ffPod struct {
	name string
	gpu  int
	use  string
}

// ffScene is a node with a kubelet, pods on its GPUs, and the options of
// its agent (not started).
type ffScene struct {
	c      kubernetes.Interface
	node   string
	ns     string
	k      *kubetest.Kubelet
	o      *Opts
	target string
	base   flSim
	pods   []ffPod
	// changed lists the GPUs the change touches.
	changed map[int]bool
}

type ffPlanJSON struct {
	GPUs []struct {
		Index   int                 `json:"index"`
		Action  string              `json:"action"`
		Destroy []geometry.Instance `json:"destroy"`
		Keep    []geometry.Instance `json:"keep"`
	} `json:"gpus"`
}

type ffProfilesJSON struct {
	GPUs []struct {
		UUID      string `json:"uuid"`
		Instances []struct {
			Profile string `json:"profile"`
			Start   int    `json:"start"`
			UUID    string `json:"uuid"`
		} `json:"instances"`
	} `json:"gpus"`
}

// ffSetup builds a scene: spec's GPUs prepared with from (and the node
// labelled from), the change to target, pods placed as asked.
func ffSetup(t *testing.T, spec, from, fileText, target string, pods []ffPod, extra ...string) *ffScene {
	t.Helper()
	c := kubetest.Client(t)
	sc := &ffScene{c: c, target: target, pods: pods, changed: map[int]bool{}}
	var state string
	if from != "" {
		state = flPrepareSim(t, spec, from)
	} else {
		state = filepath.Join(t.TempDir(), "sim.json")
		if _, stderr, code := RunCLI(t, "export", "--nvml", "sim:"+spec, "--sim-state", state); code != 0 {
			t.Fatal(stderr)
		}
	}
	sc.base = flReadSim(t, state)
	sim := []string{"--nvml", "sim:" + spec, "--sim-state", state}
	var fileArgs []string
	if fileText != "" {
		fileArgs = []string{"-f", disConfig(t, fileText)}
	}
	out, stderr, code := RunCLI(t, append(append([]string{"plan", "-o", "json", "-c", target}, fileArgs...), sim...)...)
	var plan ffPlanJSON
	if code != 0 || json.Unmarshal([]byte(out), &plan) != nil {
		t.Fatalf("plan: exit %d: %s", code, stderr)
	}
	out, stderr, code = RunCLI(t, append([]string{"profiles", "-o", "json"}, sim...)...)
	var prof ffProfilesJSON
	if code != 0 || json.Unmarshal([]byte(out), &prof) != nil {
		t.Fatalf("profiles: exit %d: %s", code, stderr)
	}
	for _, g := range plan.GPUs {
		sc.changed[g.Index] = g.Action == geometry.ActionChange
	}
	sc.node = kubetest.NewName(t, "node")
	var labels map[string]string
	if from != "" {
		labels = map[string]string{record.LabelConfig: from}
	}
	kubetest.CreateNode(t, sc.node, labels)
	sc.ns = kubetest.NewName(t, "work")
	kubetest.CreateNamespace(t, sc.ns)
	sc.k = kubetest.StartKubelet(t, c, sc.node)
	used := map[string]int{}
	for _, p := range pods {
		var res, dev string
		switch p.use {
		case "whole":
			res, dev = "nvidia.com/gpu", prof.GPUs[p.gpu].UUID
		case "destroy", "keep":
			list := plan.GPUs[p.gpu].Destroy
			if p.use == "keep" {
				list = plan.GPUs[p.gpu].Keep
			}
			key := fmt.Sprintf("%d/%s", p.gpu, p.use)
			if used[key] >= len(list) {
				t.Fatalf("pod %s: GPU %d has only %d instances to %s", p.name, p.gpu, len(list), p.use)
			}
			in := list[used[key]]
			used[key]++
			for _, x := range prof.GPUs[p.gpu].Instances {
				if x.Profile == in.Profile && x.Start == in.Start {
					res, dev = "nvidia.com/mig-"+in.Profile, x.UUID
				}
			}
		}
		if dev == "" {
			t.Fatalf("pod %s: no device", p.name)
		}
		sc.k.RunPod(t, sc.ns, p.name, map[string]string{res: "1"}, map[string][]string{res: {dev}}, rsOwnerRef(p.name))
	}
	sc.o = &Opts{Node: sc.node, Sim: spec, SimState: state,
		Extra: append(append(fileArgs, "--pod-resources-socket", sc.k.Socket()), extra...)}
	return sc
}

// rsOwnerRef makes a pod look managed by a ReplicaSet, as workloads are.
func rsOwnerRef(name string) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name + "-rs",
		UID: "00000000-0000-0000-0000-000000000001", Controller: ptr.To(true)}
}

// evicted reports whether the change must evict pod p.
func (sc *ffScene) evicted(p ffPod) bool {
	return sc.changed[p.gpu] && (p.use == "destroy" || p.use == "whole")
}

// check verifies the end of a scene: success on target, nothing left to
// do, untouched GPUs identical, exactly the affected pods evicted, each
// once, and no eviction requested twice (one eviction Event per pod).
func (sc *ffScene) check(t *testing.T) record.ChangeRecord {
	t.Helper()
	n := GetNode(t, sc.c, sc.node)
	rec := LastChange(t, n)
	if rec.Config != sc.target || rec.Result != record.StateSuccess || n.Labels[record.LabelState] != record.StateSuccess {
		t.Errorf("end: state %s, record %s %s", n.Labels[record.LabelState], rec.Config, rec.Result)
	}
	for _, taint := range n.Spec.Taints {
		if strings.HasPrefix(taint.Key, "migagent.io/") {
			t.Errorf("taint left: %v", taint)
		}
	}
	after := flReadSim(t, sc.o.SimState)
	for i := range after.GPUs {
		if !sc.changed[i] && !reflect.DeepEqual(after.GPUs[i], sc.base.GPUs[i]) {
			t.Errorf("untouched GPU %d changed: %v → %v", i, ffUUIDs(sc.base.GPUs[i]), ffUUIDs(after.GPUs[i]))
		}
	}
	finished := sc.k.Finished()
	events := flEvents(t, sc.c, sc.node, record.ReasonEvicting)
	for _, p := range sc.pods {
		key := sc.ns + "/" + p.name
		times := 0
		for _, f := range finished {
			if f == key {
				times++
			}
		}
		inEvents := 0
		for _, e := range events {
			if strings.Contains(e.Message, key) {
				inEvents++
			}
		}
		want := 0
		if sc.evicted(p) {
			want = 1
		}
		if times != want || inEvents != want {
			t.Errorf("pod %s (%s on GPU %d): finished %d times, in %d eviction events; want %d", key, p.use, p.gpu, times, inEvents, want)
		}
		_, err := sc.c.CoreV1().Pods(sc.ns).Get(context.Background(), p.name, metav1.GetOptions{})
		if gone := apierrors.IsNotFound(err); gone != (want == 1) {
			t.Errorf("pod %s: gone %v, want %v (%v)", key, gone, want == 1, err)
		}
	}
	return rec
}

// TestFaultDaemonRetry: the daemon meets an injected NVML failure, reports
// failed with the reason naming the GPU, and its retry (the fault fires
// once per process) succeeds; pods on GPUs and MIG devices the change does
// not take away are never evicted.
func TestFaultDaemonRetry(t *testing.T) {
	h200Pods := []ffPod{{"untouched", 0, "keep"}, {"kept", 2, "keep"}, {"doomed", 2, "destroy"}, {"doomed-5", 5, "destroy"}}
	tests := []struct {
		name, spec, from, file, target, fault string
		pods                                  []ffPod
		gpu                                   int
	}{
		{"GPU instance destroy in use", "h200x8", "all-1g.18gb", ffTwoGPUs, "two-gpus", "GpuInstance.Destroy:1=ERROR_IN_USE", h200Pods, 2},
		{"GPU instance create on the second GPU", "h200x8", "all-1g.18gb", ffTwoGPUs, "two-gpus", "CreateGpuInstanceWithPlacement:3=ERROR_INSUFFICIENT_RESOURCES", h200Pods, 5},
		{"compute instance create", "h200x8", "all-1g.18gb", ffTwoGPUs, "two-gpus", "CreateComputeInstance:2=ERROR_UNKNOWN", h200Pods, 2},
		{"A100 MIG mode in use", "a100-40gbx2", "", "", "all-balanced", "SetMigMode:2=ERROR_IN_USE", []ffPod{{"whole-0", 0, "whole"}, {"whole-1", 1, "whole"}}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc := ffSetup(t, tc.spec, tc.from, tc.file, tc.target, tc.pods, "--sim-faults", tc.fault)
			flStart(t, sc.o)
			if tc.from != "" {
				WaitState(t, sc.c, sc.node, record.StateSuccess, tc.from, 30*time.Second)
			}
			SelectConfig(t, sc.c, sc.node, tc.target)
			WaitState(t, sc.c, sc.node, record.StateSuccess, tc.target, 90*time.Second)
			rec := sc.check(t)
			hist := History(t, GetNode(t, sc.c, sc.node))
			if len(hist) < 2 || hist[1].Config != tc.target || hist[1].Result != record.StateFailed {
				t.Fatalf("history does not show the failed attempt before the success: %+v", hist)
			}
			failed := hist[1]
			op := tc.fault[:strings.Index(tc.fault, ":")]
			nvErr := tc.fault[strings.Index(tc.fault, "=")+1:]
			if want := fmt.Sprintf("GPU %d left partly applied", tc.gpu); !strings.Contains(failed.Reason, want) ||
				!strings.Contains(failed.Reason, nvErr) || !strings.Contains(failed.Reason, op) {
				t.Errorf("failed record's reason %q lacks %q, %s or %s", failed.Reason, want, op, nvErr)
			}
			evicted := append(slices.Clone(failed.EvictedPods), rec.EvictedPods...)
			for _, p := range sc.pods {
				if got := slices.Contains(evicted, sc.ns+"/"+p.name); got != sc.evicted(p) {
					t.Errorf("pod %s in the records' evictedPods: %v, want %v", p.name, got, sc.evicted(p))
				}
			}
		})
	}
}

// ffCrashEnv starts an agent of sc with the crash hook set to n (0: none).
func ffStartCrashing(t *testing.T, sc *ffScene, n int) *Agent {
	t.Helper()
	if n > 0 {
		os.Setenv(reconcile.EnvTestCrashAt, fmt.Sprint(n))
		defer os.Unsetenv(reconcile.EnvTestCrashAt)
	}
	return flStart(t, sc.o)
}

// ffAwait waits until the agent exits (true) or the node shows success on
// the target (false).
func ffAwait(t *testing.T, sc *ffScene, a *Agent, timeout time.Duration) bool {
	t.Helper()
	exited := false
	WaitFor(t, timeout, "the agent to exit or the change to succeed", func() bool {
		if _, done := a.Wait(10 * time.Millisecond); done {
			exited = true
			return true
		}
		rec := LastChange(t, GetNode(t, sc.c, sc.node))
		return rec.Config == sc.target && rec.Result == record.StateSuccess
	})
	return exited
}

// ffKilledAt returns where the crash hook killed the agent ("" if it did not).
func ffKilledAt(a *Agent) string {
	for _, l := range strings.Split(a.Log(), "\n") {
		if strings.Contains(l, "test hook: killing") {
			i := strings.Index(l, "save=")
			return l[i:]
		}
	}
	return ""
}

// TestCrashMatrix SIGKILLs the real daemon right after each journal save
// of a change (the crash hook, internal/crashhook), restarts it, and checks
// that it converges with no pod evicted twice and no second reboot: once
// for a change with evictions, once for a change that needs a reboot (in
// the process before the reboot and in the one after it).
func TestCrashMatrix(t *testing.T) {
	points := 0
	t.Run("evictions", func(t *testing.T) {
		pods := []ffPod{{"doomed-a", 0, "destroy"}, {"doomed-b", 0, "destroy"}, {"kept", 0, "keep"}, {"other", 1, "keep"}}
		for n := 1; n < 100; n++ {
			done := false
			t.Run(fmt.Sprintf("save %d", n), func(t *testing.T) {
				sc := ffSetup(t, "h200x2", "all-1g.18gb", ffTwoGPUs, "gpu0-balanced", pods)
				a := ffStartCrashing(t, sc, n)
				WaitState(t, sc.c, sc.node, record.StateSuccess, "all-1g.18gb", 30*time.Second)
				SelectConfig(t, sc.c, sc.node, sc.target)
				if !ffAwait(t, sc, a, 60*time.Second) {
					done = true // fewer than n saves: the change finished
					sc.check(t)
					return
				}
				where := ffKilledAt(a)
				if where == "" {
					t.Fatalf("the agent exited (%d) but not through the crash hook:\n%s", a.ExitCode(), a.Log())
				}
				t.Logf("killed after %s", where)
				points++
				flStart(t, sc.o)
				WaitState(t, sc.c, sc.node, record.StateSuccess, sc.target, 90*time.Second)
				rec := sc.check(t)
				if want := []string{sc.ns + "/doomed-a", sc.ns + "/doomed-b"}; !sameSet(rec.EvictedPods, want) {
					t.Errorf("record evictedPods %v, want %v", rec.EvictedPods, want)
				}
			})
			if done || t.Failed() {
				break
			}
		}
	})
	t.Run("reboot", func(t *testing.T) {
		pods := []ffPod{{"whole", 0, "whole"}}
		extra := []string{"--reboot-method", "sim", "--sim-no-reset"}
		// finish restarts the agent (the machine coming back) until the
		// change succeeds; it returns how many reboots happened.
		finish := func(t *testing.T, sc *ffScene) {
			for range 4 {
				a := flStart(t, sc.o)
				if !ffAwait(t, sc, a, 60*time.Second) {
					return
				}
				if !strings.Contains(a.Log(), "simulated reboot done") {
					t.Fatalf("the agent exited (%d) without a reboot:\n%s", a.ExitCode(), a.Log())
				}
			}
			t.Fatalf("no success after 4 starts")
		}
		checkReboot := func(t *testing.T, sc *ffScene) {
			rec := sc.check(t)
			if !rec.Reboot {
				t.Errorf("final record: reboot false")
			}
			if boots := flReadSim(t, sc.o.SimState).BootCount; boots != 1 {
				t.Errorf("%d reboots, want exactly 1", boots)
			}
		}
		for _, after := range []bool{false, true} {
			phase := "before the reboot"
			if after {
				phase = "after the reboot"
			}
			for n := 1; n < 100; n++ {
				done := false
				t.Run(fmt.Sprintf("%s save %d", phase, n), func(t *testing.T) {
					sc := ffSetup(t, "a100-40gbx2", "", "", "all-balanced", pods, extra...)
					crashN := n
					if after {
						crashN = 0
					}
					a := ffStartCrashing(t, sc, crashN)
					SelectConfig(t, sc.c, sc.node, sc.target)
					if !ffAwait(t, sc, a, 60*time.Second) {
						t.Fatalf("success without a reboot")
					}
					if after {
						if !strings.Contains(a.Log(), "simulated reboot done") {
							t.Fatalf("no reboot:\n%s", a.Log())
						}
						a = ffStartCrashing(t, sc, n)
						if !ffAwait(t, sc, a, 60*time.Second) {
							done = true
							checkReboot(t, sc)
							return
						}
					} else if ffKilledAt(a) == "" {
						if !strings.Contains(a.Log(), "simulated reboot done") {
							t.Fatalf("the agent exited (%d) without crash or reboot:\n%s", a.ExitCode(), a.Log())
						}
						done = true // rebooted before save n: the saves before the reboot are covered
						finish(t, sc)
						checkReboot(t, sc)
						return
					}
					where := ffKilledAt(a)
					if where == "" {
						t.Fatalf("the agent exited (%d) but not through the crash hook:\n%s", a.ExitCode(), a.Log())
					}
					t.Logf("killed %s after %s", phase, where)
					points++
					finish(t, sc)
					checkReboot(t, sc)
				})
				if done || t.Failed() {
					break
				}
			}
		}
	})
	t.Logf("crash matrix: %d kill points", points)
}

func sameSet(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// TestAPIServerOutage stops the API server for 30 s while a change waits
// for an evicted pod to go; the agent rides it out, finishes the change
// and writes a complete record.
func TestAPIServerOutage(t *testing.T) {
	pods := []ffPod{{"slow", 0, "destroy"}, {"other", 1, "keep"}}
	sc := ffSetup(t, "h200x2", "all-1g.18gb", ffTwoGPUs, "gpu0-balanced", pods, "--drain-timeout", "3m")
	slow, err := sc.c.CoreV1().Pods(sc.ns).Get(context.Background(), "slow", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sc.k.KeepTerminating(slow) // its containers take their time to stop
	a := flStart(t, sc.o)
	WaitState(t, sc.c, sc.node, record.StateSuccess, "all-1g.18gb", 30*time.Second)
	requested := time.Now()
	SelectConfig(t, sc.c, sc.node, sc.target)
	WaitFor(t, 30*time.Second, "the slow pod evicted and terminating", func() bool {
		p, err := sc.c.CoreV1().Pods(sc.ns).Get(context.Background(), "slow", metav1.GetOptions{})
		return err == nil && p.DeletionTimestamp != nil
	})
	if s := GetNode(t, sc.c, sc.node).Labels[record.LabelState]; s != record.StatePending {
		t.Fatalf("state %q before the outage, want pending", s)
	}
	kubetest.RestartAPIServer(t, 30*time.Second)
	// The pod's containers stopped meanwhile: the kubelet finishes it.
	err = sc.c.CoreV1().Pods(sc.ns).Delete(context.Background(), "slow", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	WaitState(t, sc.c, sc.node, record.StateSuccess, sc.target, 3*time.Minute)
	n := GetNode(t, sc.c, sc.node)
	rec := LastChange(t, n)
	if rec.PreviousConfig != "all-1g.18gb" || rec.StartedAt.Before(requested.Add(-time.Second)) || rec.FinishedAt.Before(rec.StartedAt) ||
		!reflect.DeepEqual(rec.GPUsChanged, []int{0}) || !reflect.DeepEqual(rec.GPUsUntouched, []int{1}) ||
		rec.ConfigHash == "" || !strings.Contains(rec.ConfigSource, "@sha256:") || rec.RequestedBy != "e2e-test" || rec.RequestedAt == nil ||
		rec.AgentVersion == "" || rec.DriverVersion == "" || !slices.Equal(rec.EvictedPods, []string{sc.ns + "/slow"}) {
		t.Errorf("incomplete record after the outage: %+v", rec)
	}
	for _, h := range History(t, n) {
		if h.Config == sc.target && h.Result != record.StateSuccess {
			t.Logf("the outage cost a failed attempt: %s", h.Reason)
		}
	}
	after := flReadSim(t, sc.o.SimState)
	if !reflect.DeepEqual(after.GPUs[1], sc.base.GPUs[1]) {
		t.Errorf("untouched GPU 1 changed")
	}
	for _, taint := range n.Spec.Taints {
		if strings.HasPrefix(taint.Key, "migagent.io/") {
			t.Errorf("taint left: %v", taint)
		}
	}
	if _, err := sc.c.CoreV1().Pods(sc.ns).Get(context.Background(), "other", metav1.GetOptions{}); err != nil {
		t.Errorf("pod on the untouched GPU: %v", err)
	}
	t.Logf("drain retries through the outage: %d", strings.Count(a.Log(), "the API server is away during the drain"))
}
