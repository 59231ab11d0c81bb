package reconcile

import (
	"os/exec"
	"strings"
	"testing"
)

// The core speaks its own types: it links nothing of Kubernetes but the
// clock, and nothing of Prometheus (package doc). A client-go or
// Prometheus import creeping in fails here.
func TestCoreLinksNoKubernetes(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "k8s.io/") && p != "k8s.io/utils/clock" && !strings.HasPrefix(p, "k8s.io/utils/clock/") {
			t.Errorf("the reconcile core links %s", p)
		}
		if strings.Contains(p, "prometheus") {
			t.Errorf("the reconcile core links %s", p)
		}
	}
}
