package e2e

import (
	"slices"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/testkit/kubetest"
)

// `plan --node-name` lists, per GPU, the pods its change would evict —
// found as the daemon finds them — and changes nothing.
func TestPlanListsPodsToEvict(t *testing.T) {
	o, ns, kl := disEightGPUs(t, true)
	base := []string{"plan", "-f", o.Extra[1], "-c", "gpu3-mig", "--nvml", "sim:" + o.Sim, "--sim-state", o.SimState,
		"--node-name", o.Node, "--kubeconfig", o.Kubeconfig, "--pod-resources-socket", kl.Socket(), "--log-level", "error"}
	out, errOut, code := RunCLI(t, append(base, "-o", "json")...)
	if code != 0 {
		t.Fatalf("plan: exit %d: %s", code, errOut)
	}
	for _, gp := range decodePlan(t, out).GPUs {
		var want []string
		if gp.Index == 3 {
			want = []string{ns + "/gpu3-0", ns + "/gpu3-1"}
		}
		if !slices.Equal(gp.Evict, want) {
			t.Errorf("GPU %d would evict %v, want %v", gp.Index, gp.Evict, want)
		}
	}
	text, _, code := RunCLI(t, append(base, "-o", "text")...)
	if code != 0 || !strings.Contains(text, "evict   "+ns+"/gpu3-0") {
		t.Fatalf("text plan lacks the pods:\n%s", text)
	}
	if live := disLivePods(t, kubetest.Client(t), ns); len(live) != 16 {
		t.Fatalf("plan evicted pods: %d left", len(live))
	}
}
