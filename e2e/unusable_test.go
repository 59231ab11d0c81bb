package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// unusableGPUs is what the test reads of a simulator state file: per GPU,
// its MIG mode and how many GPU instances it holds.
func unusableGPUs(t testing.TB, path string) (mig []bool, instances []int) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		GPUs []struct {
			MigCurrent bool              `json:"migCurrent"`
			Instances  []json.RawMessage `json:"gpuInstances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	for _, g := range st.GPUs {
		mig = append(mig, g.MigCurrent)
		instances = append(instances, len(g.Instances))
	}
	return mig, instances
}

// A GPU whose handle answers NO_PERMISSION (nvmlDeviceGetCount counts it,
// nvmlDeviceGetHandleByIndex refuses it) is reported and left alone: a
// config for every GPU converges the others and fails naming that GPU and
// NVML's answer; a config for the others only succeeds. The metric, the
// record and a Warning Event say which GPU and why.
func TestUnopenableGPULeavesOthersConverging(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	state := filepath.Join(t.TempDir(), "sim.json")
	sim, err := nvmlx.NewSim("h200x3", nvmlsim.Options{StatePath: state})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.SetHandleError(1, "ERROR_NO_PERMISSION"); err != nil {
		t.Fatal(err)
	}
	_ = sim.Close()
	file := writeFile(t, "config.yaml", `version: v1
mig-configs:
  others-7g:
    - devices: [0, 2]
      mig-enabled: true
      mig-devices: {"7g.141gb": 1}
`)
	a := StartAgent(t, &Opts{Node: node, Sim: "h200x3", SimState: state, Extra: []string{"-f", file}})

	// devices: all names GPU 1 too.
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateFailed, "all-1g.18gb", changeTimeout)
	if !strings.Contains(rec.Reason, "GPU 1") || !strings.Contains(rec.Reason, "ERROR_NO_PERMISSION") {
		t.Errorf("reason %q does not name GPU 1 and NVML's answer", rec.Reason)
	}
	if !slices.Equal(rec.GPUsChanged, []int{0, 2}) {
		t.Errorf("gpusChanged %v, want [0 2]", rec.GPUsChanged)
	}
	if len(rec.GPUsUnusable) != 1 || rec.GPUsUnusable[0].Index != 1 || rec.GPUsUnusable[0].Return != "ERROR_NO_PERMISSION" {
		t.Errorf("gpusUnusable %+v, want GPU 1 with ERROR_NO_PERMISSION", rec.GPUsUnusable)
	}
	if g := rec.Geometry["1"]; len(g) != 1 || g[0] != "unusable:ERROR_NO_PERMISSION" {
		t.Errorf("geometry of GPU 1 %v", g)
	}
	mig, insts := unusableGPUs(t, state)
	if !mig[0] || !mig[2] || insts[0] != 7 || insts[2] != 7 {
		t.Errorf("GPUs 0 and 2: MIG %v, instances %v; want 7 × 1g each", mig, insts)
	}
	if mig[1] || insts[1] != 0 {
		t.Errorf("GPU 1 was touched: MIG %v, %d instances", mig[1], insts[1])
	}
	text := a.Scrape(t)
	if v := metricValue(t, text, "migagent_gpu_unusable", map[string]string{"gpu": "1", "error": "ERROR_NO_PERMISSION"}); v != 1 {
		t.Errorf("migagent_gpu_unusable{gpu=1} = %v, want 1", v)
	}
	if v := metricValue(t, text, "migagent_gpu_info", map[string]string{"gpu": "1"}); v != -1 {
		t.Errorf("migagent_gpu_info has GPU 1, which NVML cannot open")
	}
	if evs := nodeEvents(t, c, node, record.ReasonGPUUnusable); len(evs) == 0 {
		t.Error("no Warning Event names the GPU NVML cannot open")
	}

	// A config that leaves GPU 1 out succeeds; GPU 1 still untouched.
	SelectConfig(t, c, node, "others-7g")
	rec = WaitState(t, c, node, record.StateSuccess, "others-7g", changeTimeout)
	if !slices.Equal(rec.GPUsChanged, []int{0, 2}) {
		t.Errorf("gpusChanged %v, want [0 2]", rec.GPUsChanged)
	}
	mig, insts = unusableGPUs(t, state)
	if mig[1] || insts[1] != 0 || insts[0] != 1 || insts[2] != 1 {
		t.Errorf("after others-7g: MIG %v, instances %v", mig, insts)
	}
}
