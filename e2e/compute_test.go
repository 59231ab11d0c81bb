package e2e

// Issue 15: compute-instance entries mean what nvidia-mig-parted makes of
// them (shared GPU instances), a change of compute instances inside a GPU
// instance that stays evicts only the pods on the compute instances that go,
// and standalone mode honours mig-parted's hooks file.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// ciDevice is one MIG device (compute instance) as `profiles -o json` lists it.
type ciDevice struct {
	Profile string `json:"profile"`
	Start   int    `json:"start"`
	Compute string `json:"compute"`
	UUID    string `json:"uuid"`
}

func ciDevices(t testing.TB, spec, state string, gpu int) []ciDevice {
	t.Helper()
	out, errOut, code := RunCLI(t, "profiles", "-o", "json", "--nvml", "sim:"+spec, "--sim-state", state, "--log-level", "error")
	if code != 0 {
		t.Fatalf("profiles: exit %d: %s", code, errOut)
	}
	var doc struct {
		GPUs []struct {
			Index     int        `json:"index"`
			Instances []ciDevice `json:"instances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	for _, g := range doc.GPUs {
		if g.Index == gpu {
			return g.Instances
		}
	}
	t.Fatalf("no GPU %d", gpu)
	return nil
}

// A compute instance added inside a kept GPU instance evicts nothing; taking
// it away again evicts only the pod on it. Each compute instance is its own
// MIG device with its own UUID, as NVIDIA's device plugin hands them out
// (one per GPU instance and compute instance pair).
func TestComputeInstanceChangeEvictsOnlyItsPods(t *testing.T) {
	c := kubetest.Client(t)
	node, kl, ns := kubeletNode(t)
	cfg := disConfig(t, `version: v1
mig-configs:
  two:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.71gb": 2, "3g.71gb": 1}
  three:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.71gb": 3, "3g.71gb": 1}
`)
	o := &Opts{Node: node, Sim: "h200x1", Extra: []string{"-f", cfg, "--pod-resources-socket", kl.Socket()}}
	StartAgent(t, o)
	SelectConfig(t, c, node, "two")
	WaitState(t, c, node, record.StateSuccess, "two", 30*time.Second)
	devs := ciDevices(t, o.Sim, o.SimState, 0)
	if len(devs) != 3 {
		t.Fatalf("config two gave %+v, want one 3g.71gb holding two 1c and one 3g.71gb", devs)
	}
	pod := func(d ciDevice, name string) {
		res := "nvidia.com/mig-" + d.Profile
		if d.Compute != "" {
			res = "nvidia.com/mig-" + d.Compute
		}
		kl.RunPod(t, ns, name, map[string]string{res: "1"}, map[string][]string{res: {d.UUID}}, disOwner("infer"))
	}
	for i, d := range devs {
		pod(d, fmt.Sprintf("p%d", i))
	}

	SelectConfig(t, c, node, "three")
	rec := WaitState(t, c, node, record.StateSuccess, "three", 30*time.Second)
	if len(rec.EvictedPods) != 0 {
		t.Fatalf("adding a compute instance evicted %v", rec.EvictedPods)
	}
	after := ciDevices(t, o.Sim, o.SimState, 0)
	var added []ciDevice
	for _, d := range after {
		if !slices.ContainsFunc(devs, func(x ciDevice) bool { return x.UUID == d.UUID }) {
			added = append(added, d)
		}
	}
	if len(after) != 4 || len(added) != 1 || added[0].Compute != "1c.3g.71gb" || added[0].Start != devs[0].Start && added[0].Start != devs[1].Start {
		t.Fatalf("after three: %+v (added %+v); the old MIG devices must stay", after, added)
	}
	pod(added[0], "p-added")

	SelectConfig(t, c, node, "two")
	rec = WaitState(t, c, node, record.StateSuccess, "two", 60*time.Second)
	if want := []string{ns + "/p-added"}; !slices.Equal(rec.EvictedPods, want) {
		t.Errorf("evictedPods = %v, want %v", rec.EvictedPods, want)
	}
	if live := disLivePods(t, c, ns); !slices.Equal(live, []string{"p0", "p1", "p2"}) {
		t.Errorf("running pods %v", live)
	}
	t.Logf("SCENARIO a compute instance added to and removed from a kept 3g.71gb: 0 then %d pods evicted of %d", len(rec.EvictedPods), len(after))
}

// run --standalone -k runs the hooks around the change in mig-parted's
// order with mig-parted's variables; a failing hook fails the change, its
// output in the log and the change record.
func TestStandaloneHooks(t *testing.T) {
	dir := t.TempDir()
	state, stateDir := filepath.Join(dir, "sim.json"), filepath.Join(dir, "state")
	cfg := disConfig(t, `version: v1
mig-configs:
  inference:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.7g.141gb": 7}
`)
	log := filepath.Join(dir, "hooks.log")
	hooks := func(fail string) string {
		var b strings.Builder
		b.WriteString("version: v1\nhooks:\n")
		for _, h := range []string{"apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"} {
			script := `printf '%s %s %s %s %s %s\n' "$1" "$MIG_PARTED_CONFIG_FILE" "$MIG_PARTED_SELECTED_CONFIG" "$MIG_PARTED_HOOKS_FILE" "$MIG_PARTED_SKIP_RESET" "$MIG_PARTED_MODE_CHANGE_ONLY" >> "$LOG"`
			if h == fail {
				script += "; echo hook-said-no; exit 1"
			}
			js, _ := json.Marshal(script)
			fmt.Fprintf(&b, "  %s:\n    - command: /bin/sh\n      args: [\"-c\", %s, \"sh\", %q]\n      envs: {LOG: %q}\n", h, js, h, log)
		}
		p := filepath.Join(dir, "hooks-"+fail+".yaml")
		if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ok := hooks("none")
	args := []string{"run", "--standalone", "-f", cfg, "-c", "inference", "-k", ok, "--nvml", "sim:h200x1",
		"--sim-state", state, "--state-dir", stateDir, "--reboot-method", "none", "--drift-interval", "0"}
	notify := saListenNotify(t)
	a := saStart(t, args, notify)
	WaitFor(t, 20*time.Second, "READY=1", func() bool { return notify.index("READY=1") >= 0 })
	a.Stop()
	data, _ := os.ReadFile(log)
	var want []string
	for _, h := range []string{"apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"} {
		want = append(want, fmt.Sprintf("%s %s inference %s false false", h, cfg, ok))
	}
	if got := strings.Split(strings.TrimSpace(string(data)), "\n"); !slices.Equal(got, want) {
		t.Fatalf("hooks ran\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A failing pre-apply-config hook fails the change (after a reboot the
	// geometry must be made again), with the hook's output.
	if _, errOut, code := RunCLI(t, "sim", "reboot", "--sim-state", state); code != 0 {
		t.Fatalf("sim reboot: %s", errOut)
	}
	os.Remove(log)
	args[7] = hooks("pre-apply-config")
	a = saStart(t, args, notify)
	WaitFor(t, 20*time.Second, "the failed change", func() bool {
		return strings.Contains(a.Log(), "hook-said-no") && strings.Contains(a.Log(), "pre-apply-config hook")
	})
	if m := a.Scrape(t); !strings.Contains(m, `migagent_reconfigurations_total{result="failed"}`) {
		t.Errorf("no failed reconfiguration in the metrics")
	}
	a.Stop()
	data, _ = os.ReadFile(log)
	if !strings.HasPrefix(string(data), "apply-start ") || !strings.Contains(string(data), "\napply-exit ") {
		t.Errorf("hooks ran:\n%s", data)
	}
}
