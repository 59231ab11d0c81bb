package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/testkit/simlibtest"
)

// nvidiaBin is one of NVIDIA's binaries that hack/nvidia-device-plugin.sh
// builds from NVIDIA's Go module and caches (make test builds them first).
func nvidiaBin(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("bash", "../hack/nvidia-device-plugin.sh", "build").Output()
	if err != nil {
		t.Fatalf("hack/nvidia-device-plugin.sh build: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), name)
}

// TestGFDLabelsFollowTheAgentsGeometry: NVIDIA's GPU Feature Discovery,
// unmodified, over the simulator built as libnvidia-ml.so.1 in sim-node,
// labels what the agent made: the product, the MIG strategy and each
// profile's count, before and after a change the agent applies on its
// production NVML path.
func TestGFDLabelsFollowTheAgentsGeometry(t *testing.T) {
	gfd := nvidiaBin(t, "gpu-feature-discovery")
	lib, simNode := simlibtest.Library(t), simlibtest.SimNode(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "sim.json")
	env := append(os.Environ(), "MIG_AGENT_SIM=h200x2", "MIG_AGENT_SIM_STATE="+state, "MIG_AGENT_SIM_QUIET=1")
	apply := func(config string) {
		t.Helper()
		cmd := exec.Command(binary(), "apply", "--nvml", "real", "--nvml-library", lib, "-c", config,
			"-f", filepath.Join("..", "geometry", "testdata", "config-default.yaml"), "--log-level", "error")
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("apply %s: %v\n%s", config, err, out)
		}
	}
	labels := func() map[string]string {
		t.Helper()
		out := filepath.Join(dir, "labels")
		cmd := exec.Command(simNode, "--", gfd, "--oneshot", "--output-file="+out, "--no-timestamp",
			"--use-node-feature-api=false", "--mig-strategy=mixed")
		cmd.Env = env
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gpu-feature-discovery: %v\n%s", err, b)
		}
		raw, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			k, v, _ := strings.Cut(l, "=")
			m[k] = v
		}
		return m
	}
	check := func(got map[string]string, want map[string]string) {
		t.Helper()
		for k, v := range want {
			if got[k] != v {
				t.Errorf("label %s=%q, want %q", k, got[k], v)
			}
		}
	}
	apply("all-balanced")
	check(labels(), map[string]string{"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "2",
		"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.capable": "true",
		"nvidia.com/mig-1g.18gb.count": "4", "nvidia.com/mig-2g.35gb.count": "2", "nvidia.com/mig-3g.71gb.count": "2",
		"nvidia.com/mig-3g.71gb.product": "NVIDIA-H200-MIG-3g.71gb", "nvidia.com/vgpu.present": "false"})
	apply("all-1g.18gb")
	got := labels()
	check(got, map[string]string{"nvidia.com/mig-1g.18gb.count": "14"})
	if _, ok := got["nvidia.com/mig-3g.71gb.count"]; ok {
		t.Errorf("a 3g.71gb label stayed after all-1g.18gb: %v", got["nvidia.com/mig-3g.71gb.count"])
	}
}
