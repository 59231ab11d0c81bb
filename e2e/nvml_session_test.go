package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// nsState is the NVML session counts (kept beside a simulator state file)
// and the driver flag (in it).
type nsState struct {
	Inits     int  `json:"nvmlInits"`
	Shutdowns int  `json:"nvmlShutdowns"`
	Unloaded  bool `json:"driverUnloaded"`
}

func nsRead(t testing.TB, path string) nsState {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s nsState
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	if raw, err := os.ReadFile(nvmlsim.SessionsPath(path)); err == nil {
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// nsSetUnloaded flips the simulated driver's module state in the file,
// under the lock the simulators take (flock on the state's directory).
func nsSetUnloaded(t testing.TB, path string, unloaded bool) {
	t.Helper()
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if err := syscall.Flock(int(dir.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["driverUnloaded"] = unloaded
	raw, _ = json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestIdleAgentHoldsNoNVMLSession: between passes the agent holds no NVML
// session (every nvmlInit has its nvmlShutdown), so a driver upgrade can
// unload the module; while NVML cannot be opened (the module unloaded)
// the agent is not ready and reports migagent_nvml_up 0, keeps retrying,
// and converges once the driver is back.
func TestIdleAgentHoldsNoNVMLSession(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	o := &Opts{Node: node, Sim: "h200x2"}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", changeTimeout)
	// The drift check opens a session every second; between them none is open.
	WaitFor(t, 10*time.Second, "an idle moment with every NVML session closed", func() bool {
		s := nsRead(t, o.SimState)
		return s.Inits >= 3 && s.Inits == s.Shutdowns
	})

	// The driver goes away (an upgrade unloads the module): not ready, NVML down.
	nsSetUnloaded(t, o.SimState, true)
	WaitFor(t, 15*time.Second, "the agent to report NVML down and not ready", func() bool {
		return !ccReady(a) && rbMetric(a.Scrape(t), "migagent_nvml_up") == "0"
	})
	if s := nsRead(t, o.SimState); s.Inits != s.Shutdowns {
		t.Fatalf("an NVML session stayed open while the driver was away: %+v", s)
	}
	// The driver is back: the agent opens NVML again by itself and acts.
	nsSetUnloaded(t, o.SimState, false)
	WaitFor(t, 30*time.Second, "the agent to be ready with NVML up again", func() bool {
		return ccReady(a) && rbMetric(a.Scrape(t), "migagent_nvml_up") == "1"
	})
	SelectConfig(t, c, node, "all-balanced")
	WaitState(t, c, node, record.StateSuccess, "all-balanced", changeTimeout)
	a.Stop()
	if s := nsRead(t, o.SimState); s.Inits != s.Shutdowns {
		t.Errorf("after the agent stopped: %d inits, %d shutdowns", s.Inits, s.Shutdowns)
	}
}
