package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/internal/kclient/restclient"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// plan --node-name lists exactly the pods the daemon's Disruptor would
// evict for the change, the --gpu-client-selector pods included, whether
// the selector comes from the flag or from the settings file.
func TestPlanPreviewEvictsAsTheDaemon(t *testing.T) {
	ctx := context.Background()
	client := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	kubelet := kubetest.StartKubelet(t, client, node)

	dir := t.TempDir()
	cfg := writeConfig(t, dir, twoConfigs)
	sim := []string{"--nvml", "sim:h200x1", "--sim-state", filepath.Join(dir, "s.json"), "--log-level", "error"}
	const selector = "role=gpu-client"

	// The daemon's settings, its GPUs and what the change takes from them.
	s, err := settingsFor(t, append([]string{"--node-name", node, "--gpu-client-selector", selector,
		"--pod-resources-socket", kubelet.Socket()}, sim...)...)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	g, err := openGPUs(s, log)
	if err != nil {
		t.Fatal(err)
	}
	n, err := gpus.Discover(g)
	g.Close()
	if err != nil {
		t.Fatal(err)
	}
	f, err := loadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	plan, _, err := buildPlan(f, "balanced", n)
	if err != nil {
		t.Fatal(err)
	}
	gpuUUIDs, migUUIDs := gpus.Takes(n, plan)
	if len(gpuUUIDs) != 1 {
		t.Fatalf("the change takes GPUs %v, want the one GPU", gpuUUIDs)
	}

	// A pod on the GPU, a GPU client picked by the selector (no GPU
	// resource), and a pod that is neither.
	kubelet.RunPod(t, ns, "on-gpu", map[string]string{"nvidia.com/gpu": "1"},
		map[string][]string{"nvidia.com/gpu": gpuUUIDs}, nil)
	for name, labels := range map[string]map[string]string{"client": {"role": "gpu-client"}, "bystander": {"role": "web"}} {
		kubelet.CreatePod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: kubetest.PodContainer, Image: "registry.k8s.io/pause:3.10"}}},
		})
	}

	kc, err := restclient.New(kubetest.RestConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	daemon, _, err := newDisruptor(kc, log, s, nil).Affected(ctx, gpuUUIDs, migUUIDs)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{ns + "/client", ns + "/on-gpu"}; !slices.Equal(daemon, want) {
		t.Fatalf("the daemon's Disruptor evicts %v, want %v", daemon, want)
	}

	evicts := func(args ...string) []string {
		t.Helper()
		args = append(append([]string{"plan", "-f", cfg, "-c", "balanced", "-o", "json", "--node-name", node,
			"--kubeconfig", kubetest.Kubeconfig()}, args...), sim...)
		code, out := runOut(t, args...)
		var p struct {
			GPUs []struct {
				Evict []string `json:"evict"`
			} `json:"gpus"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &p) != nil || len(p.GPUs) != 1 {
			t.Fatalf("%v: exit %d\n%s", args, code, out)
		}
		return p.GPUs[0].Evict
	}
	socket := []string{"--pod-resources-socket", kubelet.Socket()}
	if got := evicts(append(socket, "--gpu-client-selector", selector)...); !slices.Equal(got, daemon) {
		t.Errorf("plan --gpu-client-selector lists %v, the daemon evicts %v", got, daemon)
	}
	settingsFile := filepath.Join(dir, "settings.yaml")
	if err := os.WriteFile(settingsFile, []byte("gpu-client-selector: "+selector+"\npod-resources-socket: "+kubelet.Socket()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := evicts("--settings", settingsFile); !slices.Equal(got, daemon) {
		t.Errorf("plan with the settings file lists %v, the daemon evicts %v", got, daemon)
	}
	// Without the selector the client is not evicted: it is the selector
	// that puts it in the list.
	if got := evicts(socket...); !slices.Equal(got, []string{ns + "/on-gpu"}) {
		t.Errorf("plan without a selector lists %v, want only %s/on-gpu", got, ns)
	}
	// A selector that does not parse is bad input, as for run.
	if code, out := runOut(t, append([]string{"plan", "-f", cfg, "-c", "balanced", "--node-name", node,
		"--gpu-client-selector", "role in (a"}, sim...)...); code != exitBadInput {
		t.Errorf("bad selector: exit %d, want %d\n%s", code, exitBadInput, out)
	}
}
