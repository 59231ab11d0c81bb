package e2e

// Issue 5, mode changes without reboot loops: a reboot only when a mode
// change stays pending after a reset was tried or is impossible, exactly
// once, resumed from the journal afterwards; none on Hopper; only the
// changing GPU reset on Ampere; logind over a real D-Bus.

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/dbustest"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// rbSim is the raw --sim-state file, edited by tests as JSON (the fields
// they touch are named; the rest passes through).
type rbSim map[string]any

func rbReadSim(t testing.TB, path string) rbSim {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s rbSim
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("sim state %s: %v", path, err)
	}
	return s
}

func (s rbSim) write(t testing.TB, path string) {
	t.Helper()
	raw, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (s rbSim) bootCount() int { n, _ := s["bootCount"].(float64); return int(n) }

func (s rbSim) gpu(i int) map[string]any { return s["gpus"].([]any)[i].(map[string]any) }

// rbMetric returns the value of an unlabelled metric line ("name value").
func rbMetric(text, name string) string {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	return ""
}

// rbResults lists the results of config's records in the history, newest first.
func rbResults(t testing.TB, recs []record.ChangeRecord, config string) (results []string, reboots []bool) {
	for _, r := range recs {
		if r.Config == config {
			results, reboots = append(results, r.Result), append(reboots, r.Reboot)
		}
	}
	return results, reboots
}

// B1: a mode change that only a reboot completes reboots once (the sim
// method exits the process as the machine going down), and the restarted
// agent finishes it: rebooting, then success, both with reboot:true.
func TestRebootOnceThenSuccess(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Sim: "a100-40gbx2", Extra: []string{"--sim-no-reset", "--reboot-method", "sim"}}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.5gb")
	code, exited := a.Wait(30 * time.Second)
	if !exited || code != 0 {
		t.Fatalf("the agent did not exit 0 for the simulated reboot (exited %v, code %d)", exited, code)
	}
	n := GetNode(t, c, node)
	if rec := LastChange(t, n); n.Labels[record.LabelState] != record.StateRebooting || rec.Result != record.StateRebooting || !rec.Reboot {
		t.Fatalf("before the reboot: state %q, record %+v", n.Labels[record.LabelState], rec)
	}
	sim := rbReadSim(t, o.SimState)
	if sim.bootCount() != 1 {
		t.Fatalf("boot count %d after the simulated reboot", sim.bootCount())
	}

	a2 := StartAgent(t, o)
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.5gb", 30*time.Second)
	if !rec.Reboot || !slices.Equal(rec.GPUsChanged, []int{0, 1}) {
		t.Errorf("final record: reboot %v, gpusChanged %v", rec.Reboot, rec.GPUsChanged)
	}
	results, reboots := rbResults(t, History(t, GetNode(t, c, node)), "all-1g.5gb")
	if !slices.Equal(results, []string{record.StateSuccess, record.StateRebooting}) || !slices.Equal(reboots, []bool{true, true}) {
		t.Errorf("history of all-1g.5gb (newest first): %v reboot %v, want success, rebooting, both reboot:true", results, reboots)
	}
	if b := rbReadSim(t, o.SimState).bootCount(); b != 1 {
		t.Errorf("boot count %d, want exactly one reboot", b)
	}
	for _, g := range disProfiles(t, o.Sim, o.SimState) {
		if !g.MigMode.Current || len(g.Instances) != 7 {
			t.Errorf("GPU %d after the reboot: MIG %v, %d instances", g.Index, g.MigMode.Current, len(g.Instances))
		}
	}
	m := a2.Scrape(t)
	if v := rbMetric(m, "migagent_reboots_total"); v != "1" {
		t.Errorf("migagent_reboots_total after the reboot = %q, want 1 (the reboot survives in the journal)", v)
	}
	if v := rbMetric(m, "migagent_reboot_guard_tripped"); v != "0" {
		t.Errorf("migagent_reboot_guard_tripped = %q", v)
	}
	if _, exited := a2.Wait(time.Second); exited {
		t.Error("the agent exited again after the change finished")
	}
}

// B2: a mode change still pending after the reboot made for it fails; the
// agent does not reboot a second time.
func TestRebootStillPendingAfterRebootFails(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Sim: "a100-40gbx2", Extra: []string{"--sim-no-reset", "--reboot-method", "sim"}}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.5gb")
	if code, exited := a.Wait(30 * time.Second); !exited || code != 0 {
		t.Fatalf("no simulated reboot (exited %v, code %d)", exited, code)
	}
	// The machine came back but the GPUs did not take the new mode (a
	// firmware or driver problem): current off, still pending on.
	sim := rbReadSim(t, o.SimState)
	for i := range 2 {
		g := sim.gpu(i)
		if g["migCurrent"] != true {
			t.Fatalf("GPU %d: the reboot did not apply the pending mode: %v", i, g)
		}
		g["migCurrent"], g["migPending"] = false, true
	}
	sim.write(t, o.SimState)

	a2 := StartAgent(t, o)
	rec := WaitState(t, c, node, record.StateFailed, "all-1g.5gb", 30*time.Second)
	if !strings.Contains(rec.Reason, "still pending after the reboot") || !rec.Reboot {
		t.Errorf("record: reason %q, reboot %v", rec.Reason, rec.Reboot)
	}
	if _, exited := a2.Wait(2 * time.Second); exited {
		t.Fatalf("the agent exited: it rebooted a second time (exit %d)", a2.ExitCode())
	}
	if b := rbReadSim(t, o.SimState).bootCount(); b != 1 {
		t.Errorf("boot count %d, want 1", b)
	}
	m := a2.Scrape(t)
	if v := rbMetric(m, "migagent_reboot_guard_tripped"); v != "1" {
		t.Errorf("migagent_reboot_guard_tripped = %q, want 1", v)
	}
	if v := rbMetric(m, "migagent_reboots_total"); v != "1" {
		t.Errorf("migagent_reboots_total = %q, want 1", v)
	}
	results, _ := rbResults(t, History(t, GetNode(t, c, node)), "all-1g.5gb")
	if !slices.Equal(results, []string{record.StateFailed, record.StateRebooting}) {
		t.Errorf("history: %v", results)
	}
	// Not retried by itself: a second reboot would be a loop.
	time.Sleep(6 * time.Second)
	if _, exited := a2.Wait(0); exited || rbReadSim(t, o.SimState).bootCount() != 1 {
		t.Error("the agent retried into a second reboot")
	}
}

// B2: the guard holds through a failure in between: after the reboot the
// first attempt fails (an NVML error, as when the driver is not fully up at
// boot) and is retried; the mode is still pending, and the retry fails
// instead of rebooting a second time.
func TestRebootGuardSurvivesAFailedRetry(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Sim: "a100-40gbx2", Extra: []string{"--sim-no-reset", "--reboot-method", "sim", "--retry-backoff-max", "5s"}}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.5gb")
	if code, exited := a.Wait(30 * time.Second); !exited || code != 0 {
		t.Fatalf("no simulated reboot (exited %v, code %d)", exited, code)
	}
	sim := rbReadSim(t, o.SimState)
	for i := range 2 {
		sim.gpu(i)["migCurrent"], sim.gpu(i)["migPending"] = false, true
	}
	sim.write(t, o.SimState)
	o.Extra = append(o.Extra, "--sim-faults", "SetMigMode:1=ERROR_UNKNOWN")
	a2 := StartAgent(t, o)
	first := WaitState(t, c, node, record.StateFailed, "all-1g.5gb", 30*time.Second)
	if !strings.Contains(first.Reason, "ERROR_UNKNOWN") {
		t.Fatalf("first failure: %q", first.Reason)
	}
	WaitFor(t, 20*time.Second, "the retry to fail on the guard", func() bool {
		rec := LastChange(t, GetNode(t, c, node))
		return strings.Contains(rec.Reason, "still pending after the reboot")
	})
	if _, exited := a2.Wait(time.Second); exited {
		t.Fatalf("the agent exited: a second reboot (exit %d)", a2.ExitCode())
	}
	if b := rbReadSim(t, o.SimState).bootCount(); b != 1 {
		t.Errorf("boot count %d, want 1", b)
	}
	if v := rbMetric(a2.Scrape(t), "migagent_reboot_guard_tripped"); v != "1" {
		t.Errorf("migagent_reboot_guard_tripped = %q", v)
	}
}

// B3: on Hopper a mode change takes effect at once: no reset, no reboot.
func TestRebootNoneNeededOnHopper(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	cfg := disConfig(t, `version: v1
mig-configs:
  gpu2-mig:
    - devices: [0, 1, 3, 4, 5, 6, 7]
      mig-enabled: false
    - devices: [2]
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
`)
	o := (&Opts{Node: node, Sim: "h100-80gbx8", Extra: []string{"-f", cfg, "--reboot-method", "sim"}}).Fill(t)
	out, errOut, code := RunCLI(t, "plan", "-f", cfg, "-c", "gpu2-mig", "-o", "json", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState, "--log-level", "error")
	if code != 0 {
		t.Fatalf("plan: %d %s", code, errOut)
	}
	var plan struct {
		RebootNeeded bool `json:"rebootNeeded"`
		GPUs         []struct {
			Index       int    `json:"index"`
			Action      string `json:"action"`
			ModeChange  string `json:"modeChange"`
			ResetNeeded bool   `json:"resetNeeded"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatal(err)
	}
	if plan.RebootNeeded || len(plan.GPUs) != 8 {
		t.Fatalf("plan: %s", out)
	}
	for _, g := range plan.GPUs {
		if g.ResetNeeded || (g.Index == 2) != (g.ModeChange == "enable" && g.Action == "change") {
			t.Errorf("plan GPU %d: %+v", g.Index, g)
		}
	}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "gpu2-mig")
	rec := WaitState(t, c, node, record.StateSuccess, "gpu2-mig", 30*time.Second)
	if rec.Reboot || !slices.Equal(rec.GPUsChanged, []int{2}) {
		t.Errorf("record: reboot %v, gpusChanged %v", rec.Reboot, rec.GPUsChanged)
	}
	if _, exited := a.Wait(0); exited {
		t.Fatal("the agent exited: it rebooted")
	}
	if strings.Contains(a.Log(), "resetting the GPU") {
		t.Error("a GPU was reset")
	}
	if b := rbReadSim(t, o.SimState).bootCount(); b != 0 {
		t.Errorf("boot count %d", b)
	}
	if v := rbMetric(a.Scrape(t), "migagent_reboots_total"); v != "0" {
		t.Errorf("migagent_reboots_total = %q", v)
	}
}

// B4: on Ampere with reset available, only the GPU whose mode changes is
// reset (a workload on the other GPU, which a reset would refuse, keeps
// running), and nothing reboots.
func TestRebootAmpereResetsOnlyTheChangingGPU(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	cfg := disConfig(t, `version: v1
mig-configs:
  gpu0-only:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
    - devices: [1]
      mig-enabled: false
  both:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
`)
	o := (&Opts{Node: node, Sim: "a100-40gbx2", Extra: []string{"-f", cfg, "--reboot-method", "sim"}}).Fill(t)
	if _, errOut, code := RunCLI(t, "apply", "-f", cfg, "-c", "gpu0-only", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	// A process on GPU 0's first MIG device: resetting GPU 0 would fail.
	sim := rbReadSim(t, o.SimState)
	g0 := sim.gpu(0)
	gi := g0["gpuInstances"].([]any)[0].(map[string]any)
	ci := gi["computeInstances"].([]any)[0].(map[string]any)
	g0["processes"] = []any{map[string]any{"pid": 4242, "giId": gi["id"], "ciId": ci["id"], "name": "inference"}}
	sim.write(t, o.SimState)
	before := disProfiles(t, o.Sim, o.SimState)

	a := StartAgent(t, o)
	SelectConfig(t, c, node, "both")
	rec := WaitState(t, c, node, record.StateSuccess, "both", 30*time.Second)
	if rec.Reboot || !slices.Equal(rec.GPUsChanged, []int{1}) || !slices.Equal(rec.GPUsUntouched, []int{0}) {
		t.Errorf("record: reboot %v, changed %v, untouched %v", rec.Reboot, rec.GPUsChanged, rec.GPUsUntouched)
	}
	log := a.Log()
	if !strings.Contains(log, `gpu=1 step="resetting the GPU"`) || strings.Contains(log, `gpu=0 step="resetting the GPU"`) {
		t.Errorf("resets in the log:\n%s", disGrep(log, "resetting"))
	}
	if _, exited := a.Wait(0); exited {
		t.Fatal("the agent exited: it rebooted")
	}
	after := rbReadSim(t, o.SimState)
	if after.bootCount() != 0 {
		t.Errorf("boot count %d", after.bootCount())
	}
	if procs, _ := after.gpu(0)["processes"].([]any); len(procs) != 1 {
		t.Errorf("GPU 0's process is gone: %v", procs)
	}
	now := disProfiles(t, o.Sim, o.SimState)
	if !slices.Equal(disInstanceKeys(before[0]), disInstanceKeys(now[0])) || len(now[1].Instances) != 7 || !now[1].MigMode.Current {
		t.Errorf("geometry: GPU 0 %v → %v; GPU 1 MIG %v with %d instances",
			disInstanceKeys(before[0]), disInstanceKeys(now[0]), now[1].MigMode.Current, len(now[1].Instances))
	}
}

// disInstanceKeys lists "profile@start=uuid" of a GPU's instances.
func disInstanceKeys(g disGPU) []string {
	var out []string
	for k, v := range disMIGUUIDs(g) {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// B5: through logind on a real D-Bus: one Reboot call, an inhibitor taken
// while NVML changed and released; the machine does not go down, so the
// agent stays rebooting, and a restart in the same boot does not ask again.
// When the machine does reboot, the change finishes.
func TestRebootThroughLogindOnce(t *testing.T) {
	c := kubetest.Client(t)
	bus := dbustest.Start(t)
	login1 := bus.StartLogin1(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Sim: "a100-40gbx2",
		Extra: []string{"--sim-no-reset", "--reboot-method", "logind", "--dbus-address", bus.Address}}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.5gb")
	rec := WaitState(t, c, node, record.StateRebooting, "all-1g.5gb", 30*time.Second)
	if !rec.Reboot {
		t.Errorf("rebooting record without reboot:true: %+v", rec)
	}
	WaitFor(t, 10*time.Second, "one Reboot call", func() bool { return len(login1.RebootCalls()) == 1 })
	if got := login1.RebootCalls(); !slices.Equal(got, []bool{false}) {
		t.Errorf("Reboot calls (interactive) = %v", got)
	}
	inh := login1.Inhibitors()
	if len(inh) == 0 || inh[0].Who != "mig-agent" || inh[0].What != "shutdown" {
		t.Fatalf("inhibitors: %+v", inh)
	}
	WaitFor(t, 5*time.Second, "the inhibitor released", func() bool { return login1.Inhibitors()[0].IsReleased() })
	if v := rbMetric(a.Scrape(t), "migagent_reboots_total"); v != "1" {
		t.Errorf("migagent_reboots_total = %q", v)
	}
	var methods []string
	for _, call := range login1.Calls() {
		methods = append(methods, call.Method)
	}
	t.Logf("logind calls: %v", methods)
	a.Stop()

	// Restart in the same boot: wait for the reboot, do not ask again.
	a2 := StartAgent(t, o)
	WaitFor(t, 20*time.Second, "the restarted agent waiting for the reboot", func() bool {
		return strings.Contains(a2.Log(), "waiting for the reboot requested for this change")
	})
	time.Sleep(time.Second)
	if got := len(login1.RebootCalls()); got != 1 {
		t.Errorf("%d Reboot calls after a restart in the same boot, want 1", got)
	}
	if s := GetNode(t, c, node).Labels[record.LabelState]; s != record.StateRebooting {
		t.Errorf("state %q after the restart, want rebooting", s)
	}
	if v := rbMetric(a2.Scrape(t), "migagent_reboots_total"); v != "1" {
		t.Errorf("migagent_reboots_total after the restart = %q, want 1", v)
	}
	a2.Stop()

	// The machine reboots at last.
	if _, errOut, code := RunCLI(t, "sim", "reboot", "--sim-state", o.SimState); code != 0 {
		t.Fatalf("sim reboot: %d %s", code, errOut)
	}
	StartAgent(t, o)
	rec = WaitState(t, c, node, record.StateSuccess, "all-1g.5gb", 30*time.Second)
	if !rec.Reboot {
		t.Errorf("final record without reboot:true")
	}
	if got := len(login1.RebootCalls()); got != 1 {
		t.Errorf("%d Reboot calls in all, want 1", got)
	}
}
