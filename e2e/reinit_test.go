package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// A MIG mode change on Ampere resets the GPU; NVML then does not open
// again at once (nvmlInit fails: the driver has not brought the GPU back).
// The agent neither judges the reset nor reboots for it: it is not ready,
// opens NVML again with backoff, and once NVML answers converges from what
// the reset left (MIG on), without a reboot.
//
// Calls of nvmlInit in this process: 1 at start, 2 for the first pass (the
// label is on the Node from its creation; no drift ticks), 3 and on after
// the reset. Init 3–7 fail the reset's own five tries, 8–10 the record's
// reads and the daemon's first reopen.
func TestReinitAfterResetRecovers(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{record.LabelConfig: "all-1g.5gb"})
	var faults []string
	for n := 3; n <= 10; n++ {
		faults = append(faults, "Init:"+strconv.Itoa(n)+"=ERROR_UNKNOWN")
	}
	a := StartAgent(t, &Opts{Node: node, Sim: "a100-40gbx1",
		Extra: []string{"--sim-faults", strings.Join(faults, ","), "--drift-interval", "1h"}})

	// /readyz, watched throughout: it must go unready while NVML is not back.
	var ready, unready atomic.Bool
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			resp, err := http.Get(a.Metrics + "/readyz")
			if err != nil {
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				ready.Store(true)
			} else if ready.Load() {
				unready.Store(true)
			}
		}
	}()
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.5gb", 2*changeTimeout)
	close(stop)
	<-done

	if rec.Reboot {
		t.Errorf("the change rebooted: %+v", rec)
	}
	if g := rec.Geometry["0"]; len(g) != 7 {
		t.Errorf("GPU 0 geometry %v, want 7 × 1g.5gb", g)
	}
	var failed *record.ChangeRecord
	for _, h := range History(t, GetNode(t, c, node)) {
		if h.Result == record.StateFailed {
			failed = &h
		}
		if h.Result == record.StateRebooting {
			t.Errorf("a rebooting record: %+v", h)
		}
	}
	if failed == nil || !strings.Contains(failed.Reason, "NVML not back after the GPU reset") {
		t.Errorf("no failed record says NVML was not back after the reset: %+v", failed)
	}
	if !unready.Load() {
		t.Error("/readyz never went unready while NVML was not back")
	}
	log := a.Log()
	for _, want := range []string{"Init:3=ERROR_UNKNOWN", "Init:10=ERROR_UNKNOWN", "NVML is open again"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not show %q", want)
		}
	}
	if text := a.Scrape(t); metricValue(t, text, "migagent_nvml_up", nil) != 1 || metricValue(t, text, "migagent_reboots_total", nil) != 0 {
		t.Errorf("after recovery: nvml_up %v, reboots_total %v",
			metricValue(t, text, "migagent_nvml_up", nil), metricValue(t, text, "migagent_reboots_total", nil))
	}
}
