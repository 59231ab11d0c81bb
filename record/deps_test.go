package record

import (
	"os/exec"
	"strings"
	"testing"
)

// The node protocol is a leaf: everything that reads or writes a record
// links it without linking NVML, Prometheus or another room of the agent.
func TestRecordLinksStandardLibraryOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/migagent/mig-agent/record" {
			t.Errorf("record links %s", p)
		}
	}
}
