package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// After a change, success needs the device plugin that started after it:
// the figures of the plugin that read the old geometry may already match
// the new one. The scenarios run on the real node (realnode_test.go:
// TestRealNodeSwapWaitsForTheNewPlugin, TestRealNodeTimeSlicingWaitsForTheNewPlugin,
// TestRealNodePluginNeverBackFailsThenRetries), where the real kubelet
// writes the Node's status and NVIDIA's plugin's start is held; this file
// keeps what they share.

// fpConfigs writes a config file with the named configs (YAML bodies).
func fpConfigs(t testing.TB, configs string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "configs.yaml")
	if err := os.WriteFile(file, []byte("version: v1\nmig-configs:\n"+configs), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// fpNeverSuccess fails the test when the node's state becomes success
// within d.
func fpNeverSuccess(t testing.TB, node string, d time.Duration, why string) {
	t.Helper()
	c := kubetest.Client(t)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if GetNode(t, c, node).Labels[record.LabelState] == record.StateSuccess {
			t.Fatalf("state success %s", why)
		}
	}
}

// fpSwap are two configs in which two H200s swap roles, the Node's
// figures the same before and after: nvidia.com/gpu 1, mig-1g.18gb 7.
const fpSwap = `  before:
  - devices: [0]
    mig-enabled: false
  - devices: [1]
    mig-enabled: true
    mig-devices: {"1g.18gb": 7}
  after:
  - devices: [0]
    mig-enabled: true
    mig-devices: {"1g.18gb": 7}
  - devices: [1]
    mig-enabled: false
`
